"""Plain values and their positions built straight from a YAML parser's events.

Composing a node tree and then walking it (`yamlsource`) costs about twice as much as reading the
events once: a controller that starts on a few hundred maps reads every one of them before its first
bind. The builder here covers the common stream only: no anchor or alias, no explicit tag, string
keys, none of them twice or a merge key (`<<`), every scalar constructible, nesting within the limit.
On anything else it gives up, and the caller reads the stream again the general way, so every
refusal and every message stays the general reader's. Its tables are the general reader's too: the
same paths, and 1-based (line, column) pairs from the same marks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

#: A field path, as `yamlsource.Path` (kept here so that this module needs nothing of that one).
Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]

STR_TAG = "tag:yaml.org,2002:str"
#: The implicit tags whose values SafeConstructor builds from the scalar alone; any other tag
#: (`=`'s value, `<<`'s merge) is left to the general reader, which refuses or resolves it.
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "timestamp")
)
_CONSTRUCTION_ERRORS = (ValueError, TypeError, AttributeError, KeyError, OverflowError)

# The general reader's resolver and constructors, so that tags and values are theirs. A scalar's
# constructor reads the node alone; calling it directly skips `construct_object`'s bookkeeping
# (which would keep every node).
_resolve: Callable[[type[yaml.Node], str, tuple[bool, bool]], str] = Resolver().resolve
_constructor = SafeConstructor()


class EventParser(Protocol):
    def get_event(self) -> Any: ...


class Built(NamedTuple):
    """One document's value and the tables of `yamlsource.Document`."""

    value: Any
    values: Positions
    keys: Positions
    block_scalars: Positions


_UNSET = object()


class _UncommonError(Exception):
    """The stream has something only the general reader handles."""


def block_scalar_start(lines: list[str], mark_line: int) -> tuple[int, int]:
    """Where a literal block scalar (`|`) whose indicator is on 0-based `mark_line` starts: its
    first non-blank line (1-based) and that line's indent. Literal content keeps its line breaks, so
    the rest maps line for line (folded `>` content does not)."""
    row = mark_line + 1
    while row < len(lines) and not lines[row].strip():
        row += 1
    indent = len(lines[row]) - len(lines[row].lstrip(" ")) if row < len(lines) else 0
    return mark_line + 2, indent


def build_documents(parser: EventParser, text: str, max_depth: int) -> list[Built] | None:
    """Every document of the stream `parser` reads from `text`, or None where the general reader
    is needed (including every stream that it refuses)."""
    stream = _Stream(text, max_depth)
    documents: list[Built] = []
    scalar, mapping_start = yaml.ScalarEvent, yaml.MappingStartEvent
    sequence_start, mapping_end = yaml.SequenceStartEvent, yaml.MappingEndEvent
    try:
        while True:
            event = parser.get_event()
            cls = event.__class__
            if cls is scalar:
                stream.scalar(event)
            elif cls is mapping_start:
                stream.open(event, {})
            elif cls is sequence_start:
                stream.open(event, [])
            elif cls is mapping_end or cls is yaml.SequenceEndEvent:
                stream.close()
            elif cls is yaml.DocumentStartEvent:
                stream.start_document()
            elif cls is yaml.DocumentEndEvent:
                documents.append(stream.document())
            elif cls is yaml.StreamEndEvent:
                return documents
            elif cls is not yaml.StreamStartEvent:
                return None  # an alias, or an event this builder does not know
    except (_UncommonError, yaml.YAMLError):
        return None


class _Stream:
    """One stream being read: the document being built, the collections open in it (innermost
    last), and what its documents share."""

    __slots__ = (
        "_lines",
        "blocks",
        "container",
        "keys",
        "max_open",
        "path",
        "pending",
        "plain",
        "root",
        "stack",
        "text",
        "values",
    )

    def __init__(self, text: str, max_depth: int) -> None:
        self.text = text
        # A collection is opened only where its own contents are still within the limit, so that
        # no scalar needs a check: stricter than the general reader by one level, which then reads
        # that stream and decides.
        self.max_open = max_depth - 1
        self._lines: list[str] | None = None
        # A plain scalar's value depends on its text alone (and none is mutable): each distinct
        # text is resolved and constructed once per stream.
        self.plain: dict[str, Any] = {}
        self.start_document()

    def start_document(self) -> None:
        self.values: Positions = {}
        self.keys: Positions = {}
        self.blocks: Positions = {}
        self.root: Any = None
        self.stack: list[tuple[Any, Path]] = []
        #: The innermost open collection (None at the document's top) and its path.
        self.container: Any = None
        self.path: Path = ()
        #: In a mapping, the path its last key announced; None while it waits for a key.
        self.pending: Path | None = None

    def document(self) -> Built:
        return Built(self.root, self.values, self.keys, self.blocks)

    def scalar(self, event: Any) -> None:
        if event.anchor is not None or event.tag is not None:
            raise _UncommonError
        if event.implicit[0]:
            value = self.plain.get(event.value, _UNSET)
            if value is _UNSET:
                value = self.plain[event.value] = _scalar_value(event)
        else:
            value = _scalar_value(event)
        mark = event.start_mark
        if self.pending is None and self.container.__class__ is dict:
            self.key(value, (mark.line + 1, mark.column + 1))
            return
        child = self.child()
        self.values[child] = (mark.line + 1, mark.column + 1)
        if event.style == "|":
            if self._lines is None:
                self._lines = self.text.split("\n")
            self.blocks[child] = block_scalar_start(self._lines, mark.line)
        self.place(value)

    def key(self, key: Any, position: tuple[int, int]) -> None:
        if key.__class__ is not str:
            raise _UncommonError  # a key that is not a string: `1`, `null`, `<<`
        if key in self.container:
            raise _UncommonError  # refused, at the second one
        self.pending = (*self.path, key)
        self.keys[self.pending] = position

    def open(self, event: Any, new: Any) -> None:
        if event.anchor is not None or event.tag is not None:
            raise _UncommonError
        if self.pending is None and self.container.__class__ is dict:
            raise _UncommonError  # a collection as a key
        if len(self.stack) >= self.max_open:
            raise _UncommonError
        child = self.child()
        mark = event.start_mark
        self.values[child] = (mark.line + 1, mark.column + 1)
        self.place(new)
        self.stack.append((self.container, self.path))
        self.container, self.path = new, child

    def close(self) -> None:
        self.container, self.path = self.stack.pop()

    def child(self) -> Path:
        """The path of the value that comes next."""
        if self.container is None:
            return ()
        if self.pending is None:
            return (*self.path, len(self.container))
        return self.pending

    def place(self, value: Any) -> None:
        if self.container is None:
            self.root = value
        elif self.pending is None:
            self.container.append(value)
        else:
            self.container[self.pending[-1]] = value
            self.pending = None


def _scalar_value(event: Any) -> Any:
    value = event.value
    tag = _resolve(ScalarNode, value, event.implicit)
    if tag == STR_TAG:
        return value
    if tag not in _SCALAR_TAGS:
        raise _UncommonError  # `<<` (a merge key) or `=`: the general reader decides
    node = ScalarNode(tag, value, event.start_mark, event.end_mark, style=event.style)
    try:
        return SafeConstructor.yaml_constructors[tag](_constructor, node)
    except _CONSTRUCTION_ERRORS as exc:
        raise _UncommonError from exc
