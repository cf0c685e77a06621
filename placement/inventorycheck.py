"""Declared devices against a cluster's GPUs: what `gpuplace plan` says before a map merges.

The GPUs come as the cells `gpuplace gpus -o json` prints (one per GPU: node, index, UUID,
product, state, holders), read live from the cluster or from a snapshot committed next to the
maps (`inventory.json` in the cluster directory). Offline, a declared node or device that the
snapshot lacks, or a `require.product` it does not match, is an error at the slot's line: the
slot would wait forever. Live, the slots a change adds or moves are also checked for GPUs held by
another slot's pod (the slot waits until that pod goes) or missing and unhealthy GPUs. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.diff import MapChangeKind, Plan, SlotChangeKind
from placement.errors import Diagnostic, Location
from placement.maps import DeclaredSlot, PlacementMap
from placement.occupancy import CellState, GpuCell, Holder
from placement.reasons import Reason
from placement.types import MapKey, NodeName

#: The file of a cluster directory that holds its GPUs, as `gpuplace gpus -o json` prints them.
INVENTORY_SNAPSHOT = "inventory.json"

_UNSERVABLE = (CellState.DEGRADED, CellState.MISSING)


def cells_from_json(text: str, source: str) -> list[GpuCell] | Diagnostic:
    """The GPUs of a `gpuplace gpus -o json` snapshot, or why it cannot be read."""
    try:
        data = json.loads(text)
        gpus = data["gpus"]
        if not isinstance(gpus, list):
            raise TypeError("'gpus' is not a list")
        return [_cell(item) for item in gpus]
    except (ValueError, KeyError, TypeError) as exc:
        return Diagnostic(
            Location(source, 1, 1),
            f"not an inventory snapshot: {exc}",
            hint="write it with `gpuplace gpus -o json > inventory.json` against the cluster",
        )


def _cell(item: Mapping[str, Any]) -> GpuCell:
    index = item.get("index")
    holders = tuple(
        Holder(str(h["namespace"]), str(h["pod"]), str(h["map"]), int(h["index"]), item["node"])
        for h in item.get("holders") or ()
    )
    return GpuCell(
        NodeName(str(item["node"])),
        None if index is None else int(index),
        str(item.get("uuid", "")),
        str(item.get("product", "")),
        CellState(item.get("state", CellState.FREE.value)),
        holders,
        str(item.get("reason", "")),
    )


def by_node(cells: Iterable[GpuCell]) -> dict[str, list[GpuCell]]:
    """The GPUs an inventory lists (a holder's GPU that no inventory has is left out), by node."""
    out: dict[str, list[GpuCell]] = {}
    for cell in cells:
        if cell.index is not None:
            out.setdefault(cell.node, []).append(cell)
    return out


def _find(gpus: Sequence[GpuCell], ref: int | str) -> GpuCell | None:
    for cell in gpus:
        if (isinstance(ref, int) and cell.index == ref) or cell.uuid == ref:
            return cell
    return None


def slot_devices(slot: DeclaredSlot, gpus: Sequence[GpuCell]) -> list[GpuCell | int | str]:
    """Each declared device of `slot` as the node's GPU, or the reference itself when the node
    has no such GPU."""
    out: list[GpuCell | int | str] = []
    for ref in slot.devices:
        cell = _find(gpus, ref)
        out.append(cell if cell is not None else ref)
    return out


def check_slot(slot: DeclaredSlot, gpus: Sequence[GpuCell]) -> list[str]:
    """What in `slot` the GPUs of its node cannot serve (empty when they can)."""
    node = gpus
    problems: list[str] = []
    if slot.count is not None and slot.count > len(node):
        problems.append(f"count {slot.count}: node {slot.node} has {len(node)} GPUs")
    want = slot.require.product if slot.require is not None else None
    for found in slot_devices(slot, node):
        if not isinstance(found, GpuCell):
            problems.append(f"node {slot.node} has no GPU {found}")
        elif want and found.product != want:
            problems.append(
                f"GPU {found.index} of {slot.node} is a {found.product!r}, the slot requires "
                f"{want!r}"
            )
    if want and slot.count is not None and not any(c.product == want for c in node):
        problems.append(f"node {slot.node} has no {want!r}")
    return problems


def check_devices(
    pmap: PlacementMap, gpus: Mapping[str, Sequence[GpuCell]], source: str
) -> list[Diagnostic]:
    """Every slot of `pmap` whose node or devices `gpus` lacks, at the slot's location. MIG
    slots are the agent's to check (the snapshot does not list MIG instances). A node the
    snapshot lacks is a warning (it may be a logical name), except in a gang map: there it is an
    error, since the gang could never be complete."""
    out: list[Diagnostic] = []
    for slot in pmap.slots:
        if slot.mig is not None:
            continue
        where = slot.location if slot.location.source else Location(source)
        node = gpus.get(slot.node)
        if node is None and pmap.gang is not None:
            # A gang binds all its slots or none: one slot that can never be served keeps every
            # rank waiting, so the map is refused here rather than stuck once merged.
            out.append(
                Diagnostic(
                    where,
                    f"map {pmap.key} index {slot.index}: node {slot.node} is not in "
                    f"{INVENTORY_SNAPSHOT}: the map is a gang, which binds all its slots or "
                    "none, so none of its ranks would ever be bound",
                    hint=f"name a node that `gpuplace gpus` lists, or refresh {INVENTORY_SNAPSHOT}",
                )
            )
            continue
        if node is None:
            # A logical name resolves through a node label, which the snapshot does not record.
            out.append(
                Diagnostic(
                    where,
                    f"map {pmap.key} index {slot.index}: node {slot.node} is not in "
                    f"{INVENTORY_SNAPSHOT}",
                    severity="warning",
                    hint="a node name must match `gpuplace gpus`; a logical name (legacy maps) "
                    "is resolved in the cluster",
                )
            )
            continue
        out.extend(
            Diagnostic(
                where,
                f"map {pmap.key} index {slot.index}: {problem}",
                hint=f"check the devices against `gpuplace gpus`, or refresh {INVENTORY_SNAPSHOT}",
            )
            for problem in check_slot(slot, node)
        )
    return out


@dataclass(frozen=True, slots=True)
class WaitingSlot:
    """A slot the change adds or moves that could not be served at once on the live cluster."""

    map: MapKey
    index: int
    node: str
    reason: Reason
    detail: str

    def describe(self) -> str:
        return f"{self.map} index {self.index} on {self.node} ({self.reason.value}): {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "map": str(self.map),
            "index": self.index,
            "node": self.node,
            "reason": self.reason.value,
            "detail": self.detail,
        }


def waiting_slots(
    result: Plan, cells: Iterable[GpuCell], aliases: Mapping[str, str] | None = None
) -> list[WaitingSlot]:
    """The slots `result` adds or moves that would wait: their node has no inventory, a declared
    GPU is missing or unhealthy, or a pod of another slot holds it (until that pod goes).
    `aliases`: logical name -> node, for slots that name their node by its logical name."""
    gpus = by_node(cells)
    for name, node in (aliases or {}).items():
        if name not in gpus and node in gpus:
            gpus[name] = gpus[node]
    out: list[WaitingSlot] = []
    for change in result.changes:
        if change.kind not in (MapChangeKind.ADDED, MapChangeKind.CHANGED, MapChangeKind.FIXED):
            continue
        for slot_change in change.slots:
            slot = slot_change.after
            if slot is None or slot_change.kind not in (SlotChangeKind.ADDED, SlotChangeKind.MOVED):
                continue
            why = _wait(change.id.key, slot, gpus)
            if why is not None:
                out.append(WaitingSlot(change.id.key, slot.index, slot.node, *why))
    return out


def _wait(
    key: MapKey, slot: DeclaredSlot, gpus: Mapping[str, Sequence[GpuCell]]
) -> tuple[Reason, str] | None:
    node = gpus.get(slot.node)
    if node is None:
        return Reason.INVENTORY_MISSING, f"node {slot.node} has no GPU inventory"
    for found in slot_devices(slot, node):
        if not isinstance(found, GpuCell):
            return Reason.DEVICE_MISSING, f"node {slot.node} has no GPU {found}"
        if found.state in _UNSERVABLE:
            return Reason.DEVICE_UNHEALTHY, f"GPU {found.index} is {found.state.value}"
        others = [
            h for h in found.holders if (h.namespace, h.map, h.index) != (*_of(key), slot.index)
        ]
        if others:
            pods = ", ".join(f"{h.namespace}/{h.pod} ({h.slot})" for h in others)
            return Reason.DEVICE_BUSY, f"GPU {found.index} is held by {pods}"
    if slot.count is not None:
        free = [c for c in node if not c.holders and c.state not in _UNSERVABLE]
        if len(free) < slot.count:
            return Reason.INSUFFICIENT_DEVICES, f"{len(free)} free GPUs of {slot.count} wanted"
    return None


def _of(key: MapKey) -> tuple[str, str]:
    return key.namespace, key.name
