"""A map in its ConfigMap form inside a file: what `gpuplace render` prints and `kubectl get cm -o
yaml` shows, kept in git by some repositories instead of the map file itself.

The map is the text under `data.placement.yaml`; it is read like a map file, and every position
in it is moved to where that text sits in the file (line for line inside a literal block `|`, at
the start of the value otherwise), so errors point at the file the user edits. The ConfigMap must
be named and namespaced like the map and carry the label the controller selects on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from placement.annotations import PLACEMENT_KEY, PLACEMENT_MAP_LABEL
from placement.errors import Diagnostic, Location, PlacementError
from placement.schema import is_placement_document
from placement.types import MapKey
from placement.yamlsource import Document, Path, load_documents

_DATA: Path = ("data", PLACEMENT_KEY)


def is_map_configmap(value: object) -> bool:
    """Whether a YAML document is a ConfigMap holding a map (`data.placement.yaml`)."""
    if not isinstance(value, dict) or value.get("kind") != "ConfigMap":
        return False
    data = value.get("data")
    return value.get("apiVersion") == "v1" and isinstance(data, dict) and PLACEMENT_KEY in data


def configmap_key(value: dict[str, Any]) -> MapKey | None:
    """The ConfigMap's own namespace and name, when it states both."""
    meta = value.get("metadata")
    if not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    if isinstance(name, str) and isinstance(namespace, str) and name and namespace:
        return MapKey(namespace, name)
    return None


@dataclass(frozen=True, slots=True)
class _Shift:
    """Where the text of `data.placement.yaml` sits in the file."""

    line: int  # file line of the text's first line
    indent: int  # columns before the text on each of its lines
    literal: bool  # False: a quoted or folded scalar, whose lines do not map to the file's

    def position(self, line: int, column: int) -> tuple[int, int]:
        if not self.literal:
            return self.line, self.indent + 1
        return self.line + line - 1, self.indent + column

    def location(self, loc: Location) -> Location:
        if not loc.line:
            return loc
        line, column = self.position(loc.line, loc.column)
        return replace(loc, line=line, column=column)

    def document(self, inner: Document) -> Document:
        def moved(table: dict[Path, tuple[int, int]]) -> dict[Path, tuple[int, int]]:
            return {p: self.position(*pos) for p, pos in table.items()}

        # A block scalar's entry is its first content line and its indent (a 0-based column).
        blocks: dict[Path, tuple[int, int]] = {}
        for path, (line, indent) in inner.block_scalars.items():
            row, column = self.position(line, indent + 1)
            blocks[path] = (row, column - 1)
        return Document(inner.source, inner.value, moved(inner.values), moved(inner.keys), blocks)


def _shift(outer: Document) -> _Shift:
    block = outer.block_scalars.get(_DATA)
    if block is not None:
        return _Shift(block[0], block[1], literal=True)
    line, column = outer.values.get(_DATA, (1, 1))
    return _Shift(line, column - 1, literal=False)


@dataclass(slots=True)
class Unwrapped:
    """The map inside a ConfigMap document: its document, positioned in the file, its text, and
    what is wrong with the ConfigMap around it."""

    document: Document | None
    text: str
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)


def unwrap(outer: Document) -> Unwrapped:
    """The map a ConfigMap document holds. Raises PlacementError when the text is not YAML; the
    map itself is validated by the caller (`document_to_map`), which also checks that its
    metadata names this ConfigMap (`check_identity`)."""
    value: dict[str, Any] = outer.value
    text = value["data"][PLACEMENT_KEY]
    out = Unwrapped(None, text if isinstance(text, str) else "")
    if not isinstance(text, str):
        out.errors.append(
            Diagnostic(outer.locate(_DATA), f"data.{PLACEMENT_KEY} must be the map's YAML text")
        )
        return out
    shift = _shift(outer)
    try:
        inner = list(load_documents(text, outer.source))
    except PlacementError as exc:
        raise PlacementError(
            tuple(replace(d, location=shift.location(d.location)) for d in exc.diagnostics)
        ) from None
    maps = [d for d in inner if is_placement_document(d.value)]
    if len(maps) != 1:
        out.errors.append(
            Diagnostic(
                outer.locate(_DATA),
                f"expected exactly one PlacementMap in data.{PLACEMENT_KEY}, found {len(maps)}",
                hint="put one map in each ConfigMap",
            )
        )
        return out
    out.document = shift.document(maps[0])
    labels = (value.get("metadata") or {}).get("labels")
    if not isinstance(labels, dict) or labels.get(PLACEMENT_MAP_LABEL) != "true":
        out.warnings.append(
            Diagnostic(
                outer.locate(("metadata",)),
                f'ConfigMap lacks the label {PLACEMENT_MAP_LABEL}: "true"; the controller '
                "ignores it",
                severity="warning",
                hint="add it under metadata.labels",
            )
        )
    return out


def check_identity(outer: Document, key: MapKey) -> Diagnostic | None:
    """An error when the ConfigMap is not named and namespaced like the map `key` it holds (the
    controller would refuse the map)."""
    own = configmap_key(outer.value)
    if own == key:
        return None
    return Diagnostic(
        outer.locate(("metadata",)),
        f"map declares {key} but is stored in ConfigMap {own or '(unnamed)'}",
        hint="metadata.name and metadata.namespace must match the ConfigMap's",
    )
