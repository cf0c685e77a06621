"""YAML loading that remembers where every value and key came from.

PyYAML's composer gives marks for each node; we build plain Python values from the node tree and keep
a table from field path to (line, column), so validation errors can point at the exact spot. A stream
without anchors, tags or merge keys (nearly every map) is built straight from the parser's events
instead (`placement/yamlevents.py`), with the same tables; any other is read through the node tree.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from placement.errors import Diagnostic, Location, PlacementError, oversized
from placement.yamlevents import block_scalar_start, build_documents

Path = tuple[str | int, ...]


@dataclass(slots=True)
class Document:
    """One YAML document: its value and the positions of every node in it (1-based)."""

    source: str
    value: Any
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)
    #: For block scalars (`|`, `>`): the line where content starts and its indentation.
    block_scalars: dict[Path, tuple[int, int]] = field(default_factory=dict)
    #: False for an object read from the apiserver (a custom resource): it has no lines, so a
    #: location is the source and the field path alone.
    positioned: bool = True

    def locate(self, path: Path, *, key: bool = False) -> Location:
        """The location of `path`, or of its nearest ancestor that has one."""
        if not self.positioned:
            return Location(self.source, 0, 0, format_path(path))
        table = self.keys if key else self.values
        probe = path
        while True:
            if probe in table:
                line, col = table[probe]
                return Location(self.source, line, col, format_path(path))
            if key and probe in self.values:
                line, col = self.values[probe]
                return Location(self.source, line, col, format_path(path))
            if not probe:
                return Location(self.source, 1, 1, format_path(path))
            probe = probe[:-1]


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _preview(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True, slots=True)
class YamlLimits:
    """What one YAML stream may cost to read: input that costs nothing to write (a few hundred
    bytes of nested aliases) must cost nothing to read either."""

    #: A ConfigMap holds at most 1 MiB; files in a GitOps repo (CRD bundles) can be larger.
    max_bytes: int = 8 * 1024 * 1024
    #: Nesting of collections; a PlacementMap needs 6, Kubernetes manifests a few dozen.
    max_depth: int = 100
    #: Entries that merge keys (`<<`) may copy in one document outside gpuplace's own kinds.
    max_merged: int = 100_000


DEFAULT_LIMITS = YamlLimits()


def _where(source: str, mark: Any, path: Path = ()) -> Location:
    if mark is None:
        return Location(source, 1, 1, format_path(path))
    return Location(source, mark.line + 1, mark.column + 1, format_path(path))


try:
    # libyaml's event parser: the pure-Python scanner costs most of the time of a large map.
    from yaml.cyaml import CParser as _EventSource  # type: ignore[attr-defined]
except ImportError:  # PyYAML built without libyaml

    class _EventSource(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class _Loader(Composer, _EventSource, SafeConstructor, Resolver):
    """A safe loader that bounds nesting and remembers where anchors and aliases were written.

    The node tree is composed here, in Python, from the parser's events, so that nesting is
    counted as it is built rather than found out by a recursion error (or a crash in C).
    """

    def __init__(self, text: str, source: str, limits: YamlLimits) -> None:
        _EventSource.__init__(self, text)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        Composer.__init__(self)
        self.source = source
        self.limits = limits
        self.depth = 0
        #: (what, mark) for each anchor (`&a`) and alias (`*a`) of the document being composed.
        self.references: list[tuple[str, Any]] = []

    def compose_document(self) -> yaml.Node | None:
        self.references = []
        node: yaml.Node | None = super().compose_document()
        return node

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: Any = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.references.append(("alias", event.start_mark))
        elif getattr(event, "anchor", None) is not None:
            self.references.append(("anchor", event.start_mark))
        if self.depth >= self.limits.max_depth:
            raise PlacementError.single(
                _where(self.source, event.start_mark),
                f"YAML nests deeper than {self.limits.max_depth} levels",
            )
        self.depth += 1
        try:
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self.depth -= 1


def _scalar_value(node: yaml.MappingNode, key: str) -> object:
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node.value if isinstance(value_node, yaml.ScalarNode) else None
    return None


def _is_gpuplace_document(root: yaml.Node) -> bool:
    """The same test as `schema.is_placement_document`, made on the node tree before building."""
    if not isinstance(root, yaml.MappingNode):
        return False
    api = _scalar_value(root, "apiVersion")
    return _scalar_value(root, "kind") == "PlacementMap" or (
        isinstance(api, str) and api.startswith("gpuplace.io/")
    )


class _Builder:
    """Builds plain values from a composed node tree, in time linear in the text.

    An aliased node is built once and shared (as PyYAML shares it), and merge keys are resolved
    here with a budget instead of by PyYAML's `flatten_mapping`, which copies every merged list
    again at each level: `<<: [*a, *a, *a, *a]` chained twenty times is 4**20 entries.
    """

    def __init__(self, loader: _Loader, doc: Document, text: str, strict: bool) -> None:
        self.loader = loader
        self.text = text
        self.doc = doc
        #: gpuplace's own documents admit no anchors, aliases or merge keys at all.
        self.strict = strict
        self.kind = "PlacementMap"  # named in messages about what gpuplace's documents refuse
        self.errors: list[Diagnostic] = []
        self._built: dict[int, Any] = {}
        self._merged = 0
        self._lines: list[str] | None = None

    def construct(self, node: yaml.ScalarNode) -> Any:
        """A scalar's value; a tag the value does not fit (`!!int foo`) is the user's error."""
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as exc:
            raise PlacementError.single(
                Location(self.doc.source, node.start_mark.line + 1, node.start_mark.column + 1),
                f"value {_preview(node.value)} does not fit its tag "
                f"{node.tag.replace('tag:yaml.org,2002:', '!!')}",
                hint="remove the tag or fix the value",
            ) from exc

    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.split("\n")
        return self._lines

    def refuse_references(self) -> None:
        """One diagnostic at the first anchor or alias: the rest would repeat it."""
        what, mark = self.loader.references[0]
        more = len(self.loader.references) - 1
        also = f" ({more} more anchors or aliases in this document)" if more else ""
        self.errors.append(
            Diagnostic(
                _where(self.doc.source, mark),
                f"YAML {what}s are not allowed in a {self.kind}{also}",
                hint="write the value out in full",
            )
        )

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if id(node) in self._built:
            return self._built[id(node)]
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            items: list[Any] = []
            self._built[id(node)] = items  # before the items: an anchor may contain its alias
            items.extend(self.build(item, (*path, i)) for i, item in enumerate(node.value))
            return items
        assert isinstance(node, yaml.ScalarNode)
        if node.style == "|":
            self.doc.block_scalars[path] = block_scalar_start(self.lines(), node.start_mark.line)
        return self.construct(node)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        self._built[id(node)] = out
        merges: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                if self.strict:
                    self.errors.append(
                        Diagnostic(
                            _where(self.doc.source, key_node.start_mark, path),
                            f"YAML merge keys (<<) are not allowed in a {self.kind}",
                            hint="write the entries out in full",
                        )
                    )
                else:
                    merges.append(value_node)
                continue
            key = self.construct(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str | int | float | bool) or key is None:
                self.errors.append(
                    Diagnostic(
                        _where(self.doc.source, key_node.start_mark, path),
                        "mapping keys must be plain scalars",
                    )
                )
                continue
            child = (*path, key if isinstance(key, str) else str(key))
            if key in out:
                first = self.doc.keys.get(child, (0, 0))
                self.errors.append(
                    Diagnostic(
                        _where(self.doc.source, key_node.start_mark, child),
                        f"duplicate key {_preview(key)} (first at line {first[0]})",
                    )
                )
                continue
            self.doc.keys[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = self.build(value_node, child)
        for merge in merges:
            self._merge(out, merge, path)
        return out

    def _merge(self, out: dict[Any, Any], merge: yaml.Node, path: Path) -> None:
        """YAML merge: explicit keys win, then the earlier of the merged mappings."""
        sources = merge.value if isinstance(merge, yaml.SequenceNode) else [merge]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self.errors.append(
                    Diagnostic(
                        _where(self.doc.source, source.start_mark, path),
                        "a merge key (<<) takes a mapping or a list of mappings",
                    )
                )
                continue
            merged = self.build(source, (*path, "<<"))
            self._merged += len(merged)
            if self._merged > self.loader.limits.max_merged:
                raise PlacementError.single(
                    _where(self.doc.source, source.start_mark, path),
                    f"YAML merge keys copy more than {self.loader.limits.max_merged} entries",
                    hint="write the document without merge keys",
                )
            for key, value in merged.items():
                out.setdefault(key, value)


class _GcPause:
    """Pauses the cyclic garbage collector while a stream is read: a large map allocates
    hundreds of thousands of small containers, none of them in cycles, and the generational
    collections they trigger cost as much as the reading itself. Nests across threads: the
    collector runs again when the last reader is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers = 0
        self._was_enabled = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._readers == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                if self._readers == 0 and self._was_enabled:
                    gc.enable()


_gc_paused = _GcPause()


def load_documents(
    text: str, source: str, limits: YamlLimits = DEFAULT_LIMITS
) -> Iterator[Document]:
    """Yields each document of a YAML stream; raises PlacementError on YAML syntax errors and on
    input past `limits`."""
    size = oversized(text, limits.max_bytes)
    if size is not None:
        raise PlacementError.single(
            Location(source, 1, 1),
            f"the YAML is {size} bytes; the limit is {limits.max_bytes}",
            hint="split it into several files or maps",
        )
    try:
        # PyYAML's reader rejects non-printable characters as soon as it is given the text, and
        # says which and where (libyaml's parser would only say that one was found).
        Reader(text)
    except yaml.reader.ReaderError as exc:
        raise _unreadable(text, source, exc) from exc
    with _gc_paused():
        documents = _read_events(text, source, limits)
        if documents is None:
            documents = _read_nodes(text, source, limits)
    yield from documents


def _read_events(text: str, source: str, limits: YamlLimits) -> list[Document] | None:
    """The common stream, built from the parser's events (`placement/yamlevents.py`); None for
    any other, which only `_read_nodes` reads."""
    parser = _EventSource(text)
    try:
        built = build_documents(parser, text, limits.max_depth)
    finally:
        parser.dispose()
    if built is None:
        return None
    return [Document(source, doc.value, doc.values, doc.keys, doc.block_scalars) for doc in built]


def _read_nodes(text: str, source: str, limits: YamlLimits) -> list[Document]:
    """Any stream, through a node tree: anchors, aliases, tags and merge keys, and every refusal."""
    loader = _Loader(text, source, limits)
    try:
        return list(_documents(loader, text, source))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise PlacementError.single(Location(source, line, col), f"YAML syntax: {problem}") from exc
    except yaml.YAMLError as exc:  # errors without a mark (e.g. unreadable characters)
        raise PlacementError.single(Location(source, 1, 1), f"YAML: {exc}") from exc
    except RecursionError as exc:
        raise PlacementError.single(Location(source, 1, 1), "YAML nests too deeply") from exc
    finally:
        loader.dispose()


def _documents(loader: _Loader, text: str, source: str) -> Iterator[Document]:
    while loader.check_node():
        node = loader.get_node()
        if node is None:  # an empty document
            continue
        doc = Document(source, None)
        builder = _Builder(loader, doc, text, strict=_is_gpuplace_document(node))
        kind = _scalar_value(node, "kind") if isinstance(node, yaml.MappingNode) else None
        builder.kind = kind if isinstance(kind, str) and kind else "gpuplace document"
        if builder.strict and loader.references:
            builder.refuse_references()
            raise PlacementError(tuple(builder.errors))
        doc.value = builder.build(node, ())
        if builder.errors:
            raise PlacementError(tuple(builder.errors))
        yield doc


def _unreadable(text: str, source: str, exc: yaml.reader.ReaderError) -> PlacementError:
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    code = exc.character if isinstance(exc.character, int) else ord(exc.character)
    return PlacementError.single(
        Location(source, line, column),
        f"character U+{code:04X} is not allowed in YAML",
        hint="remove it, or write it as an escape in a double-quoted string",
    )
