"""Every map in a tree of YAML files (a GitOps repo at one revision), validated and checked together.

The caller reads the files (from disk, or from a git revision) and passes their text; everything
here is pure. Maps are grouped by cluster: the nearest enclosing directory with a kustomization
file, as ArgoCD syncs one such directory into one cluster. Cross-map checks (a map declared twice,
two exclusive slots claiming one GPU) apply within a cluster only, so `clusters/dev` and
`clusters/prod` may reuse names.

A file holds maps as PlacementMap documents (what a kustomization generates ConfigMaps from, or
applies as custom resources), or as the ConfigMaps `gpuplace render` prints (placement/configmapform.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from placement.configmapform import check_identity, configmap_key, is_map_configmap, unwrap
from placement.conflicts import Conflict, find_conflicts, find_duplicate_maps
from placement.errors import Diagnostic, Location, PlacementError
from placement.kustomize import KUSTOMIZATION_NAMES, check_kustomization
from placement.maps import PlacementMap
from placement.schema import is_placement_document
from placement.types import KIND, MapKey
from placement.validate import document_to_map
from placement.yamlsource import Document, load_documents

YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, order=True, slots=True)
class MapId:
    """A map within its cluster directory ("" when the files have no kustomization)."""

    scope: str
    key: MapKey

    def __str__(self) -> str:
        return f"{self.scope}: {self.key}" if self.scope else str(self.key)


class FileForm(StrEnum):
    """How a file holds a map: the PlacementMap document itself, or a ConfigMap around it."""

    DOCUMENT = "document"
    CONFIGMAP = "configmap"


@dataclass(frozen=True, slots=True)
class SourceMap:
    id: MapId
    map: PlacementMap
    source: str  # file path as given
    location: Location  # of metadata.name
    #: The text a source ConfigMap holds: the file (a document), or its data.placement.yaml.
    text: str = field(default="", compare=False)
    #: The PlacementMap document as written (what the custom resource form applies).
    document: Mapping[str, Any] = field(default_factory=dict, compare=False)
    form: FileForm = FileForm.DOCUMENT


@dataclass(frozen=True, slots=True)
class InvalidMap:
    """A document meant to be a PlacementMap that does not validate, or a file that is not YAML.
    `id` is known when the document names itself well enough (metadata.name and namespace)."""

    source: str
    id: MapId | None
    diagnostics: tuple[Diagnostic, ...]


@dataclass(slots=True)
class Snapshot:
    files: dict[str, str]
    maps: dict[MapId, SourceMap] = field(default_factory=dict)
    invalid: list[InvalidMap] = field(default_factory=list)
    #: Problems between maps or with the GitOps layout (duplicates, kustomizations).
    cross: list[Diagnostic] = field(default_factory=list)
    #: Devices claimed by two maps of one cluster, in key order.
    clashes: list[Conflict] = field(default_factory=list)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        out = [d for bad in self.invalid for d in bad.diagnostics]
        out.extend(w for good in self.maps.values() for w in good.map.warnings)
        out.extend(self.cross)
        out.extend(c.diagnostic() for c in self.clashes)
        return out

    def conflicts(self, incumbents: Collection[MapId] = ()) -> list[Conflict]:
        """The clashes, each reported at the map that is not among `incumbents` where one is."""
        out: list[Conflict] = []
        for scope in sorted({m.scope for m in self.maps}):
            maps = [m.map for m in self.maps.values() if m.id.scope == scope]
            first = {i.key for i in incumbents if i.scope == scope}
            out.extend(find_conflicts(maps, first))
        return out

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def maps_in(self, source: str) -> list[SourceMap]:
        return [m for m in self.maps.values() if m.source == source]


def is_yaml_path(path: str) -> bool:
    return path.endswith(YAML_SUFFIXES) or PurePosixPath(path).name in KUSTOMIZATION_NAMES


def scope_of(path: str, roots: frozenset[str]) -> str:
    """The nearest directory of `path` (itself excluded) that is in `roots`, else ""."""
    for parent in PurePosixPath(path).parents:
        text = parent.as_posix()
        if text in roots:
            return "" if text == "." else text
    return ""


def load_snapshot(files: Mapping[str, str]) -> Snapshot:
    """Validates every PlacementMap in `files` (path -> text; paths use '/'), checks the maps of
    each cluster together, and checks each kustomization that generates their ConfigMaps."""
    snapshot = Snapshot(dict(files))
    roots = frozenset(
        PurePosixPath(p).parent.as_posix()
        for p in files
        if PurePosixPath(p).name in KUSTOMIZATION_NAMES
    )
    found: dict[str, list[SourceMap]] = defaultdict(list)
    for path in sorted(files):
        if PurePosixPath(path).name in KUSTOMIZATION_NAMES:
            continue
        scope = scope_of(path, roots)
        for item in _load_file(path, files[path], scope):
            if isinstance(item, InvalidMap):
                snapshot.invalid.append(item)
            elif isinstance(item, Diagnostic):
                snapshot.cross.append(item)
            else:
                found[scope].append(item)
    for scope in sorted(found):
        entries = found[scope]
        duplicates = find_duplicate_maps((m.map, m.location) for m in entries)
        snapshot.cross.extend(duplicates)
        for entry in entries:
            snapshot.maps.setdefault(entry.id, entry)
    snapshot.clashes = snapshot.conflicts()
    _check_kustomizations(snapshot, found)
    return snapshot


def map_files(entries: Iterable[SourceMap]) -> dict[str, list[PlacementMap]]:
    """Map file -> its maps, for the files that hold PlacementMap documents: what a
    kustomization serves (a file of rendered ConfigMaps is a resource like any other)."""
    out: dict[str, list[PlacementMap]] = defaultdict(list)
    for entry in entries:
        if entry.form is FileForm.DOCUMENT:
            out[entry.source].append(entry.map)
    return out


def _check_kustomizations(snapshot: Snapshot, found: Mapping[str, list[SourceMap]]) -> None:
    maps_by_file = map_files(e for entries in found.values() for e in entries)
    for path in sorted(snapshot.files):
        if PurePosixPath(path).name in KUSTOMIZATION_NAMES:
            directory = PurePosixPath(path).parent.as_posix()
            scope = "" if directory == "." else directory
            in_scope = {m.source for m in found.get(scope, ()) if m.form is FileForm.DOCUMENT}
            text = snapshot.files[path]
            snapshot.cross.extend(check_kustomization(path, text, maps_by_file, in_scope))


def _load_file(path: str, text: str, scope: str) -> Iterator[SourceMap | InvalidMap | Diagnostic]:
    try:
        documents = list(load_documents(text, path))
    except PlacementError as exc:
        diagnostics = tuple(exc.diagnostics)
        if KIND not in text:
            # Not YAML and no sign of a map (a Helm template, say): worth a word, not a failure.
            diagnostics = tuple(
                Diagnostic(
                    d.location,
                    f"skipped, not YAML: {d.message}",
                    "warning",
                    "a PlacementMap file must be plain YAML",
                )
                for d in diagnostics
            )
        yield InvalidMap(path, None, diagnostics)
        return
    for doc in documents:
        if is_map_configmap(doc.value):
            yield from _load_configmap(path, doc, scope)
            continue
        if not is_placement_document(doc.value):
            continue
        key = _claimed_key(doc.value)
        map_id = MapId(scope, key) if key is not None else None
        try:
            pmap = document_to_map(doc)
        except PlacementError as exc:
            yield InvalidMap(path, map_id, tuple(exc.diagnostics))
            continue
        yield SourceMap(MapId(scope, pmap.key), pmap, path, _name_location(doc), text, doc.value)


def _load_configmap(
    path: str, doc: Document, scope: str
) -> Iterator[SourceMap | InvalidMap | Diagnostic]:
    """The map of a ConfigMap document, checked as the controller reads a source ConfigMap."""
    key = configmap_key(doc.value)
    map_id = MapId(scope, key) if key is not None else None
    try:
        inner = unwrap(doc)
        if inner.errors or inner.document is None:
            raise PlacementError(tuple(inner.errors))
        pmap = document_to_map(inner.document)
        misnamed = check_identity(doc, pmap.key)
        if misnamed is not None:
            raise PlacementError((misnamed,))
    except PlacementError as exc:
        yield InvalidMap(path, map_id, tuple(exc.diagnostics))
        return
    yield from inner.warnings
    yield SourceMap(
        MapId(scope, pmap.key),
        pmap,
        path,
        _name_location(inner.document),
        inner.text,
        inner.document.value,
        FileForm.CONFIGMAP,
    )


def _claimed_key(value: Any) -> MapKey | None:
    """The map a document means to be, read leniently from an invalid document."""
    metadata = value.get("metadata") if isinstance(value, dict) else None
    if not isinstance(metadata, dict):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if isinstance(name, str) and isinstance(namespace, str) and name and namespace:
        return MapKey(namespace, name)
    return None


def _name_location(doc: Document) -> Location:
    loc = doc.locate(("metadata", "name"))
    return Location(loc.source, loc.line, loc.column)
