"""What the kubelet says each pod holds (its PodResources API, read by the agent from the
kubelet's pod-resources socket and published beside the node's inventory), and what that comes
to in GPUs.

Device-plugin devices are named by the plugin's device IDs: the NVIDIA device plugin names a GPU
by its UUID (`GPU-...`), a time-sliced replica as `<uuid>::<n>`, a MIG device by its MIG UUID. DRA
devices are named by (driver, pool, device) and resolved to UUIDs through the driver's
ResourceSlices (placement/dra.py). A kubelet whose version (or feature gates) does not list DRA
devices leaves a pod's claims out; the caller then reads the claims' allocations from the
apiserver instead, and says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from placement.types import NodeName

#: The key of the node's inventory ConfigMap (gpuplace-inventory/<node>) the agent writes it to.
POD_RESOURCES_KEY = "podresources.json"
#: The extended resource the NVIDIA device plugin serves.
NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
#: Where the kubelet serves its PodResources API.
KUBELET_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One DRA device a pod's claim gives it, as the kubelet names it."""

    claim_namespace: str
    claim: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class PodDevices:
    """What one pod holds on the node, by the kubelet's account."""

    namespace: str
    name: str
    #: (resource name, device ID) of every device-plugin device of its containers.
    plugin: tuple[tuple[str, str], ...] = ()
    claims: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    node: NodeName
    pods: tuple[PodDevices, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "pods": [
                    {
                        "namespace": p.namespace,
                        "name": p.name,
                        "devices": [{"resource": r, "id": i} for r, i in p.plugin],
                        "claims": [
                            {
                                "namespace": c.claim_namespace,
                                "name": c.claim,
                                "driver": c.driver,
                                "pool": c.pool,
                                "device": c.device,
                            }
                            for c in p.claims
                        ],
                    }
                    for p in sorted(self.pods, key=lambda p: (p.namespace, p.name))
                ],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> PodResources:
        """Parses what an agent wrote; ValueError with a reason on malformed data."""
        try:
            data: Any = json.loads(text)
            return cls(
                NodeName(str(data["node"])),
                tuple(
                    PodDevices(
                        str(p["namespace"]),
                        str(p["name"]),
                        tuple((str(d["resource"]), str(d["id"])) for d in p.get("devices", [])),
                        tuple(
                            ClaimDevice(
                                str(c["namespace"]),
                                str(c["name"]),
                                str(c["driver"]),
                                str(c["pool"]),
                                str(c["device"]),
                            )
                            for c in p.get("claims", [])
                        ),
                    )
                    for p in data.get("pods", [])
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed pod resources: {exc}") from exc

    def pod(self, namespace: str, name: str) -> PodDevices | None:
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)


def from_list_response(node: NodeName, response: Mapping[str, Any]) -> PodResources:
    """The kubelet's ListPodResourcesResponse (as a dict, protobuf field names) as a record of
    the pods that hold devices."""
    pods: list[PodDevices] = []
    for entry in response.get("pod_resources") or ():
        plugin: list[tuple[str, str]] = []
        claims: list[ClaimDevice] = []
        for container in entry.get("containers") or ():
            for devices in container.get("devices") or ():
                resource = str(devices.get("resource_name", ""))
                plugin += [(resource, str(i)) for i in devices.get("device_ids") or ()]
            for dynamic in container.get("dynamic_resources") or ():
                for result in dynamic.get("claim_resources") or ():
                    claims.append(
                        ClaimDevice(
                            str(dynamic.get("claim_namespace", "")),
                            str(dynamic.get("claim_name", "")),
                            str(result.get("driver_name", "")),
                            str(result.get("pool_name", "")),
                            str(result.get("device_name", "")),
                        )
                    )
        if plugin or claims:
            pods.append(
                PodDevices(
                    str(entry.get("namespace", "")),
                    str(entry.get("name", "")),
                    tuple(dict.fromkeys(plugin)),
                    tuple(dict.fromkeys(claims)),
                )
            )
    return PodResources(node, tuple(sorted(pods, key=lambda p: (p.namespace, p.name))))


def plugin_gpus(
    devices: Iterable[tuple[str, str]], resources: Iterable[str] = (NVIDIA_GPU_RESOURCE,)
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The GPU UUIDs that device-plugin devices of `resources` name (a time-sliced replica as
    its GPU), and the IDs that name no whole GPU (MIG devices, IDs that are no UUID)."""
    wanted = set(resources)
    gpus: list[str] = []
    other: list[str] = []
    for resource, device_id in devices:
        if resource not in wanted:
            continue
        uuid = device_id.split("::", 1)[0]
        if uuid.startswith("GPU-"):
            gpus.append(uuid)
        else:
            other.append(device_id)
    return tuple(dict.fromkeys(gpus)), tuple(other)
