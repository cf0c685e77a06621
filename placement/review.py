"""The plan of a pull request on a map repository, cluster by cluster (`gpuplace plan`).

A map repository holds one directory per cluster (each with a kustomization, as the ApplicationSet
generates one Application a directory). For each, the maps of the base and of the head revision
are compared (placement/diff.py) and the head is checked the way the cluster will check it: every
map validated, within the grants of the PlacementPolicy committed in that directory, and its
devices against the inventory snapshot committed there (placement/inventorycheck.py). What a live
cluster adds (pods that would drift, slots that would wait) is attached by the caller. Pure.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from placement.diff import DriftingPod, MapChangeKind, Plan, SlotChangeKind, plan
from placement.errors import Diagnostic, Location, PlacementError
from placement.grants import check_map, is_policy_document, policy_from_document, resolve
from placement.inventorycheck import (
    INVENTORY_SNAPSHOT,
    WaitingSlot,
    by_node,
    cells_from_json,
    check_devices,
)
from placement.kustomize import KUSTOMIZATION_NAMES
from placement.maps import PlacementMap
from placement.snapshot import Snapshot, load_snapshot, scope_of
from placement.yamlsource import load_documents

_INVALID = (MapChangeKind.INVALID, MapChangeKind.STILL_INVALID, MapChangeKind.NEW_INVALID)
#: Nodes a gang's line names before it counts the rest.
_GANG_NODES = 4


@dataclass(frozen=True, slots=True)
class GangPlan:
    """A gang map the change touches: which slots bind together (all of them, or none)."""

    map: str  # namespace/name
    source: str
    slots: tuple[tuple[int, str], ...]  # (index, node) in index order
    timeout_seconds: int

    @classmethod
    def of(cls, pmap: PlacementMap, source: str) -> GangPlan:
        assert pmap.gang is not None
        slots = tuple(sorted((s.index, s.node) for s in pmap.slots))
        return cls(str(pmap.key), source, slots, pmap.gang.timeout_seconds)

    def describe(self) -> str:
        """`ml/train: slots 0-3 bind together or none, on 2 nodes (gpu-1: 0, 2; gpu-2: 1, 3);
        stuck after 600s`."""
        by_node: dict[str, list[int]] = {}
        for index, node in self.slots:
            by_node.setdefault(node, []).append(index)
        nodes = [f"{node}: {index_ranges(found)}" for node, found in by_node.items()]
        if len(nodes) > _GANG_NODES:
            nodes = [*nodes[:_GANG_NODES], f"and {len(nodes) - _GANG_NODES} more"]
        count = len(by_node)
        return (
            f"{self.map}: slots {index_ranges([i for i, _ in self.slots])} bind together or "
            f"none, on {count} node{'s' if count != 1 else ''} ({'; '.join(nodes)}); "
            f"reported stuck after {self.timeout_seconds}s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "map": self.map,
            "source": self.source,
            "slots": [{"index": i, "node": n} for i, n in self.slots],
            "timeoutSeconds": self.timeout_seconds,
        }


def index_ranges(indices: Iterable[int]) -> str:
    """`0-3, 6, 8-9`: sorted indices with their runs joined."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """One cluster directory: its diff, the head's checks, and (live) its pods and GPUs."""

    directory: str  # repository-relative; "" for maps outside any kustomization
    plan: Plan
    checks: tuple[Diagnostic, ...] = ()  # grants, inventory snapshot, policy (head revision)
    inventory: str = ""  # the snapshot checked against, "" when the directory has none
    policy: str = ""  # the PlacementPolicy's file, "" when none is committed
    live: bool = False  # whether a cluster was asked
    drifting: tuple[DriftingPod, ...] = ()
    waiting: tuple[WaitingSlot, ...] = ()
    live_error: str = ""  # why the cluster could not be read
    gangs: tuple[GangPlan, ...] = ()  # the gang maps the change adds or changes (head revision)

    @property
    def name(self) -> str:
        """The cluster's name as the ApplicationSet gives it: the directory's base name."""
        return posixpath.basename(self.directory) or "(no kustomization)"

    @property
    def errors(self) -> list[Diagnostic]:
        out = list(self.plan.errors)
        out += [d for c in self.plan.changes if c.kind in _INVALID for d in c.diagnostics]
        out += [d for d in self.checks if d.severity == "error"]
        return [d for d in out if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return list(self.plan.warnings) + [d for d in self.checks if d.severity != "error"]

    @property
    def changed(self) -> bool:
        return bool(self.plan.changes)

    @property
    def failed(self) -> bool:
        return bool(self.errors or self.live_error)

    def to_json(self) -> dict[str, Any]:
        out = {
            "cluster": self.name,
            "directory": self.directory,
            "changed": self.changed,
            "inventory": self.inventory or None,
            "policy": self.policy or None,
            **self.plan.to_json(),
            "errors": [d.to_json() for d in self.errors],
            "warnings": [d.to_json() for d in self.warnings],
            "gangs": [g.to_json() for g in self.gangs],
        }
        out["valid"] = not self.failed
        if self.live:
            out["live"] = {
                "error": self.live_error or None,
                "drifting": [d.to_json() for d in self.drifting],
                "waiting": [w.to_json() for w in self.waiting],
            }
        return out


@dataclass(frozen=True, slots=True)
class Revision:
    """A side of the comparison, as a reader shows it: `main (1a2b3c4d5e6f)`."""

    rev: str | None  # None: the working tree
    commit: str | None = None

    def __str__(self) -> str:
        if self.rev is None:
            return "working tree"
        return f"{self.rev} ({self.commit})" if self.commit else self.rev

    def to_json(self) -> dict[str, Any]:
        return {"rev": self.rev, "commit": self.commit}


@dataclass(frozen=True, slots=True)
class RepoPlan:
    base: Revision
    head: Revision
    clusters: tuple[ClusterPlan, ...]
    #: Problems not of one cluster (a revision that cannot be read).
    errors: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any(c.changed for c in self.clusters)

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(c.failed for c in self.clusters)

    def exit_code(self, detailed: bool) -> int:
        """1 on errors; with `detailed`, 2 when something changes; else 0 (as terraform plan
        -detailed-exitcode)."""
        if self.failed:
            return 1
        return 2 if detailed and self.changed else 0

    def summary(self) -> dict[str, int]:
        """The counts a reviewer reads first."""
        clusters = self.clusters
        slots = [s for c in clusters for m in c.plan.changes for s in m.slots]
        return {
            "clusters": len(clusters),
            "clustersChanged": sum(c.changed for c in clusters),
            "mapsChanged": sum(len(c.plan.changes) for c in clusters),
            "slotsAdded": sum(s.kind is SlotChangeKind.ADDED for s in slots),
            "slotsRemoved": sum(s.kind is SlotChangeKind.REMOVED for s in slots),
            "slotsMoved": sum(s.kind is SlotChangeKind.MOVED for s in slots),
            "podsDrifting": sum(len(c.drifting) for c in clusters),
            "slotsWaiting": sum(len(c.waiting) for c in clusters),
            "errors": len(self.errors) + sum(len(c.errors) + bool(c.live_error) for c in clusters),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base.to_json(),
            "head": self.head.to_json(),
            "changed": self.changed,
            "valid": not self.failed,
            "summary": self.summary(),
            "errors": list(self.errors),
            "clusters": [c.to_json() for c in self.clusters],
        }


def cluster_directories(files: Iterable[str], patterns: Sequence[str] = ()) -> list[str]:
    """The directories holding a kustomization (each an Application of the ApplicationSet),
    those matching one of `patterns` (globs like `clusters/*`) when any is given."""
    out = set()
    for path in files:
        pure = PurePosixPath(path)
        if pure.name in KUSTOMIZATION_NAMES:
            directory = pure.parent.as_posix()
            out.add("" if directory == "." else directory)
    if patterns:
        out = {d for d in out if any(fnmatch.fnmatchcase(d, p) for p in patterns)}
    return sorted(out)


def split(files: Mapping[str, str], directories: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each file under the nearest of `directories` (files under none are left out)."""
    roots = frozenset(d or "." for d in directories)
    out: dict[str, dict[str, str]] = {d: {} for d in directories}
    for path, text in files.items():
        scope = scope_of(path, roots)
        if scope in out and (scope or "." in roots):
            out[scope][path] = text
    return out


def plan_cluster(
    directory: str,
    base: Mapping[str, str],
    head: Mapping[str, str],
    inventory: str | None = None,
    deny_by_default: bool = False,
) -> ClusterPlan:
    """The plan of one cluster directory: `base` and `head` are its files (path -> text) at each
    revision, `inventory` the text of its inventory snapshot at the head, if committed."""
    new = load_snapshot(head)
    result = plan(load_snapshot(base), new)
    checks, policy = _grant_checks(new, deny_by_default)
    inventory_path = posixpath.join(directory, INVENTORY_SNAPSHOT) if inventory is not None else ""
    if inventory is not None:
        cells = cells_from_json(inventory, inventory_path)
        if isinstance(cells, Diagnostic):
            checks.append(cells)
        else:
            gpus = by_node(cells)
            for entry in sorted(new.maps.values(), key=lambda m: m.id):
                checks += check_devices(entry.map, gpus, entry.source)
    checks.sort(key=lambda d: (d.location.source, d.location.line, d.location.column))
    touched = {c.id for c in result.changes}
    gangs = tuple(
        GangPlan.of(entry.map, entry.source)
        for entry in sorted(new.maps.values(), key=lambda m: m.id)
        if entry.map.gang is not None and entry.id in touched
    )
    return ClusterPlan(directory, result, tuple(checks), inventory_path, policy, gangs=gangs)


def _grant_checks(snapshot: Snapshot, deny_by_default: bool) -> tuple[list[Diagnostic], str]:
    """Every map of `snapshot` outside the grants of the PlacementPolicy among its files (an
    install without a policy allows everything), and the policy's file."""
    found = []
    problems: list[Diagnostic] = []
    for path in sorted(snapshot.files):
        text = snapshot.files[path]
        if "PlacementPolicy" not in text:
            continue
        try:
            documents = list(load_documents(text, path))
        except PlacementError:
            continue  # reported with the maps' files
        for doc in documents:
            if is_policy_document(doc.value):
                try:
                    found.append(policy_from_document(doc))
                except PlacementError as exc:
                    problems.extend(exc.diagnostics)
    if len(found) > 1:
        where = Location(found[1].source, 1, 1)
        problems.append(
            Diagnostic(
                where,
                f"a second PlacementPolicy (the first is in {found[0].source}); a cluster has one",
            )
        )
    if not found or problems:
        return problems, found[0].source if found else ""
    view = resolve(found[0], deny_by_default, None)
    for entry in sorted(snapshot.maps.values(), key=lambda m: m.id):
        problems += check_map(view, entry.map)
    return problems, found[0].source


def with_live(
    cluster: ClusterPlan,
    drifting: Iterable[DriftingPod] = (),
    waiting: Iterable[WaitingSlot] = (),
    error: str = "",
) -> ClusterPlan:
    """`cluster` with what its live cluster says."""
    return replace(
        cluster, live=True, drifting=tuple(drifting), waiting=tuple(waiting), live_error=error
    )
