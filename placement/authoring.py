"""Maps that gpuplace writes into a repository for review (`gpuplace import`, `freeze`, `move`):
what each command decides, and the edits that write it into the files a person committed.

The decisions are pure: they read the maps, the model the controller serves, the nodes'
inventories and what the running pods hold, and return slot edits (or new maps) with the reason
for each. `apply_slot_edits` writes slot edits into the files in place (placement/yamledit.py:
nothing outside the changed values moves). docs/authoring.md describes the commands.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from placement.errors import PlacementError
from placement.inventory import NodeInventory
from placement.maps import PlacementMap
from placement.model import Model
from placement.spares import serves_from_fallback
from placement.types import DeviceRef, GpuUuid, MapKey, NodeName
from placement.yamledit import (
    YamlEdit,
    flow_list,
    placement_documents,
    placement_entries,
    scalar,
)


@dataclass(frozen=True, slots=True)
class SlotEdit:
    """A change to one entry of a map: its node (None: unchanged), its devices (None: unchanged;
    written in place of `devices` or `count`), its spares (None: unchanged, (): removed)."""

    map: MapKey
    index: int
    why: str
    node: str | None = None
    devices: tuple[DeviceRef, ...] | None = None
    fallback: tuple[DeviceRef, ...] | None = None

    def describe(self) -> str:
        what = []
        if self.node is not None:
            what.append(f"node {self.node}")
        if self.devices is not None:
            what.append(f"devices {flow_list(self.devices)}")
        if self.fallback is not None:
            what.append(f"fallback {flow_list(self.fallback)}" if self.fallback else "no fallback")
        return f"{self.map} index {self.index}: {', '.join(what) or 'unchanged'} ({self.why})"


@dataclass(frozen=True, slots=True)
class Skipped:
    """A slot a command leaves as it is, and why."""

    map: MapKey
    index: int
    why: str

    def describe(self) -> str:
        return f"{self.map} index {self.index}: {self.why}"


@dataclass(frozen=True, slots=True)
class FileEdits:
    """The files a set of slot edits changes (path -> new text), and the edits it could not
    write (a legacy `map:` text, an entry not found)."""

    files: dict[str, str] = field(default_factory=dict)
    unwritten: tuple[Skipped, ...] = ()


def _devices_text(edit: YamlEdit, old: Node | None, values: Sequence[DeviceRef]) -> str:
    """`values` in the style of the list they replace: a block list stays a block list."""
    if isinstance(old, SequenceNode) and not old.flow_style and old.value:
        column = int(old.start_mark.column)
        return f"\n{' ' * column}".join(f"- {scalar(v)}" for v in values)
    return flow_list(values)


def _edit_entry(edit: YamlEdit, entry: Node, change: SlotEdit) -> str | None:
    """Writes `change` into the entry; why it cannot, or None."""
    if edit.get(entry, "mig") is not None and change.devices is not None:
        return "a `mig` entry: edit it by hand"
    if change.node is not None:
        edit.set_pair(entry, "node", scalar(change.node))
    if change.devices is not None:
        devices = edit.get(entry, "devices")
        if devices is not None:
            edit.replace_value(devices, _devices_text(edit, devices, change.devices))
        elif edit.pair(entry, "count") is not None:
            edit.replace_pair(entry, "count", "devices", flow_list(change.devices))
        else:
            edit.set_pair(entry, "devices", flow_list(change.devices), after="node")
    if change.fallback is not None:
        if change.fallback:
            old = edit.get(entry, "fallback")
            edit.set_pair(entry, "fallback", _devices_text(edit, old, change.fallback))
        else:
            edit.remove_pair(entry, "fallback")
    return None


def apply_slot_edits(files: Mapping[str, str], edits: Iterable[SlotEdit]) -> FileEdits:
    """Writes each edit into the file and entry that declare its slot (`files`: path -> text of
    the repository's YAML files), changing only the values it sets."""
    wanted: dict[tuple[MapKey, int], SlotEdit] = {(e.map, e.index): e for e in edits}
    out: dict[str, str] = {}
    unwritten: list[Skipped] = []
    found: set[tuple[MapKey, int]] = set()
    for path in sorted(files):
        text = files[path]
        if "PlacementMap" not in text:
            continue
        try:
            edit = YamlEdit(text, path)
        except PlacementError:
            continue  # an unreadable file declares nothing (validate and plan report it)
        for doc, namespace, name in placement_documents(edit):
            key = MapKey(namespace, name)
            mine = {i: e for (k, i), e in wanted.items() if k == key}
            if not mine:
                continue
            entries = placement_entries(edit, doc)
            for index, change in sorted(mine.items()):
                entry = entries.get(index)
                if entry is None:
                    if edit.get(doc, "spec", "map") is not None:
                        legacy = f"legacy `map:` text in {path}: edit its line by hand"
                        unwritten.append(Skipped(key, index, legacy))
                        found.add((key, index))
                    continue
                found.add((key, index))
                refused = _edit_entry(edit, entry, change)
                if refused is not None:
                    unwritten.append(Skipped(key, index, refused))
        if edit.changed:
            out[path] = edit.result()
    for key, index in sorted(wanted, key=lambda k: (str(k[0]), k[1])):
        if (key, index) not in found:
            unwritten.append(Skipped(key, index, "no file of the repository declares this slot"))
    return FileEdits(out, tuple(unwritten))


# -- freeze -----------------------------------------------------------------------------------


def freeze_edits(
    pmaps: Iterable[PlacementMap],
    model: Model,
    inventories: Mapping[NodeName, NodeInventory],
) -> tuple[list[SlotEdit], list[Skipped]]:
    """The `count` picks and the spares in use that the served model holds, as explicit devices
    (GPU UUIDs) of the entries that declare them; the slots left as they are, and why."""
    edits: list[SlotEdit] = []
    skipped: list[Skipped] = []
    for pmap in sorted(pmaps, key=lambda m: str(m.key)):
        cmap = model.maps.get(pmap.key)
        for slot in pmap.slots:
            if slot.count is None and not slot.fallback:
                continue
            served = cmap.slots.get(slot.index) if cmap is not None else None
            if served is None:
                skipped.append(Skipped(pmap.key, slot.index, "not in the served model"))
                continue
            if served.blocked or not served.devices:
                why = served.message or served.blocked or "no devices resolved"
                skipped.append(Skipped(pmap.key, slot.index, f"not served: {why}"))
                continue
            if slot.count is not None:
                if served.declared.count != slot.count:
                    skipped.append(
                        Skipped(
                            pmap.key,
                            slot.index,
                            f"the cluster serves another version of this entry ({served.declared})",
                        )
                    )
                    continue
                edits.append(
                    SlotEdit(
                        pmap.key,
                        slot.index,
                        f"count {slot.count} frozen: the controller picked these on {served.node}",
                        devices=tuple(GpuUuid(u) for u in served.devices),
                    )
                )
            elif serves_from_fallback(served):
                inventory = inventories.get(served.node)
                in_use = set(served.devices)

                def uuid_of(ref: DeviceRef, inv: NodeInventory | None = inventory) -> str:
                    found = inv.find(ref) if inv is not None else None
                    return found.uuid if found is not None else str(ref)

                spares = tuple(f for f in slot.fallback if uuid_of(f) not in in_use)
                edits.append(
                    SlotEdit(
                        pmap.key,
                        slot.index,
                        f"spares in use frozen: {served.message}",
                        devices=tuple(GpuUuid(u) for u in served.devices),
                        fallback=spares,
                    )
                )
    return edits, skipped


# -- import -----------------------------------------------------------------------------------

#: Workload kinds whose pods carry a rank of their own (a StatefulSet ordinal, an Indexed Job's
#: completion index, JobSet's, LeaderWorkerSet's or Kueue's): each becomes the slot of that index.
RANKED = "ranked"


@dataclass(frozen=True, slots=True)
class RunningGpuPod:
    """A running pod and the GPUs it holds now (resolved to UUIDs on its node)."""

    namespace: str
    name: str
    node: NodeName
    uuids: tuple[GpuUuid, ...]
    #: The workload that made it: (kind, name), the pod itself for a bare pod.
    workload_kind: str
    workload: str
    rank: int | None = None  # None: no rank (a Deployment's pod)
    rank_source: str = ""
    created: str = ""  # creationTimestamp, RFC 3339 (orders pods without a rank)
    #: How its GPUs were learned: "device plugin", "DRA (kubelet)", "DRA claim ns/name".
    source: str = ""


@dataclass(frozen=True, slots=True)
class ImportedSlot:
    index: int
    node: str  # as written: the node's logical name where it has one
    devices: tuple[GpuUuid, ...]
    pod: str
    source: str


@dataclass(frozen=True, slots=True)
class ImportedMap:
    key: MapKey
    workload_kind: str
    workload: str
    ranked: bool
    slots: tuple[ImportedSlot, ...]
    shared: bool = False

    def text(self) -> str:
        """The map as a file, with a header that says where each slot came from."""
        how = (
            "each pod's rank is its slot's index (indexing: auto)"
            if self.ranked
            else "its pods have no rank: slots in the order of the node and the lowest GPU index "
            "each pod holds, indexing: allocate (a replacement pod takes the lowest free slot, "
            "the one its predecessor freed: replace them one at a time, maxSurge 0)"
        )
        sources = sorted({s.source for s in self.slots})
        lines = [
            f"# Imported by `gpuplace import` from the running pods of {self.workload_kind} "
            f"{self.key.namespace}/{self.workload}:",
            f"# every slot is where its pod runs now; {how}.",
            f"# GPUs read from: {', '.join(sources)}.",
            "apiVersion: gpuplace.io/v1alpha1",
            "kind: PlacementMap",
            "metadata:",
            f"  name: {scalar(self.key.name)}",
            f"  namespace: {scalar(self.key.namespace)}",
            "spec:",
        ]
        if self.shared:
            lines.append("  sharing: shared  # its pods share GPUs with other pods now")
        lines.append(f"  indexing: {'auto' if self.ranked else 'allocate'}")
        lines.append("  placements:")
        for slot in self.slots:
            lines += [
                f"    - index: {slot.index}  # pod {slot.pod}",
                f"      node: {scalar(slot.node)}",
                f"      devices: {flow_list(slot.devices)}",
            ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class ImportResult:
    maps: tuple[ImportedMap, ...]
    skipped: tuple[str, ...] = ()


def _map_name(kind: str, workload: str, taken: set[str]) -> str:
    name = workload[:63]
    if name in taken:
        name = f"{workload[: 62 - len(kind)]}-{kind.lower()}"
    taken.add(name)
    return name


def import_maps(
    pods: Iterable[RunningGpuPod],
    logical: Mapping[NodeName, str],
    inventories: Mapping[NodeName, NodeInventory],
    existing: Iterable[MapKey] = (),
) -> ImportResult:
    """One map a workload that declares where each of its GPU pods runs now. A ranked pod's
    slot is its rank; pods without a rank get slots 0..n-1 by (node, lowest GPU index, name).
    GPUs held by several pods (time-slicing) make their maps shared. Maps that exist already
    are left alone (the pods are skipped and said so)."""
    by_workload: dict[tuple[str, str, str], list[RunningGpuPod]] = defaultdict(list)
    skipped: list[str] = []
    for pod in pods:
        if not pod.uuids:
            continue
        by_workload[(pod.namespace, pod.workload_kind, pod.workload)].append(pod)
    holders: dict[tuple[NodeName, str], set[str]] = defaultdict(set)
    for group in by_workload.values():
        for pod in group:
            for uuid in pod.uuids:
                holders[(pod.node, uuid)].add(f"{pod.namespace}/{pod.name}")
    shared_gpus = {k for k, v in holders.items() if len(v) > 1}
    existing_keys = set(existing)
    taken: dict[str, set[str]] = defaultdict(set)
    for key in existing_keys:
        taken[key.namespace].add(key.name)
    maps: list[ImportedMap] = []
    for (namespace, kind, workload), group in sorted(by_workload.items()):
        key = MapKey(namespace, workload[:63])
        if key in existing_keys:
            skipped.append(
                f"{kind} {namespace}/{workload}: map {key} exists already in the repository"
            )
            continue
        name = _map_name(kind, workload, taken[namespace])
        ranked = all(p.rank is not None for p in group)

        def gpu_order(pod: RunningGpuPod) -> tuple[str, int, str]:
            inventory = inventories.get(pod.node)
            indices = [
                d.index
                for u in pod.uuids
                if inventory is not None and (d := inventory.by_uuid.get(u)) is not None
            ]
            return (pod.node, min(indices, default=1 << 30), pod.name)

        slots = (
            _ranked_slots(group, logical, skipped)
            if ranked
            else [_slot(i, p, logical) for i, p in enumerate(sorted(group, key=gpu_order))]
        )
        shared = any((p.node, u) in shared_gpus for p in group for u in p.uuids)
        maps.append(
            ImportedMap(MapKey(namespace, name), kind, workload, ranked, tuple(slots), shared)
        )
    return ImportResult(tuple(maps), tuple(skipped))


def _ranked_slots(
    group: Iterable[RunningGpuPod], logical: Mapping[NodeName, str], skipped: list[str]
) -> list[ImportedSlot]:
    """A slot a rank; of two pods with one rank (one on its way out), the older keeps it."""
    seen: dict[int, RunningGpuPod] = {}
    slots: list[ImportedSlot] = []
    for pod in sorted(group, key=lambda p: (p.rank or 0, p.created, p.name)):
        assert pod.rank is not None
        if pod.rank in seen:
            skipped.append(
                f"pod {pod.namespace}/{pod.name}: rank {pod.rank} is pod "
                f"{seen[pod.rank].name}'s already"
            )
            continue
        seen[pod.rank] = pod
        slots.append(_slot(pod.rank, pod, logical))
    return slots


def _slot(index: int, pod: RunningGpuPod, logical: Mapping[NodeName, str]) -> ImportedSlot:
    return ImportedSlot(index, logical.get(pod.node, pod.node), pod.uuids, pod.name, pod.source)


# -- the repository's layout -------------------------------------------------------------------

SOURCE_FILE_ANNOTATION = "gpuplace.io/source-file"


def generator_lines(key: MapKey, file: str) -> list[str]:
    """A configMapGenerator entry for a map file (relative to the kustomization), as
    examples/gitops lays them out."""
    return [
        f"name: {scalar(key.name)}",
        f"namespace: {scalar(key.namespace)}",
        "files:",
        f"  - {scalar('placement.yaml=' + file)}",
        "options:",
        "  annotations:",
        f"    {SOURCE_FILE_ANNOTATION}: {scalar(file)}",
    ]


def maps_folder(kustomization: str, source: str) -> str:
    """Where the kustomization's maps live (relative to it): the folder of its first generated
    map file, else `maps`."""
    edit = YamlEdit(kustomization, source)
    for doc in edit.documents:
        generators = edit.get(doc, "configMapGenerator")
        if not isinstance(generators, SequenceNode):
            continue
        for generator in generators.value:
            files = edit.get(generator, "files")
            if not isinstance(files, SequenceNode):
                continue
            for item in files.value:
                value = str(getattr(item, "value", ""))
                _, eq, path = value.partition("=")
                return posixpath.dirname(path if eq else value)
    return "maps"


def listed_resources(kustomization: str, source: str) -> tuple[list[str], bool]:
    """The entries of the kustomization's `resources:` block list, and whether it has any
    configMapGenerator entry: a kustomization that lists its maps as resources and generates
    none serves them as PlacementMap custom resources (after `gpuplace migrate`)."""
    edit = YamlEdit(kustomization, source)
    listed: list[str] = []
    generates = False
    for doc in edit.documents:
        generators = edit.get(doc, "configMapGenerator")
        generates = generates or (isinstance(generators, SequenceNode) and bool(generators.value))
        resources = edit.get(doc, "resources")
        if isinstance(resources, SequenceNode):
            listed += [str(getattr(item, "value", "")) for item in resources.value]
    return listed, generates


def add_resources(kustomization: str, source: str, files: Sequence[str]) -> str:
    """The kustomization with each file appended to its `resources:` block list (which
    `listed_resources` found); every other byte as it was."""
    edit = YamlEdit(kustomization, source)
    for doc in edit.documents:
        resources = edit.get(doc, "resources")
        if isinstance(resources, SequenceNode) and resources.value:
            if resources.flow_style:
                raise ValueError(f"{source}: resources is a flow list ([...]); write it as a block")
            for file in files:
                edit.append_item(resources, [file])
            return edit.result()
    raise ValueError(f"{source}: no resources list to add the maps to")


NEW_KUSTOMIZATION = """\
# Written by `gpuplace import`. ArgoCD builds this directory with kustomize: each map file becomes
# one source ConfigMap, named and namespaced like the map, with the file under placement.yaml.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization

generatorOptions:
  # The ConfigMap's name must stay the map's name: no content-hash suffix.
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"
"""


def add_generators(kustomization: str, source: str, entries: Sequence[tuple[MapKey, str]]) -> str:
    """The kustomization with a configMapGenerator entry for each (map, file), after its
    existing ones; every other byte as it was."""
    if not entries:
        return kustomization
    edit = YamlEdit(kustomization, source)
    doc = edit.documents[0] if edit.documents else None
    generators = edit.get(doc, "configMapGenerator") if doc is not None else None
    if isinstance(generators, SequenceNode) and generators.value:
        for key, file in entries:
            edit.append_item(generators, generator_lines(key, file))
        return edit.result()
    block = ["configMapGenerator:"]
    for key, file in entries:
        lines = generator_lines(key, file)
        block += [f"  - {lines[0]}", *(f"    {line}" for line in lines[1:])]
    empty_list = isinstance(generators, SequenceNode) and not generators.value
    if empty_list or (isinstance(generators, ScalarNode) and generators.value in ("", "null", "~")):
        # `configMapGenerator:` (or `[]`) with nothing in it yet: the entries go under the key.
        assert doc is not None
        edit.replace_pair_text(doc, "configMapGenerator", "\n".join(block))
        return edit.result()
    if generators is not None or (doc is not None and not isinstance(doc, MappingNode)):
        raise ValueError(f"{source}: configMapGenerator is not a list of entries")
    tail = "" if kustomization.endswith("\n") or not kustomization else "\n"
    return kustomization + tail + "\n".join(block) + "\n"
