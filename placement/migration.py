"""Planning `gpuplace migrate`: a kustomization that generates map ConfigMaps, rewritten to apply
the map files as PlacementMap custom resources.

The map files stay as they are; the kustomization lists them under `resources:` instead of
generating a ConfigMap from each, records their files (`buildMetadata: [originAnnotations]`,
read by the controller as the maps' provenance), and loses what only concerned the map
ConfigMaps: their generator entries, the generator options no other generator needs, and the
patches that target them. Pure: the caller reads and writes the files.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from placement.annotations import PLACEMENT_MAP_LABEL, SOURCE_FILE_ANNOTATION
from placement.errors import Diagnostic, Location, PlacementError
from placement.kustomize import ORIGIN_ANNOTATIONS, check_kustomization, generator_files
from placement.maps import PlacementMap
from placement.types import MapKey
from placement.yamlsource import Document, Path, load_documents

#: Generator fields that add content beside the map file: the ConfigMap would not be the map alone.
_OTHER_CONTENT = ("literals", "envs", "env")
#: Patch lists of a kustomization, old and new spellings.
_PATCH_FIELDS = ("patches", "patchesStrategicMerge", "patchesJson6902")


@dataclass(frozen=True, slots=True)
class MovedMap:
    key: MapKey
    file: str  # as the kustomization names it, relative to its directory


@dataclass(slots=True)
class Migration:
    """The new kustomization and what changed, for the summary."""

    kustomization: dict[str, Any]
    moved: list[MovedMap] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # what was removed, one line each
    notes: list[str] = field(default_factory=list)  # what the user should look at

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.dropped)


def plan_migration(
    path: str,
    text: str,
    maps_by_file: Mapping[str, Sequence[PlacementMap]],
    files: Mapping[str, str] | None = None,
) -> Migration:
    """The migration of the kustomization at `path` (its `text`); `maps_by_file` are the valid
    map files (path -> maps) and `files` every file of the directory (patch files are read from
    it). Raises PlacementError, located in the kustomization, when it cannot be converted."""
    planner = _Planner(path, _kustomization(path, text), maps_by_file, files or {})
    planner.plan()
    if planner.refusals:
        raise PlacementError(tuple(planner.refusals))
    migration = planner.migration
    if migration.changed:
        if text.startswith("#"):
            migration.notes.append(
                "the leading comments are kept as written: check that they still describe it"
            )
        _verify(path, kustomization_text(migration, text), maps_by_file)
    return migration


def _verify(path: str, result: str, maps_by_file: Mapping[str, Sequence[PlacementMap]]) -> None:
    """The converted kustomization must pass what `gpuplace validate` checks: a failure here is
    a bug of this module, reported rather than written."""
    wrong = [d for d in check_kustomization(path, result, maps_by_file) if d.severity == "error"]
    if wrong:
        raise PlacementError.single(
            Location(path, 1, 1),
            f"the converted kustomization would not pass validation: {wrong[0].format()}",
        )


def _kustomization(path: str, text: str) -> Document:
    documents = list(load_documents(text, path))
    if len(documents) != 1 or not isinstance(documents[0].value, dict):
        raise PlacementError.single(
            Location(path, 1, 1), "a kustomization must be one YAML mapping"
        )
    return documents[0]


class _Planner:
    def __init__(
        self,
        path: str,
        doc: Document,
        maps_by_file: Mapping[str, Sequence[PlacementMap]],
        files: Mapping[str, str],
    ) -> None:
        self.path = path
        self.doc = doc
        self.base = posixpath.dirname(path)
        self.maps_by_file = maps_by_file
        self.files = files
        self.old: dict[str, Any] = doc.value
        self.migration = Migration(dict(self.old))
        self.refusals: list[Diagnostic] = []

    def resolve(self, relative: str) -> str:
        return posixpath.normpath(posixpath.join(self.base, relative))

    def refuse(self, at: Path, message: str, hint: str = "") -> None:
        self.refusals.append(Diagnostic(self.doc.locate(at), message, hint=hint))

    def plan(self) -> None:
        self.move_generated_maps()
        if not self.migration.moved:
            return
        for option in ("namePrefix", "nameSuffix"):
            if self.old.get(option):
                self.refuse(
                    (option,),
                    f"kustomize would rename the PlacementMaps with {option}; pods name their "
                    "map by metadata.name",
                    hint=f"drop {option} first",
                )
        self.list_resources()
        self.record_origins()
        self.trim_generator_options()
        self.drop_map_patches()

    # -- generator entries -> resources ---------------------------------------------------------
    def move_generated_maps(self) -> None:
        generators = self.old.get("configMapGenerator")
        if not isinstance(generators, list):
            return
        kept: list[Any] = []
        for i, generator in enumerate(generators):
            moved = self.map_of(i, generator) if isinstance(generator, dict) else None
            if moved is None:
                kept.append(generator)
                continue
            self.migration.moved.append(moved)
            self.migration.dropped.append(
                f"configMapGenerator entry {generator.get('name')} (ConfigMap {moved.key})"
            )
            self.note_lost_options(generator, moved)
        if kept:
            self.migration.kustomization["configMapGenerator"] = kept
        else:
            del self.migration.kustomization["configMapGenerator"]

    def map_of(self, i: int, generator: dict[str, Any]) -> MovedMap | None:
        """The map a generator entry makes a ConfigMap of; None for other entries."""
        entries = generator_files(generator)
        maps = [(rel, self.maps_by_file.get(self.resolve(rel), ())) for _, _, rel in entries]
        found = [(rel, m) for rel, m in maps if m]
        if not found:
            return None
        relative, held = found[0]
        name = generator.get("name")
        behavior = generator.get("behavior", "create")
        if behavior != "create":
            self.refuse(
                ("configMapGenerator", i, "behavior"),
                f"ConfigMap {generator.get('name')} is {behavior}d into a base's ConfigMap; "
                "its map file alone is not the map",
                hint="migrate the base's kustomization, then drop this entry by hand",
            )
            return None
        if len(entries) != 1 or len(held) != 1 or any(k in generator for k in _OTHER_CONTENT):
            self.refuse(
                ("configMapGenerator", i),
                f"ConfigMap {name} holds more than the one map of {relative}",
                hint="give each map its own file and configMapGenerator entry first",
            )
            return None
        key = held[0].key
        top = self.old.get("namespace")
        namespace = top if top is not None else generator.get("namespace", key.namespace)
        if name != key.name or namespace != key.namespace:
            moved_by_top = top is not None and top != key.namespace
            self.refuse(
                ("namespace",) if moved_by_top else ("configMapGenerator", i),
                f"ConfigMap {namespace}/{name} holds map {key} ({relative}): as a PlacementMap "
                f"it would be {key}",
                hint="make the ConfigMap's name and namespace the map's first (gpuplace validate)",
            )
            return None
        return MovedMap(key, relative)

    def note_lost_options(self, generator: dict[str, Any], moved: MovedMap) -> None:
        options = generator.get("options")
        if not isinstance(options, dict):
            return
        for kind in ("labels", "annotations"):
            values = options.get(kind)
            names = sorted(
                k
                for k in (values if isinstance(values, dict) else {})
                if k not in (PLACEMENT_MAP_LABEL, SOURCE_FILE_ANNOTATION)
            )
            if names:
                self.migration.notes.append(
                    f"the {kind} {', '.join(names)} of ConfigMap {moved.key} are not carried "
                    f"over: add them to metadata.{kind} in {moved.file} if still wanted"
                )

    def list_resources(self) -> None:
        resources = self.old.get("resources")
        listed = list(resources) if isinstance(resources, list) else []
        present = {self.resolve(r) for r in listed if isinstance(r, str)}
        for moved in self.migration.moved:
            if self.resolve(moved.file) not in present:
                listed.append(moved.file)
                present.add(self.resolve(moved.file))
        self.set_early("resources", listed)

    def record_origins(self) -> None:
        metadata = self.old.get("buildMetadata")
        options = list(metadata) if isinstance(metadata, list) else []
        if ORIGIN_ANNOTATIONS not in options:
            self.set_early("buildMetadata", [*options, ORIGIN_ANNOTATIONS])

    def set_early(self, key: str, value: Any) -> None:
        """Sets `key`; a new key goes after apiVersion, kind and resources, before the rest."""
        out = self.migration.kustomization
        if key in out:
            out[key] = value
            return
        head = {k: v for k, v in out.items() if k in ("apiVersion", "kind", "resources")}
        rest = {k: v for k, v in out.items() if k not in head}
        out.clear()
        out.update(head)
        out[key] = value
        out.update(rest)

    # -- what only concerned the map ConfigMaps ---------------------------------------------------
    def trim_generator_options(self) -> None:
        out = self.migration.kustomization
        options = out.get("generatorOptions")
        if not isinstance(options, dict):
            return
        if not (out.get("configMapGenerator") or out.get("secretGenerator")):
            del out["generatorOptions"]
            self.migration.dropped.append("generatorOptions (no generator is left)")
            return
        labels = options.get("labels")
        if isinstance(labels, dict) and PLACEMENT_MAP_LABEL in labels:
            labels = {k: v for k, v in labels.items() if k != PLACEMENT_MAP_LABEL}
            trimmed = {k: v for k, v in options.items() if k != "labels"}
            if labels:
                trimmed["labels"] = labels
            out["generatorOptions"] = trimmed
            self.migration.dropped.append(
                f"generatorOptions.labels {PLACEMENT_MAP_LABEL} (the remaining generated "
                "objects are not maps)"
            )

    def drop_map_patches(self) -> None:
        names = {m.key.name for m in self.migration.moved}
        out = self.migration.kustomization
        for field_name in _PATCH_FIELDS:
            patches = self.old.get(field_name)
            if not isinstance(patches, list):
                continue
            kept = []
            for i, patch in enumerate(patches):
                verdict = self.patch_verdict(patch, names)
                if verdict == "maps":
                    self.migration.dropped.append(f"{field_name}[{i}] (it patched map ConfigMaps)")
                    continue
                if verdict == "configmaps":
                    self.migration.notes.append(
                        f"{field_name}[{i}] patches ConfigMaps without naming them: it no longer "
                        "reaches the maps"
                    )
                kept.append(patch)
            if kept:
                out[field_name] = kept
            else:
                del out[field_name]

    def patch_verdict(self, patch: Any, names: set[str]) -> str:
        """ "maps" for a patch of map ConfigMaps only, "configmaps" for one of ConfigMaps that
        names none, "" for anything else."""
        target = patch.get("target") if isinstance(patch, dict) else None
        if isinstance(target, dict):
            if target.get("kind") != "ConfigMap":
                return ""
            selector = str(target.get("labelSelector") or "")
            if target.get("name") in names or selector.startswith(PLACEMENT_MAP_LABEL):
                return "maps"
            return "" if target.get("name") or selector else "configmaps"
        body = self.patch_body(patch)
        if not isinstance(body, dict) or body.get("kind") != "ConfigMap":
            return ""
        meta = body.get("metadata")
        return "maps" if isinstance(meta, dict) and meta.get("name") in names else ""

    def patch_body(self, patch: Any) -> Any:
        """The object a target-less patch names: inline text, or the file it points at."""
        text: Any = patch
        if isinstance(patch, dict):
            text = patch.get("patch") or patch.get("path")
        if not isinstance(text, str):
            return None
        if "\n" not in text and text.strip().endswith((".yaml", ".yml")):
            text = self.files.get(self.resolve(text.strip()), "")
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return None


class _Dumper(yaml.SafeDumper):
    """Block style with indented sequences, as kustomizations are usually written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def kustomization_text(migration: Migration, original: str) -> str:
    """The new kustomization: the original's leading comments, then the YAML, a blank line
    between top-level blocks."""
    header = []
    for line in original.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    header += [
        "# The maps listed under resources are applied as PlacementMap custom resources",
        "# (converted from generated ConfigMaps by `gpuplace migrate`).",
    ]
    body = yaml.dump(
        migration.kustomization,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    lines: list[str] = []
    for line in body.splitlines():
        opens_block = (
            line and not line[0].isspace() and not line.startswith("-") and line.endswith(":")
        )
        if opens_block and lines:
            lines.append("")
        lines.append(line)
    return "\n".join(header) + "\n" + "\n".join(lines) + "\n"
