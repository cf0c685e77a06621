"""Node inventories as agents publish them (`inventory.json`) and the per-node check results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from placement.maps import Requirement
from placement.reasons import Reason
from placement.types import DeviceRef, GpuUuid, NodeName

INVENTORY_KEY = "inventory.json"
CHECKS_KEY = "checks.json"
INVENTORY_NAMESPACE = "gpuplace-inventory"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: GpuUuid
    name: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    healthy: bool = True
    health_reason: str = ""
    numa_node: int | None = None

    def satisfies(self, requirement: Requirement | None) -> bool:
        if requirement is None:
            return True
        if requirement.product and requirement.product != self.name:
            return False
        return not (requirement.min_memory_mib and self.memory_mib < requirement.min_memory_mib)


def device_problems(
    device: GpuDevice, require: Requirement | None, shown: str
) -> list[tuple[Reason, str]]:
    """What keeps a present device from serving a slot, in order: it is unhealthy, it is not what
    the slot requires. The one device check of compile, the binder and the agents; `shown` is how
    the caller names the device (as the map wrote it, or its index and UUID)."""
    problems: list[tuple[Reason, str]] = []
    if not device.healthy:
        why = device.health_reason or "unknown"
        problems.append((Reason.DEVICE_UNHEALTHY, f"device {shown} is unhealthy: {why}"))
    if require is not None and not device.satisfies(require):
        problems.append(
            (
                Reason.REQUIREMENT_MISMATCH,
                f"device {shown} ({device.name}, {device.memory_mib} MiB) does not match "
                f"{require.describe()}",
            )
        )
    return problems


@dataclass(frozen=True, slots=True)
class NodeInventory:
    node: NodeName
    devices: tuple[GpuDevice, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""
    by_index: Mapping[int, GpuDevice] = field(init=False, compare=False, repr=False)
    by_uuid: Mapping[GpuUuid, GpuDevice] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_index", MappingProxyType({d.index: d for d in self.devices}))
        object.__setattr__(self, "by_uuid", MappingProxyType({d.uuid: d for d in self.devices}))

    def find(self, ref: DeviceRef) -> GpuDevice | None:
        if isinstance(ref, int):
            return self.by_index.get(ref)
        return self.by_uuid.get(ref)

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "driverVersion": self.driver_version,
                "cudaDriverVersion": self.cuda_driver_version,
                "devices": [
                    {
                        "index": d.index,
                        "uuid": d.uuid,
                        "name": d.name,
                        "memoryMiB": d.memory_mib,
                        "pciBusId": d.pci_bus_id,
                        "healthy": d.healthy,
                        "healthReason": d.health_reason,
                        "numaNode": d.numa_node,
                    }
                    for d in sorted(self.devices, key=lambda d: d.index)
                ],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> NodeInventory:
        """Parses what an agent wrote; raises ValueError with a reason on malformed data."""
        try:
            data: Any = json.loads(text)
            devices = tuple(
                GpuDevice(
                    index=int(d["index"]),
                    uuid=GpuUuid(str(d["uuid"])),
                    name=str(d.get("name", "")),
                    memory_mib=int(d.get("memoryMiB", 0)),
                    pci_bus_id=str(d.get("pciBusId", "")),
                    healthy=bool(d.get("healthy", True)),
                    health_reason=str(d.get("healthReason", "")),
                    numa_node=None if d.get("numaNode") is None else int(d["numaNode"]),
                )
                for d in data.get("devices", [])
            )
            return cls(
                node=NodeName(str(data["node"])),
                devices=devices,
                driver_version=str(data.get("driverVersion", "")),
                cuda_driver_version=str(data.get("cudaDriverVersion", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed inventory: {exc}") from exc


@dataclass(frozen=True, slots=True)
class DeviceCheck:
    """An agent's verdict on one model entry that targets its node."""

    map: str  # "<namespace>/<name>"
    index: int
    ok: bool
    reason: str = ""  # DeviceMissing | DeviceUnhealthy | RequirementMismatch
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "map": self.map,
            "index": self.index,
            "ok": self.ok,
            "reason": self.reason,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceCheck:
        return cls(
            str(data["map"]),
            int(data["index"]),
            bool(data["ok"]),
            str(data.get("reason", "")),
            str(data.get("message", "")),
        )
