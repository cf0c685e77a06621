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

    HELD_TWICE = "held-twice"  # two claims' allocations name it, and they may not share it
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
    #: The ResourceClaims (namespace/name) whose allocations name the GPU (dra enforcement, or
    #: claims that kube-scheduler allocated): whoever allocated them, each holds it.
    claims: tuple[str, ...] = ()

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
            "claims": list(self.claims),
        }


@dataclass
class _Slot:
    device: GpuDevice | None
    uuid: str
    holders: list[Holder] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)


#: A claim's allocation of one GPU: (namespace/name of the claim, node, GPU UUID).
ClaimedGpu = tuple[str, NodeName, str]


def occupancy(
    inventories: Mapping[NodeName, NodeInventory],
    holders: Iterable[Holder],
    nodes: Iterable[NodeName] = (),
    claims: Iterable[ClaimedGpu] = (),
) -> list[GpuCell]:
    """Every GPU of every inventory (and of `nodes`, which may have none), each with its holders
    and the claims whose allocations name it; a GPU a pod or a claim holds that no inventory
    lists is a MISSING cell of its own."""
    cells: dict[NodeName, dict[str, _Slot]] = {n: {} for n in nodes}
    for node, inventory in inventories.items():
        row = cells.setdefault(node, {})
        for device in inventory.devices:
            row[device.uuid] = _Slot(device, device.uuid)
    for holder in holders:
        row = cells.setdefault(holder.node, {})
        for uuid in _uuids(holder, inventories.get(holder.node)):
            row.setdefault(uuid, _Slot(None, uuid)).holders.append(holder)
    for claim, node, uuid in claims:
        cells.setdefault(node, {}).setdefault(uuid, _Slot(None, uuid)).claims.append(claim)
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
    claims = tuple(sorted(slot.claims))
    device = slot.device
    state, reason = _state(device, holders, claims)
    return GpuCell(
        node,
        device.index if device is not None else None,
        slot.uuid,
        device.name if device is not None else "",
        state,
        holders,
        reason,
        claims,
    )


def _state(
    device: GpuDevice | None, holders: tuple[Holder, ...], claims: tuple[str, ...]
) -> tuple[CellState, str]:
    # Pods that share the GPU by a shared slot have a claim each; a claim beyond them is a
    # second owner.
    if len(claims) > 1 and len(claims) > max(len(holders), 1):
        return CellState.HELD_TWICE, f"allocated to {len(claims)} claims: {', '.join(claims)}"
    if device is not None and not device.healthy:
        return CellState.DEGRADED, device.health_reason
    if device is None:
        return CellState.MISSING, "held, not in the node's inventory"
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
    return (CellState.HELD if holders or claims else CellState.FREE), ""


def summary(cells: Iterable[GpuCell]) -> dict[str, int]:
    """How many GPUs are in each state (every state, zeros included)."""
    counts = {state.value: 0 for state in CellState}
    for cell in cells:
        counts[cell.state.value] += 1
    return counts
