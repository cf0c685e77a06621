"""Whose a declared GPU is: a GPU that a served map slot declares belongs to that slot, held or not.

A map's pod may be away (restarting, evicted, its node drained and back) while its GPUs stay
declared; a pod that comes to them by another path (a legacy line waiting for a bind, a pod created
already bound by another scheduler or by hand) would otherwise take them, and the map's own pod
would wait `DeviceBusy` for as long as the other pod runs. One pure function decides, called by the
webhook when such a pod is created, by the binder before it binds a legacy line and before it
counts a pre-bound pod's hold (docs/trust.md).

The one exception is the same slot written both ways: the pods `<name>-<i>` serve index i of map
`<name>` of their namespace (a map made from the same `gpu-scheduling-map` text whose pods are not
migrated yet), as the map's own pod would.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from placement.annotations import name_ordinal
from placement.devices import GpuId
from placement.gate import Device
from placement.model import Model
from placement.types import MapKey, SlotKey


@dataclass(frozen=True, slots=True)
class Declared:
    """A GPU that a served slot declares, found where another pod would take it."""

    slot: SlotKey
    node: str
    gpu: str  # as the pod named it: an NVML index or a UUID

    def __str__(self) -> str:
        return (
            f"GPU {self.gpu} on node {self.node} is declared by map {self.slot.map} index "
            f"{self.slot.index}; it stays that slot's while its pod is away"
        )


def own_slot(namespace: str, pod_name: str) -> SlotKey | None:
    """The slot a pod `<name>-<i>` serves by its name alone: index i of map `<name>` of its
    namespace; None for a name without an ordinal suffix."""
    index = name_ordinal(pod_name)
    if index is None:
        return None
    base = pod_name[: pod_name.rfind("-")]
    return SlotKey(MapKey(namespace, base), index) if base else None


def _ids(device: Device) -> tuple[GpuId, ...]:
    """Every name the model's index may hold the device under (UUID, NVML index)."""
    out: list[GpuId] = []
    if device.uuid is not None:
        out.append(GpuId.of_uuid(device.uuid))
    if device.index is not None:
        out.append(GpuId.of_index(device.index))
    return tuple(out)


def declared_elsewhere(
    model: Model,
    namespace: str,
    pod_name: str,
    node: str,
    devices: Iterable[Device],
) -> Declared | None:
    """The first of `devices` on `node` that a served slot of `model` declares, other than the
    pod's own slot by name (`own_slot`); None when every device is free of declarations. An
    O(devices) lookup in the model's (node, GPU) index."""
    own = own_slot(namespace, pod_name)
    for device in devices:
        for gpu in _ids(device):
            for slot in model.declared_by(node, gpu):
                if slot != own:
                    return Declared(slot, node, str(device))
    return None
