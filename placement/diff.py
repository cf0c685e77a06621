"""What a change to the maps does: the plan a reviewer reads on a pull request (`gpuplace diff`).

Compares two snapshots (a GitOps tree at two revisions) map by map and slot by slot. A map that
turns invalid is not reported as removed: the controller keeps serving its last valid version,
so the plan says that and shows the errors instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from placement.errors import Diagnostic
from placement.maps import DeclaredSlot, PlacementMap
from placement.snapshot import InvalidMap, MapId, Snapshot, SourceMap


class SlotChangeKind(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    MOVED = "moved"  # another node, other devices, or another count
    CHANGED = "changed"  # same devices, other requirement


class MapChangeKind(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"
    INVALID = "invalid"  # valid before, invalid now: the last valid version keeps serving
    STILL_INVALID = "still-invalid"
    NEW_INVALID = "new-invalid"  # a map that did not exist and does not validate
    FIXED = "fixed"  # invalid before, valid now


@dataclass(frozen=True, slots=True)
class SlotChange:
    kind: SlotChangeKind
    index: int
    before: DeclaredSlot | None = None
    after: DeclaredSlot | None = None

    def describe(self) -> str:
        if self.kind is SlotChangeKind.ADDED and self.after is not None:
            return f"+ index {self.index}: {describe_slot(self.after)}"
        if self.kind is SlotChangeKind.REMOVED and self.before is not None:
            return f"- index {self.index}: {describe_slot(self.before)}"
        assert self.before is not None and self.after is not None
        return (
            f"~ index {self.index} {self.kind.value}: {describe_slot(self.before)} -> "
            f"{describe_slot(self.after)}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "index": self.index,
            "before": slot_json(self.before),
            "after": slot_json(self.after),
        }


@dataclass(frozen=True, slots=True)
class MapChange:
    id: MapId
    kind: MapChangeKind
    source: str
    slots: tuple[SlotChange, ...] = ()
    settings: tuple[str, ...] = ()  # e.g. "sharing: exclusive -> shared"
    diagnostics: tuple[Diagnostic, ...] = ()
    serving_slots: int = 0  # for INVALID: slots the last valid version keeps serving

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.id.scope,
            "map": str(self.id.key),
            "kind": self.kind.value,
            "source": self.source,
            "slots": [s.to_json() for s in self.slots],
            "settings": list(self.settings),
            "errors": [d.to_json() for d in self.diagnostics],
            "servingSlots": self.serving_slots,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    changes: tuple[MapChange, ...]
    #: Errors in the new revision not tied to one map above (conflicts, duplicates, broken files).
    errors: tuple[Diagnostic, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        bad = (MapChangeKind.INVALID, MapChangeKind.STILL_INVALID, MapChangeKind.NEW_INVALID)
        return not self.errors and not any(c.kind in bad for c in self.changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "summary": self.counts,
            "maps": [c.to_json() for c in self.changes],
            "errors": [d.to_json() for d in self.errors],
            "warnings": [d.to_json() for d in self.warnings],
        }


def describe_slot(slot: DeclaredSlot) -> str:
    if slot.count is not None:
        what = f"count={slot.count}"
    else:
        what = "devices " + ",".join(str(d) for d in slot.devices)
    text = f"{slot.node} {what}"
    if slot.require is not None:
        text += f" ({slot.require.describe()})"
    return text


def slot_json(slot: DeclaredSlot | None) -> dict[str, Any] | None:
    if slot is None:
        return None
    return {
        "node": slot.node,
        "devices": list(slot.devices),
        "count": slot.count,
        "require": None
        if slot.require is None
        else {"product": slot.require.product, "minMemoryMiB": slot.require.min_memory_mib},
    }


def diff_slots(before: PlacementMap | None, after: PlacementMap | None) -> list[SlotChange]:
    old = dict(before.by_index) if before is not None else {}
    new = dict(after.by_index) if after is not None else {}
    out: list[SlotChange] = []
    for index in sorted(old.keys() | new.keys()):
        a, b = old.get(index), new.get(index)
        if a is None:
            out.append(SlotChange(SlotChangeKind.ADDED, index, None, b))
        elif b is None:
            out.append(SlotChange(SlotChangeKind.REMOVED, index, a, None))
        elif (a.node, a.devices, a.count) != (b.node, b.devices, b.count):
            out.append(SlotChange(SlotChangeKind.MOVED, index, a, b))
        elif a.require != b.require:
            out.append(SlotChange(SlotChangeKind.CHANGED, index, a, b))
    return out


def diff_settings(before: PlacementMap, after: PlacementMap) -> list[str]:
    out = []
    for name, a, b in (
        ("sharing", before.sharing, after.sharing),
        ("indexing", before.indexing, after.indexing),
        ("envMode", before.env_mode, after.env_mode),
    ):
        if a != b:
            out.append(f"{name}: {a.value} -> {b.value}")
    if before.rollout != after.rollout:
        out.append(f"rollout: {before.rollout.describe()} -> {after.rollout.describe()}")
    return out


def plan(old: Snapshot, new: Snapshot) -> Plan:
    """The changes from `old` to `new`, every map in id order."""
    new_invalid = {bad.id: bad for bad in new.invalid if bad.id is not None}
    old_invalid = {bad.id for bad in old.invalid if bad.id is not None}
    # Files that no longer parse: the maps they held are invalid, not removed.
    broken_files = {bad.source: bad for bad in new.invalid if bad.id is None}
    reported: set[InvalidMap] = set()  # shown with their map
    changes: list[MapChange] = []
    for map_id in sorted(old.maps.keys() | new.maps.keys() | new_invalid.keys()):
        before, after = old.maps.get(map_id), new.maps.get(map_id)
        if before is not None and after is not None:
            slots = diff_slots(before.map, after.map)
            settings = diff_settings(before.map, after.map)
            if slots or settings:
                changes.append(
                    MapChange(
                        map_id, MapChangeKind.CHANGED, after.source, tuple(slots), tuple(settings)
                    )
                )
        elif after is not None:
            kind = MapChangeKind.FIXED if map_id in old_invalid else MapChangeKind.ADDED
            changes.append(
                MapChange(map_id, kind, after.source, tuple(diff_slots(None, after.map)))
            )
        elif before is not None:
            bad = new_invalid.get(map_id) or broken_files.get(before.source)
            if bad is not None:
                reported.add(bad)
            changes.append(_removed_or_invalid(map_id, before, bad))
        else:
            bad = new_invalid[map_id]
            reported.add(bad)
            kind = (
                MapChangeKind.STILL_INVALID if map_id in old_invalid else MapChangeKind.NEW_INVALID
            )
            changes.append(MapChange(map_id, kind, bad.source, diagnostics=bad.diagnostics))
    errors = [d for bad in new.invalid if bad not in reported for d in bad.diagnostics]
    errors.extend(new.cross)
    # A conflict is the fault of the map that was not there before: report it there.
    errors.extend(c.diagnostic() for c in new.conflicts(incumbents=old.maps.keys()))
    return Plan(
        tuple(changes),
        tuple(d for d in errors if d.severity == "error"),
        tuple(d for d in errors if d.severity != "error"),
        _count(changes),
    )


def _removed_or_invalid(map_id: MapId, before: SourceMap, bad: InvalidMap | None) -> MapChange:
    """A map valid in the old snapshot and not in the new one: invalid there (`bad`; its last
    valid version keeps serving), or removed."""
    if bad is not None:
        return MapChange(
            map_id,
            MapChangeKind.INVALID,
            bad.source,
            diagnostics=bad.diagnostics,
            serving_slots=len(before.map.slots),
        )
    return MapChange(
        map_id, MapChangeKind.REMOVED, before.source, tuple(diff_slots(before.map, None))
    )


def _count(changes: Iterable[MapChange]) -> dict[str, int]:
    maps = Counter(c.kind.value for c in changes)
    slots = Counter(s.kind.value for c in changes for s in c.slots)
    out = {f"maps{k.value.title().replace('-', '')}": maps[k.value] for k in MapChangeKind}
    out.update({f"slots{k.value.title()}": slots[k.value] for k in SlotChangeKind})
    return out


_MARK = {
    MapChangeKind.ADDED: "+",
    MapChangeKind.REMOVED: "-",
    MapChangeKind.CHANGED: "~",
    MapChangeKind.INVALID: "!",
    MapChangeKind.STILL_INVALID: "!",
    MapChangeKind.NEW_INVALID: "!",
    MapChangeKind.FIXED: "+",
}


def format_plan(result: Plan, old_label: str, new_label: str) -> str:
    """The plan as text: one block a map, then errors, then a summary line."""
    lines = [f"Comparing {old_label} -> {new_label}", ""]
    for change in result.changes:
        lines.extend(change_lines(change))
    if result.changes:
        lines.append("")
    if result.errors:
        lines.append(f"Errors in {new_label}:")
        lines.extend(f"    {d.format()}" for d in result.errors)
        lines.append("")
    if result.warnings:
        lines.append(f"Warnings in {new_label}:")
        lines.extend(f"    {d.format()}" for d in result.warnings)
        lines.append("")
    lines.append(summary(result))
    return "\n".join(lines)


def change_lines(change: MapChange) -> list[str]:
    """One map's block of the plan: its headline, then its settings, slots and errors."""
    lines = [f"{_MARK[change.kind]} map {change.id} ({change.source}): {_headline(change)}"]
    lines.extend(f"    {s}" for s in change.settings)
    lines.extend(f"    {s.describe()}" for s in change.slots)
    lines.extend(f"    {d.format()}" for d in change.diagnostics)
    return lines


def _headline(change: MapChange) -> str:
    n = len(change.slots)
    if change.kind is MapChangeKind.ADDED:
        return f"added, {n} slots"
    if change.kind is MapChangeKind.REMOVED:
        return f"removed, {n} slots"
    if change.kind is MapChangeKind.FIXED:
        return f"valid again, {n} slots"
    if change.kind is MapChangeKind.INVALID:
        return (
            f"turns invalid; the controller keeps serving its last valid version "
            f"({change.serving_slots} slots)"
        )
    if change.kind is MapChangeKind.STILL_INVALID:
        return "still invalid"
    if change.kind is MapChangeKind.NEW_INVALID:
        return "new map, invalid; the controller will not serve it"
    return "changed"


def summary(result: Plan) -> str:
    c = result.counts
    if not result.changes and not result.errors:
        return "No changes."
    maps = ", ".join(
        f"{c[key]} {label}"
        for key, label in (
            ("mapsAdded", "added"),
            ("mapsChanged", "changed"),
            ("mapsRemoved", "removed"),
            ("mapsFixed", "valid again"),
            ("mapsInvalid", "turning invalid"),
            ("mapsNewInvalid", "new and invalid"),
            ("mapsStillInvalid", "still invalid"),
        )
        if c.get(key)
    )
    slots = ", ".join(f"{c[f'slots{k.value.title()}']} {k.value}" for k in SlotChangeKind)
    text = f"Plan: maps {maps or 'unchanged'}; slots {slots}."
    return text if result.valid else text + " The new revision has errors."


@dataclass(frozen=True, slots=True)
class RunningPod:
    """A bound pod as the cluster shows it: which map and index it was placed by."""

    namespace: str
    name: str
    map: str
    index: int
    node: str = ""  # where it is bound
    devices: tuple[str, ...] = ()  # the GPU UUIDs its binding gave it


def _stays(pod: RunningPod, slot: DeclaredSlot | None, aliases: Mapping[str, str]) -> bool:
    """Whether the pod already holds what the slot now names: the same node and GPUs by UUID
    (a `count` pick or a spare written down as its devices moves nothing)."""
    if slot is None or not pod.devices or not slot.devices or not pod.node:
        return False
    if any(isinstance(d, int) for d in slot.devices):
        return False
    node = aliases.get(slot.node, slot.node)
    return node == pod.node and set(map(str, slot.devices)) == set(pod.devices)


@dataclass(frozen=True, slots=True)
class DriftingPod:
    pod: RunningPod
    reason: str  # what the Drifted condition will say: SlotMoved | SlotRemoved | MapDeleted
    change: str  # the slot change that causes it, as the plan prints it

    def describe(self) -> str:
        return f"{self.pod.namespace}/{self.pod.name} ({self.reason}): {self.change}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": f"{self.pod.namespace}/{self.pod.name}",
            "map": f"{self.pod.namespace}/{self.pod.map}",
            "index": self.pod.index,
            "reason": self.reason,
            "change": self.change,
        }


def drifting_pods(
    result: Plan, pods: Iterable[RunningPod], aliases: Mapping[str, str] | None = None
) -> list[DriftingPod]:
    """The running pods the planned change leaves where their map no longer puts them. A map
    that turns invalid keeps serving its last valid version: its pods do not drift, nor does a
    pod that already holds the node and GPUs its slot now names (`aliases`: logical name ->
    node)."""
    by_map: dict[tuple[str, str], list[RunningPod]] = {}
    for pod in pods:
        by_map.setdefault((pod.namespace, pod.map), []).append(pod)
    out: list[DriftingPod] = []
    for change in result.changes:
        running = by_map.get((change.id.key.namespace, change.id.key.name), [])
        if not running:
            continue
        if change.kind is MapChangeKind.REMOVED:
            out += [DriftingPod(p, "MapDeleted", f"map {change.id.key} removed") for p in running]
            continue
        if change.kind not in (MapChangeKind.CHANGED, MapChangeKind.FIXED):
            continue
        slots = {s.index: s for s in change.slots}
        for pod in running:
            slot = slots.get(pod.index)
            if slot is None or slot.kind in (SlotChangeKind.ADDED, SlotChangeKind.CHANGED):
                continue
            if _stays(pod, slot.after, aliases or {}):
                continue
            reason = "SlotRemoved" if slot.kind is SlotChangeKind.REMOVED else "SlotMoved"
            out.append(DriftingPod(pod, reason, slot.describe()))
    return sorted(out, key=lambda d: (d.pod.namespace, d.pod.name))
