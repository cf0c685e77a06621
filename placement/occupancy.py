"""Who holds which GPU: one cell per GPU of every node, from the nodes' inventories and the bound
pods' bindings. Pure: `gpuplace gpus` reads the cluster and renders the cells, the controller's
metrics describe the same GPUs from its slot cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from placement.inventory import GpuDevice, NodeInventory
from placement.types import NodeName


class CellState(StrEnum):
    """What a GPU is, the first that applies in this order."""

    DEGRADED = "degraded"  # the agent reports it unhealthy
    MISSING = "missing"  # a pod holds it, the node's inventory does not have it
    DRIFTED = "drifted"  # a holder's binding no longer matches its map
    RENUMBERED = "renumbered"  # a holder's NVML index now names another GPU
    UNVERIFIABLE = "unverifiable"  # a holder's binding names a key the ring no longer holds
    SHARED = "shared"  # several pods hold it (maps with sharing: shared, legacy lines)
    HELD = "held"
    FREE = "free"


@dataclass(frozen=True, slots=True)
class Holder:
    """A bound pod's claim on GPUs, as its binding annotations say."""

    namespace: str
    pod: str
    map: str  # the map's name (legacy pods: legacy.<statefulset>)
    index: int
    node: NodeName
    uuids: tuple[str, ...] = ()  # gpuplace.io/devices; empty in envMode index without UUIDs
    indices: tuple[int, ...] = ()  # from CUDA_VISIBLE_DEVICES when no UUID is known
    drifted: str = ""  # the Drifted condition's message, when True
    renumbered: str = ""
    unverifiable: str = ""

    @property
    def slot(self) -> str:
        return f"{self.namespace}/{self.map}#{self.index}"


@dataclass(frozen=True, slots=True)
class GpuCell:
    node: NodeName
    index: int | None  # None: held by a pod, not in the node's inventory
    uuid: str
    product: str
    state: CellState
    holders: tuple[Holder, ...] = ()
    reason: str = ""  # why degraded, drifted, renumbered, unverifiable or missing

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "state": self.state.value,
            "reason": self.reason,
            "holders": [
                {"namespace": h.namespace, "pod": h.pod, "map": h.map, "index": h.index}
                for h in self.holders
            ],
        }


@dataclass
class _Slot:
    device: GpuDevice | None
    uuid: str
    holders: list[Holder] = field(default_factory=list)


def occupancy(
    inventories: Mapping[NodeName, NodeInventory],
    holders: Iterable[Holder],
    nodes: Iterable[NodeName] = (),
) -> list[GpuCell]:
    """Every GPU of every inventory (and of `nodes`, which may have none), each with its holders;
    a GPU a pod holds that no inventory lists is a MISSING cell of its own."""
    cells: dict[NodeName, dict[str, _Slot]] = {n: {} for n in nodes}
    for node, inventory in inventories.items():
        row = cells.setdefault(node, {})
        for device in inventory.devices:
            row[device.uuid] = _Slot(device, device.uuid)
    for holder in holders:
        row = cells.setdefault(holder.node, {})
        for uuid in _uuids(holder, inventories.get(holder.node)):
            row.setdefault(uuid, _Slot(None, uuid)).holders.append(holder)
    out = [_cell(node, slot) for node, row in cells.items() for slot in row.values()]
    return sorted(out, key=lambda c: (c.node, c.index is None, c.index or 0, c.uuid))


def _uuids(holder: Holder, inventory: NodeInventory | None) -> list[str]:
    if holder.uuids:
        return list(holder.uuids)
    out = []
    for index in holder.indices:
        device = inventory.by_index.get(index) if inventory is not None else None
        out.append(device.uuid if device is not None else f"index {index}")
    return out


def _cell(node: NodeName, slot: _Slot) -> GpuCell:
    holders = tuple(sorted(slot.holders, key=lambda h: (h.namespace, h.pod)))
    device = slot.device
    state, reason = _state(device, holders)
    return GpuCell(
        node,
        device.index if device is not None else None,
        slot.uuid,
        device.name if device is not None else "",
        state,
        holders,
        reason,
    )


def _state(device: GpuDevice | None, holders: tuple[Holder, ...]) -> tuple[CellState, str]:
    if device is not None and not device.healthy:
        return CellState.DEGRADED, device.health_reason
    if device is None:
        return CellState.MISSING, "held by a pod, not in the node's inventory"
    for state, attribute in (
        (CellState.DRIFTED, "drifted"),
        (CellState.RENUMBERED, "renumbered"),
        (CellState.UNVERIFIABLE, "unverifiable"),
    ):
        why = next((getattr(h, attribute) for h in holders if getattr(h, attribute)), "")
        if why:
            return state, why
    if len(holders) > 1:
        return CellState.SHARED, ""
    return (CellState.HELD if holders else CellState.FREE), ""


def summary(cells: Iterable[GpuCell]) -> dict[str, int]:
    """How many GPUs are in each state (every state, zeros included)."""
    counts = {state.value: 0 for state in CellState}
    for cell in cells:
        counts[cell.state.value] += 1
    return counts
