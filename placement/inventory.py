"""Node inventories as agents publish them (`inventory.json`) and the per-node check results."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from placement.maps import Requirement
from placement.reasons import Reason
from placement.taints import DeviceTaint, Toleration
from placement.types import DeviceRef, GpuUuid, NodeName, pci_bus_id

INVENTORY_KEY = "inventory.json"
CHECKS_KEY = "checks.json"
INVENTORY_NAMESPACE = "gpuplace-inventory"


@dataclass(frozen=True, slots=True)
class SourcedTaint:
    """A DRA device taint and where it comes from ("in its ResourceSlice", "by DeviceTaintRule
    <name>"), so that a status can say whom to ask."""

    taint: DeviceTaint
    source: str

    def describe(self) -> str:
        return f"{self.taint.describe()} ({self.source})"


def untolerated_taints(
    taints: Iterable[SourcedTaint], tolerations: Iterable[Toleration]
) -> tuple[SourcedTaint, ...]:
    """The taints that keep a device from a slot with these tolerations (see
    `placement.taints.untolerated`)."""
    held = tuple(tolerations)
    return tuple(
        t for t in taints if t.taint.blocks and not any(tol.tolerates(t.taint) for tol in held)
    )


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device that exists on a GPU: `index` is its MIG device index on the parent,
    `start`/`size` its GPU instance's placement in the GPU's memory slices (8 on H100 and H200;
    0 and 0 where the driver did not let the agent read it)."""

    uuid: str
    profile: str  # "3g.40gb", as the driver names it (without the product prefix)
    index: int
    start: int
    size: int
    memory_mib: int
    #: Its DRA device's taints (a MIG device is a device of its own); see `GpuDevice.taints`.
    taints: tuple[SourcedTaint, ...] = ()


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
    mig_mode: bool = False  # the current mode, not the pending one
    mig_instances: tuple[MigInstance, ...] = ()
    #: Local GPUs joined to this one by at least one active NVLink (NVSwitch ports excluded).
    nvlink_peers: tuple[GpuUuid, ...] = ()
    #: Local GPUs whose common PCIe ancestor with this one is a switch (SINGLE or MULTIPLE).
    pcie_switch_peers: tuple[GpuUuid, ...] = ()
    #: Its DRA device's taints, overlaid by the controller in dra enforcement (agents do not
    #: see them, and the inventory JSON does not carry them).
    taints: tuple[SourcedTaint, ...] = ()

    def blocked_by(self, tolerations: Iterable[Toleration]) -> tuple[SourcedTaint, ...]:
        """Its taints that a slot with these tolerations does not tolerate."""
        return untolerated_taints(self.taints, tolerations) if self.taints else ()

    def satisfies(self, requirement: Requirement | None) -> bool:
        if requirement is None:
            return True
        if requirement.product and requirement.product != self.name:
            return False
        return not (requirement.min_memory_mib and self.memory_mib < requirement.min_memory_mib)


def taint_problem(
    taints: Iterable[SourcedTaint], tolerations: Iterable[Toleration], shown: str
) -> tuple[Reason, str] | None:
    """The untolerated taints of the DRA device `shown`, as one problem; None when it has none."""
    blocking = untolerated_taints(taints, tolerations)
    if not blocking:
        return None
    listed = ", ".join(t.describe() for t in blocking)
    return (
        Reason.DEVICE_TAINTED,
        f"device {shown} is tainted {listed}; the slot's tolerations do not tolerate it",
    )


def device_problems(
    device: GpuDevice,
    require: Requirement | None,
    shown: str,
    *,
    whole: bool = True,
    tolerations: Iterable[Toleration] = (),
) -> list[tuple[Reason, str]]:
    """What keeps a present device from serving a slot, in order: it is unhealthy, it carries a
    DRA taint the slot's `tolerations` do not tolerate, it is a whole GPU in MIG mode (`whole`:
    the slot wants the GPU itself, not one of its MIG devices; CUDA finds no device to run on
    behind a MIG-mode GPU's own UUID), it is not what the slot requires. The one device check of
    compile, the binder and the agents; `shown` is how the caller names the device (as the map
    wrote it, or its index and UUID). The taints checked are the GPU's own only when the slot
    uses it `whole`: a MIG slot's DRA device is its instance (see `taint_problem`)."""
    problems: list[tuple[Reason, str]] = []
    if not device.healthy:
        why = device.health_reason or "unknown"
        problems.append((Reason.DEVICE_UNHEALTHY, f"device {shown} is unhealthy: {why}"))
    tainted = taint_problem(device.taints, tolerations, shown) if whole else None
    if tainted is not None:
        problems.append(tainted)
    if whole and device.mig_mode:
        problems.append(
            (
                Reason.REQUIREMENT_MISMATCH,
                f"device {shown} is in MIG mode: a slot of whole GPUs cannot use it (name one "
                "of its MIG devices with `mig:`, or disable MIG on it)",
            )
        )
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
    #: MIG UUID -> the instance; `mig_parent` names the GPU that holds it.
    mig_by_uuid: Mapping[str, MigInstance] = field(init=False, compare=False, repr=False)
    mig_parent: Mapping[str, GpuDevice] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_index", MappingProxyType({d.index: d for d in self.devices}))
        object.__setattr__(self, "by_uuid", MappingProxyType({d.uuid: d for d in self.devices}))
        migs = [(m, d) for d in self.devices for m in d.mig_instances]
        object.__setattr__(self, "mig_by_uuid", MappingProxyType({m.uuid: m for m, _ in migs}))
        object.__setattr__(self, "mig_parent", MappingProxyType({m.uuid: d for m, d in migs}))

    def find(self, ref: DeviceRef) -> GpuDevice | None:
        """The GPU a map's reference names: an NVML index, a UUID or a PCI bus ID."""
        if isinstance(ref, int):
            return self.by_index.get(ref)
        found = self.by_uuid.get(ref)
        if found is None and (pci := pci_bus_id(ref)) is not None:
            return next((d for d in self.devices if pci_bus_id(d.pci_bus_id) == pci), None)
        return found

    def with_taints(self, taints: Mapping[str, tuple[SourcedTaint, ...]]) -> NodeInventory:
        """The inventory with each device's DRA taints (by GPU or MIG UUID) in place of those it
        carried: a device not in `taints` has none. Returns itself when nothing changes."""
        if not taints and not any(
            d.taints or any(m.taints for m in d.mig_instances) for d in self.devices
        ):
            return self
        devices = tuple(
            replace(
                d,
                taints=taints.get(d.uuid, ()),
                mig_instances=tuple(
                    replace(m, taints=taints.get(m.uuid, ())) for m in d.mig_instances
                ),
            )
            for d in self.devices
        )
        if devices == self.devices:
            return self
        return replace(self, devices=devices)

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
                        "migMode": d.mig_mode,
                        "migInstances": [_mig_to_json(m) for m in d.mig_instances],
                        "nvlinkPeers": list(d.nvlink_peers),
                        "pcieSwitchPeers": list(d.pcie_switch_peers),
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
                    mig_mode=_strict_bool(d.get("migMode", False), "migMode"),
                    mig_instances=tuple(_mig_from_json(m) for m in _list(d, "migInstances")),
                    nvlink_peers=tuple(GpuUuid(str(u)) for u in _list(d, "nvlinkPeers")),
                    pcie_switch_peers=tuple(GpuUuid(str(u)) for u in _list(d, "pcieSwitchPeers")),
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


def _mig_to_json(m: MigInstance) -> dict[str, Any]:
    return {
        "uuid": m.uuid,
        "profile": m.profile,
        "index": m.index,
        "start": m.start,
        "size": m.size,
        "memoryMiB": m.memory_mib,
    }


def _mig_from_json(data: Any) -> MigInstance:
    return MigInstance(
        uuid=str(data["uuid"]),
        profile=str(data["profile"]),
        index=int(data["index"]),
        start=int(data.get("start", 0)),
        size=int(data.get("size", 0)),
        memory_mib=int(data.get("memoryMiB", 0)),
    )


def _list(device: Any, key: str) -> list[Any]:
    """A list field that agents before MIG and NVLink did not write: absent or null reads empty."""
    value = device.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"device {device.get('index')}: {key} is not a list")
    return value


def _strict_bool(value: Any, key: str) -> bool:
    # bool("false") is True: a string here is a writer's bug, not a mode.
    if not isinstance(value, bool):
        raise ValueError(f"{key} is not a boolean: {value!r}")
    return value


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
