"""The placement benchmarks' workload: the nodes and their GPUs, the placement maps, the pods of
each contender and the Bindings gpuplace's binder POSTs for them (`bench.placement`, `bench.dra`,
`bench.drains`, `bench.scale`, `bench.gitops`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench._kube import Obj
from gpuplace_dev.localcluster import GPU_RESOURCE
from kubeio import bodies
from placement.annotations import INDEX_LABEL, MAP_LABEL, BindingDecision, signed_binding
from placement.inventory import GpuDevice, NodeInventory
from placement.keyring import RingKey
from placement.types import EnvMode, GpuUuid, MapKey, NodeName
from webhook.pods import wired_env

NAMESPACE = "bench"
SCHEDULER_NAME = "gpuplace"
PROBE = "bench-probe"
PRODUCT = "NVIDIA H100 80GB HBM3"
#: Threads that create (and delete) a run's pods.
CREATE_THREADS = 16
#: Threads that set the cluster up (inventories, maps, slices).
SETUP_THREADS = 16
#: How long one run may take before it counts as failed (5,000 pods on two busy cores take ~30 s).
RUN_TIMEOUT = 600.0
#: Steady create rates for the webhook's latency as the apiserver sees it, and how long each runs.
STEADY_RATES = (25, 50, 100)
STEADY_SECONDS = 20.0
#: The steady create rate at which the webhook's p99 is held to its target.
TARGET_STEADY_RATE = 50
#: How many server processes the webhook runs (`gpuplace webhook --processes`).
PROCESSES_ENV = "GPUPLACE_WEBHOOK_PROCESSES"


@dataclass(frozen=True)
class Scale:
    nodes: int = 1000
    pods: int = 5000
    gpus: int = 8
    slots_per_map: int = 100

    def __post_init__(self) -> None:
        if self.pods > self.nodes * self.gpus:
            raise ValueError(f"{self.pods} pods need more than {self.nodes} x {self.gpus} GPUs")
        if self.pods % self.slots_per_map:
            raise ValueError(f"pods ({self.pods}) must be a multiple of {self.slots_per_map}")

    @property
    def maps(self) -> int:
        return self.pods // self.slots_per_map

    @property
    def label(self) -> str:
        return f"{self.nodes:,} nodes x {self.gpus}, {self.pods:,} pods"

    def node(self, pod: int) -> str:
        """Pods fill GPU 0 of every node, then GPU 1, ...: each map spreads over many nodes."""
        return node_name(pod % self.nodes)

    def device(self, pod: int) -> int:
        return pod // self.nodes

    def map_index(self, pod: int) -> tuple[str, int]:
        return map_name(pod // self.slots_per_map), pod % self.slots_per_map

    def creation_order(self) -> list[int]:
        """Index 0 of every map, then index 1, ...: a burst touches every map, as many
        controllers scaling up at once would."""
        return sorted(range(self.pods), key=lambda p: (p % self.slots_per_map, p))


def webhook_processes() -> int:
    """The server processes the bench's webhook runs (it inherits this environment)."""
    return int(os.environ.get(PROCESSES_ENV) or 1)


def node_name(n: int) -> str:
    return f"bench-node-{n:04d}"


def map_name(m: int) -> str:
    return f"bench-{m:03d}"


def pod_name(scale: Scale, pod: int, run: int) -> str:
    """Names differ between runs: kwok deletes pods by name and, when it lags, would otherwise
    delete the next run's pod of the same name."""
    name, index = scale.map_index(pod)
    return f"r{run}-{name}-{index}"


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{index:012x}"


def inventory(n: int, gpus: int) -> NodeInventory:
    return NodeInventory(
        NodeName(node_name(n)),
        tuple(
            GpuDevice(
                i,
                GpuUuid(gpu_uuid(n, i)),
                PRODUCT,
                81_559,
                f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )


def map_yaml(scale: Scale, m: int) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        "metadata:",
        f"  name: {map_name(m)}",
        f"  namespace: {NAMESPACE}",
        "spec:",
        "  placements:",
    ]
    for pod in range(m * scale.slots_per_map, (m + 1) * scale.slots_per_map):
        _, index = scale.map_index(pod)
        lines += [
            f"    - index: {index}",
            f"      node: {scale.node(pod)}",
            f"      devices: [{scale.device(pod)}]",
        ]
    return "\n".join(lines) + "\n"


def bench_pod(name: str, labels: dict[str, str], spec: Obj, resources: Obj | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench", **labels}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": resources or {},
                }
            ],
            **spec,
        },
    }


def gpuplace_pod(scale: Scale, pod: int, run: int) -> Obj:
    """A pod of a placement map. No nvidia.com/gpu request: gpuplace places GPUs itself and
    its pods must not take the device plugin's (see README, Honest limits)."""
    name, index = scale.map_index(pod)
    return bench_pod(
        pod_name(scale, pod, run),
        {MAP_LABEL: name, INDEX_LABEL: str(index)},
        {"schedulerName": SCHEDULER_NAME},
    )


def admitted_gpuplace_pod(scale: Scale, pod: int, run: int) -> Obj:
    """`gpuplace_pod` as the webhook leaves it, for pods created while it is unregistered: the
    binder places a map's pod only with its wiring (placement/admitted.py)."""
    body = gpuplace_pod(scale, pod, run)
    body["spec"]["containers"][0]["env"] = [dict(e) for e in wired_env(EnvMode.INDEX)]
    return body


def pinned_pod(scale: Scale, pod: int, run: int) -> Obj:
    """The same pod for kube-scheduler: pinned to its slot's node by required node affinity,
    and asking for its GPU the way pods placed by kube-scheduler do (nvidia.com/gpu: 1)."""
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [scale.node(pod)]}
        ]
    }
    required = {"nodeSelectorTerms": [term]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    gpu = {"limits": {GPU_RESOURCE: "1"}}
    return bench_pod(pod_name(scale, pod, run), {}, {"affinity": affinity}, gpu)


#: The key the reference clients (the ceiling, the DRA minimal client) sign their Bindings with:
#: annotations of the size and shape of gpuplace's, which no controller verifies.
REFERENCE_KEY = RingKey(b"bench-reference-binding-key-0000", "2026-01-01T00:00:00Z")


def binding(
    scale: Scale,
    pod: int,
    run: int,
    uid: str = "",
    cuda: str | None = None,
    key: RingKey = REFERENCE_KEY,
) -> Obj:
    """What gpuplace's binder POSTs for this pod: the target node and its annotations, the
    signature included (`cuda`: CUDA_VISIBLE_DEVICES when not the host index, as in dra; `key`:
    the key that signs, a controller's own when it is to hold the pod)."""
    map_name, index = scale.map_index(pod)
    node = scale.node(pod)
    uuid = gpu_uuid(pod % scale.nodes, scale.device(pod))
    decision = BindingDecision(
        MapKey(NAMESPACE, map_name),
        index,
        NodeName(node),
        (GpuUuid(uuid),),
        str(scale.device(pod)) if cuda is None else cuda,
        1,
    )
    annotations = signed_binding(key.secret, key.id, uid, NAMESPACE, decision)
    return bodies.binding(pod_name(scale, pod, run), NAMESPACE, uid, node, annotations)
