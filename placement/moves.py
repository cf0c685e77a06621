"""`gpuplace move`: where the slots on a node, or on named GPUs, go instead.

Targets are chosen as the controller chooses a `count` entry's GPUs (placement/slotdevices.py
`select_devices`): free (no slot of the served model and no running pod or claim holds them),
healthy, whole, untainted for the slot, of the same product and memory as the GPUs it leaves,
NVLink peers kept together when the slot's GPUs are joined now, and granted to its namespace. A
slot moved off named GPUs stays on its node when that node has room; otherwise, and off a node,
the node that fits best takes it (the fewest fitting free GPUs, then the name: larger groups stay
free). Nothing is half-moved: a slot gets all its GPUs or stays where it is and is reported with
the reason, and a gang map moves all its moving slots or none. Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from placement.authoring import Skipped, SlotEdit
from placement.grants import GrantView
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import CompiledSlot, Model
from placement.slotdevices import all_joined, select_devices
from placement.types import DeviceRef, GpuUuid, MapKey, NodeName


@dataclass(frozen=True, slots=True)
class MoveRequest:
    """Off a node (maintenance), off named GPUs (a failed GPU without a spare), or both."""

    node: NodeName | None = None
    gpus: frozenset[str] = frozenset()

    def describe(self) -> str:
        parts = [f"node {self.node}"] if self.node else []
        if self.gpus:
            parts.append(f"GPU(s) {', '.join(sorted(self.gpus))}")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class MoveResult:
    edits: tuple[SlotEdit, ...] = ()
    #: Slots that must move and found no room (or whose gang did not), with why.
    unplaced: tuple[Skipped, ...] = ()
    #: Slots on the node or GPUs that are not moved by this command (a `mig` entry, ...).
    left: tuple[Skipped, ...] = ()


@dataclass(slots=True)
class _Moving:
    pmap: PlacementMap
    slot: DeclaredSlot
    served: CompiledSlot | None
    node: NodeName
    current: tuple[GpuDevice | None, ...]  # the GPUs it declares, as the inventory has them
    keep: frozenset[GpuUuid]  # its own GPUs it may keep (moving off named GPUs only)
    needed: int
    product: str
    memory_mib: int
    nvlink: bool
    inventory: NodeInventory | None
    tried: list[str] = field(default_factory=list)


def _declared_gpus(
    slot: DeclaredSlot, served: CompiledSlot | None, inventory: NodeInventory | None
) -> tuple[GpuDevice | None, ...]:
    """The GPUs the entry names (a `count` entry: those the model picked for it)."""
    if inventory is None:
        return tuple(None for _ in slot.devices)
    if slot.count is not None:
        return tuple(inventory.by_uuid.get(u) for u in (served.devices if served else ()))
    return tuple(inventory.find(ref) for ref in slot.devices)


def _uuids_of(
    slot: DeclaredSlot, served: CompiledSlot | None, gpus: Iterable[GpuDevice | None]
) -> set[str]:
    """Every GPU the slot names or holds: declared, picked, or a spare standing in."""
    out: set[str] = {d.uuid for d in gpus if d is not None}
    out |= {str(r) for r in slot.devices if isinstance(r, str)}
    if served is not None:
        out |= set(served.devices)
    return out


def held_gpus(model: Model, others: Iterable[tuple[NodeName, str]] = ()) -> set[tuple[str, str]]:
    """(node, GPU UUID) of every GPU a slot of the served model holds (blocked slots and MIG
    parents included), and `others` (what running pods and claims hold outside the model)."""
    held: set[tuple[str, str]] = set(others)
    for cmap in model.maps.values():
        for slot in cmap.slots.values():
            for uuid in slot.devices:
                held.add((slot.node, uuid))
            if slot.mig is not None and slot.mig.parent:
                held.add((slot.node, slot.mig.parent))
    return held


def plan_moves(
    request: MoveRequest,
    pmaps: Iterable[PlacementMap],
    model: Model,
    inventories: Mapping[NodeName, NodeInventory],
    held: Set[tuple[str, str]],
    logical: Mapping[NodeName, str] = {},
    aliases: Mapping[str, NodeName] = {},
    cliques: Mapping[NodeName, str] = {},
    grants: GrantView | None = None,
) -> MoveResult:
    """The edits that move every slot of `pmaps` on `request`'s node or GPUs, the slots that
    found no room, and those left alone. `aliases`: logical name -> node, to read what the maps
    wrote; `logical`: node -> the logical name to write where the entry wrote one."""
    grants = grants if grants is not None else model.grants
    moving, left = _moving_slots(request, pmaps, model, inventories, aliases)
    taken: set[tuple[str, str]] = set(held)
    edits: list[SlotEdit] = []
    unplaced: list[Skipped] = []
    by_map: dict[MapKey, list[_Moving]] = defaultdict(list)
    for m in moving:
        by_map[m.pmap.key].append(m)
    # The largest requests first, as a packer would: they have the fewest places to go.
    order = sorted(by_map, key=lambda k: (-max(m.needed for m in by_map[k]), str(k)))
    for key in order:
        group = sorted(by_map[key], key=lambda m: (-m.needed, m.slot.index))
        chosen: list[tuple[_Moving, NodeName, tuple[GpuDevice, ...]]] = []
        failed: list[_Moving] = []
        mine: set[tuple[str, str]] = set()
        clique = _clique_of(group[0].pmap, model, cliques) if group[0].pmap.same_clique else None
        for m in group:
            target = _place(m, request, inventories, taken | mine, grants, cliques, clique)
            if target is None:
                failed.append(m)
                continue
            node, devices = target
            mine |= {(node, d.uuid) for d in devices}
            chosen.append((m, node, devices))
        gang = group[0].pmap.gang is not None
        if failed and gang:
            for m in group:
                why = (
                    _no_room(m)
                    if m in failed
                    else "its gang's other slots found no room: the gang moves whole or not at all"
                )
                unplaced.append(Skipped(key, m.slot.index, why))
            continue
        for m in failed:
            unplaced.append(Skipped(key, m.slot.index, _no_room(m)))
        for m, node, devices in chosen:
            taken |= {(node, d.uuid) for d in devices}
            edits.append(_edit(m, node, devices, request, logical))
    edits.sort(key=lambda e: (str(e.map), e.index))
    unplaced.sort(key=lambda s: (str(s.map), s.index))
    return MoveResult(tuple(edits), tuple(unplaced), tuple(left))


def _moving_slots(
    request: MoveRequest,
    pmaps: Iterable[PlacementMap],
    model: Model,
    inventories: Mapping[NodeName, NodeInventory],
    aliases: Mapping[str, NodeName],
) -> tuple[list[_Moving], list[Skipped]]:
    moving: list[_Moving] = []
    left: list[Skipped] = []
    for pmap in sorted(pmaps, key=lambda m: str(m.key)):
        cmap = model.maps.get(pmap.key)
        for slot in pmap.slots:
            served = cmap.slots.get(slot.index) if cmap is not None else None
            node = served.node if served is not None else aliases.get(slot.node, slot.node)
            node = NodeName(node)
            inventory = inventories.get(node)
            current = _declared_gpus(slot, served, inventory)
            uuids = _uuids_of(slot, served, current)
            off_node = request.node is not None and node == request.node
            off_gpus = bool(request.gpus & uuids)
            if not (off_node or off_gpus):
                continue
            if slot.mig is not None:
                left.append(Skipped(pmap.key, slot.index, "a `mig` entry: move it by hand"))
                continue
            needed = slot.count if slot.count is not None else len(slot.devices)
            known = [d for d in current if d is not None]
            product = slot.require.product if slot.require and slot.require.product else ""
            memory = 0
            if known:
                product = product or known[0].name
                memory = known[0].memory_mib
            elif inventory is not None and inventory.devices:
                product = product or inventory.devices[0].name
                memory = inventory.devices[0].memory_mib
            nvlink = bool(slot.require and slot.require.nvlink) or (
                needed > 1 and len(known) == needed and all_joined(known)
            )
            keep = frozenset() if off_node else frozenset(GpuUuid(u) for u in uuids - request.gpus)
            moving.append(
                _Moving(
                    pmap,
                    slot,
                    served,
                    node,
                    current,
                    keep,
                    needed,
                    product,
                    memory,
                    nvlink,
                    inventory,
                )
            )
    return moving, left


def _clique_of(pmap: PlacementMap, model: Model, cliques: Mapping[NodeName, str]) -> str | None:
    cmap = model.maps.get(pmap.key)
    seen = [cliques[s.node] for s in (cmap.slots.values() if cmap else ()) if s.node in cliques]
    return max(dict.fromkeys(seen), key=seen.count) if seen else None


def _place(
    m: _Moving,
    request: MoveRequest,
    inventories: Mapping[NodeName, NodeInventory],
    taken: Set[tuple[str, str]],
    grants: GrantView,
    cliques: Mapping[NodeName, str],
    clique: str | None,
) -> tuple[NodeName, tuple[GpuDevice, ...]] | None:
    """The node and GPUs the slot goes to, or None (its `tried` then says why each node
    would not do)."""
    namespace = m.pmap.key.namespace
    fits: list[tuple[int, NodeName, tuple[GpuDevice, ...]]] = []
    for node in sorted(inventories):
        if node == request.node:
            continue
        if clique is not None and cliques.get(node) != clique:
            m.tried.append(f"{node}: not in GPU clique {clique}")
            continue
        free = [
            d
            for d in inventories[node].devices
            if d.healthy
            and not d.mig_mode
            and d.name == m.product
            and (not m.memory_mib or d.memory_mib == m.memory_mib)
            and not d.blocked_by(m.slot.tolerations)
            and d.uuid not in request.gpus
            and ((node, d.uuid) not in taken or (node == m.node and d.uuid in m.keep))
        ]
        if len(free) < m.needed:
            m.tried.append(f"{node}: {len(free)} free of {m.needed}")
            continue
        chosen = select_devices(free, m.needed, nvlink=m.nvlink)
        if chosen is None:
            m.tried.append(f"{node}: no {m.needed} free GPUs joined by NVLink")
            continue
        if m.slot.count is None:
            refused = grants.refusal(namespace, node, [d.uuid for d in chosen])
        else:
            refused = grants.refusal(namespace, node, (), count=True)
        if refused is not None:
            m.tried.append(f"{node}: not granted")
            continue
        if node == m.node and m.keep:
            # Off named GPUs: its own node first, keeping the GPUs it keeps where it can.
            kept = [d for d in free if d.uuid in m.keep]
            rest = [d for d in free if d.uuid not in m.keep]
            wanted = m.needed - len(kept)
            others = select_devices(rest, wanted) if wanted > 0 else ()
            if wanted >= 0 and others is not None:
                pick = (*kept, *others)
                if not m.nvlink or all_joined(pick):
                    return node, pick
            return node, chosen
        fits.append((len(free), node, chosen))
    if not fits:
        return None
    _, node, chosen = min(fits)
    return node, chosen


def _no_room(m: _Moving) -> str:
    what = f"{m.needed} free {m.product or 'GPU'}"
    if m.memory_mib:
        what += f" ({m.memory_mib} MiB)"
    if m.nvlink:
        what += " joined by NVLink"
    tried = "; ".join(m.tried[:6]) + (f"; {len(m.tried) - 6} more" if len(m.tried) > 6 else "")
    return f"no room: no node has {what} granted to {m.pmap.key.namespace} ({tried or 'no nodes'})"


def _edit(
    m: _Moving,
    node: NodeName,
    devices: tuple[GpuDevice, ...],
    request: MoveRequest,
    logical: Mapping[NodeName, str],
) -> SlotEdit:
    wrote_logical = m.slot.node != m.node
    written = logical.get(node, node) if wrote_logical else node
    why = f"off {request.describe()}"
    picked = ", ".join(f"{d.index} ({d.uuid})" for d in devices)
    new_node = written if node != m.node else None
    if m.slot.count is not None:
        # A `count` entry stays one: the controller picks on the new node by the same rule.
        return SlotEdit(
            m.pmap.key, m.slot.index, f"{why}; the controller's pick: {picked}", node=new_node
        )
    fallback: tuple[DeviceRef, ...] | None = None
    if m.slot.fallback:
        if node != m.node:
            fallback = ()  # spares are GPUs of the node it leaves
        else:
            chosen = {d.uuid for d in devices}

            def uuid_of(ref: DeviceRef) -> str:
                found = m.inventory.find(ref) if m.inventory is not None else None
                return found.uuid if found is not None else str(ref)

            spares = tuple(f for f in m.slot.fallback if uuid_of(f) not in chosen)
            fallback = spares if spares != m.slot.fallback else None
    return SlotEdit(
        m.pmap.key,
        m.slot.index,
        f"{why} to {node}: GPUs {picked}",
        node=new_node,
        devices=tuple(d.uuid for d in devices),
        fallback=fallback,
    )
