"""Drift: a bound pod whose binding no longer matches what its map declares for its slot.

GitOps changes maps under running pods. A pod keeps the node and GPUs it was bound to; when a new
version of its map moves its slot (another node or other GPUs), removes it, or the map is deleted,
the pod is Drifted until it is replaced (by hand, or by the map's `rollout: evict`) or the map
returns to where the pod runs. Pure: the controller decides, writes conditions and counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from placement.devices import GpuId, gpu_ids
from placement.model import CompiledSlot, Model, Provenance
from placement.types import NodeName, SlotKey


class DriftKind(StrEnum):
    SLOT_MOVED = "SlotMoved"  # the slot names another node or other GPUs
    SLOT_REMOVED = "SlotRemoved"  # the map no longer has the pod's index
    MAP_DELETED = "MapDeleted"  # the map is gone from the model


@dataclass(frozen=True, slots=True)
class BoundSlot:
    """What a bound pod holds, as its Binding recorded it."""

    slot: SlotKey
    node: NodeName
    gpus: tuple[str, ...]  # GPU UUIDs, or "#<index>" when bound without an inventory
    revision: str = ""  # revision of the map version that placed it


@dataclass(frozen=True, slots=True)
class Drift:
    kind: DriftKind
    bound: BoundSlot
    now_node: NodeName | None = None  # where the map puts the slot now (SLOT_MOVED)
    now_gpus: tuple[str, ...] = ()
    since: Provenance = field(default_factory=Provenance)  # the version it drifted from

    @property
    def movable(self) -> bool:
        """Whether a replacement pod has a slot to go to."""
        return self.kind is DriftKind.SLOT_MOVED

    def old_placement(self) -> str:
        return _placement(self.bound.node, self.bound.gpus)

    def new_placement(self) -> str:
        if self.kind is DriftKind.SLOT_MOVED and self.now_node is not None:
            return _placement(self.now_node, self.now_gpus)
        return "(none)"

    def message(self) -> str:
        slot = self.bound.slot
        placed = f" by revision {self.bound.revision}" if self.bound.revision else ""
        since = self.since.describe()
        if self.kind is DriftKind.MAP_DELETED:
            now = f"map {slot.map} was deleted"
        elif self.kind is DriftKind.SLOT_REMOVED:
            now = f"map {slot.map} at {since} has no index {slot.index}"
        else:
            now = f"map {slot.map} at {since} puts index {slot.index} on {self.new_placement()}"
        return f"bound{placed} to {self.old_placement()}; {now}"


def _placement(node: NodeName, gpus: tuple[str, ...]) -> str:
    return f"node {node} GPUs {','.join(gpus) or '-'}"


def _slot_gpus(slot: CompiledSlot, like: tuple[str, ...]) -> tuple[str, ...] | None:
    """The slot's GPUs in the same terms as a binding's (UUIDs, or #indices); None if unknown."""
    by_index = bool(like) and all(GpuId(g).nvml_index is not None for g in like)
    if by_index:
        return gpu_ids((), slot.device_indices) if slot.device_indices else None
    return tuple(slot.devices) if slot.devices else None


def drift_of(bound: BoundSlot, model: Model) -> Drift | None:
    """How `bound` differs from its map's current slot, or None while it matches.

    A slot the compiler could not resolve (its node has no inventory yet, a device is missing)
    has no devices to compare: only a change of node counts then, so a sick GPU or a late
    inventory never reads as a change of the map."""
    cmap = model.maps.get(bound.slot.map)
    if cmap is None:
        return Drift(DriftKind.MAP_DELETED, bound)
    since = cmap.provenance
    slot = cmap.slots.get(bound.slot.index)
    if slot is None:
        return Drift(DriftKind.SLOT_REMOVED, bound, since=since)
    gpus = _slot_gpus(slot, bound.gpus)
    if slot.node != bound.node:
        return Drift(DriftKind.SLOT_MOVED, bound, slot.node, gpus or (), since)
    if gpus is not None and set(gpus) != set(bound.gpus):
        return Drift(DriftKind.SLOT_MOVED, bound, slot.node, gpus, since)
    return None
