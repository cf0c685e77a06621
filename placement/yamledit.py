"""Edits of YAML files that a person reviews: every byte outside the changed values stays as it
was written (comments, key order, quoting, indentation, odd spacing).

ruamel.yaml's round-trip composer gives each node of the file its start and end offsets; an edit
replaces the text of those spans only, and new entries are inserted as whole lines indented like
their siblings. Re-dumping the document (even round-trip) would re-flow lines nobody changed, and
a reviewer would read them as changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from placement.errors import Location, PlacementError

#: A plain YAML scalar that reads back as the same string (no quoting needed).
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*")
_KEYWORDS = frozenset(
    {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n", ".inf", ".nan", "="}
)


def scalar(value: int | str) -> str:
    """`value` as a YAML scalar that reads back as itself: plain where that is safe, else
    double-quoted (JSON's string form is valid YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if (
        _PLAIN.fullmatch(value)
        and value.lower() not in _KEYWORDS
        and not re.fullmatch(r"[-+]?[0-9][0-9_.:eExXoObB+-]*", value)
        and ": " not in value
        and not value.endswith(":")
    ):
        return value
    return _double_quoted(value)


def _printable(c: str) -> bool:
    code = ord(c)
    return (
        0x20 <= code <= 0x7E
        or (0xA0 <= code <= 0xD7FF and code not in (0x2028, 0x2029))
        or (0xE000 <= code <= 0xFFFD and code != 0xFEFF)
        or code >= 0x10000
    )


def _double_quoted(value: str) -> str:
    """A YAML double-quoted scalar; characters YAML may not carry as they are are escaped."""
    out = []
    for c in value:
        if c in '"\\':
            out.append("\\" + c)
        elif _printable(c):
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def flow_list(values: Sequence[int | str]) -> str:
    return "[" + ", ".join(scalar(v) for v in values) + "]"


@dataclass(frozen=True, slots=True)
class Splice:
    start: int
    end: int
    text: str


def content_end(node: Node) -> int:
    """Where the node's own text ends: a block collection's end mark lies past the comments and
    blank lines that follow its last item; its last scalar's does not."""
    if isinstance(node, ScalarNode) or getattr(node, "flow_style", False):
        return int(node.end_mark.index)
    if isinstance(node, MappingNode) and node.value:
        return content_end(node.value[-1][1])
    if isinstance(node, SequenceNode) and node.value:
        return content_end(node.value[-1])
    return int(node.end_mark.index)


class YamlEdit:
    """One file's text, its nodes, and the splices to apply (none may overlap)."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        try:
            self.documents: list[Node] = [
                d for d in YAML(typ="rt").compose_all(text) if d is not None
            ]
        except YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
            raise PlacementError.single(Location(source, line, col), f"YAML: {exc}") from exc
        self.splices: list[Splice] = []

    # -- finding ---------------------------------------------------------------------------
    @staticmethod
    def pair(mapping: Node, key: str) -> tuple[Node, Node] | None:
        if not isinstance(mapping, MappingNode):
            return None
        for key_node, value_node in mapping.value:
            if isinstance(key_node, ScalarNode) and key_node.value == key:
                return key_node, value_node
        return None

    def get(self, node: Node, *path: str | int) -> Node | None:
        for part in path:
            if isinstance(part, int):
                if not isinstance(node, SequenceNode) or part >= len(node.value):
                    return None
                node = node.value[part]
            else:
                found = self.pair(node, part)
                if found is None:
                    return None
                node = found[1]
        return node

    def location(self, node: Node) -> Location:
        return Location(self.source, node.start_mark.line + 1, node.start_mark.column + 1)

    # -- editing ---------------------------------------------------------------------------
    def replace_value(self, node: Node, text: str) -> None:
        """The value's text becomes `text` (a one-line scalar or flow collection); what follows
        it on its line (a comment) stays."""
        self._add(int(node.start_mark.index), content_end(node), text)

    def replace_pair(self, mapping: Node, key: str, new_key: str, value: str) -> None:
        found = self.pair(mapping, key)
        if found is None:
            raise KeyError(key)
        key_node, value_node = found
        self._add(int(key_node.start_mark.index), content_end(value_node), f"{new_key}: {value}")

    def replace_pair_text(self, mapping: Node, key: str, text: str) -> None:
        """The whole `key: value` pair becomes `text` (which may span lines)."""
        found = self.pair(mapping, key)
        if found is None:
            raise KeyError(key)
        key_node, value_node = found
        end = content_end(value_node)
        if isinstance(value_node, ScalarNode) and value_node.value == "":
            end = int(key_node.end_mark.index) + 1  # an empty value: the key and its colon
        self._add(int(key_node.start_mark.index), end, text)

    def set_pair(self, mapping: Node, key: str, value: str, after: str | None = None) -> None:
        """`key: value` in `mapping`: its value replaced where the key exists, else a new line
        after the entry `after` (default: the last one), indented like it."""
        found = self.pair(mapping, key)
        if found is not None:
            self.replace_value(found[1], value)
            return
        assert isinstance(mapping, MappingNode) and mapping.value
        anchor = self.pair(mapping, after) if after is not None else None
        key_node, value_node = anchor or mapping.value[-1]
        at = self._line_end(content_end(value_node))
        indent = " " * int(key_node.start_mark.column)
        self._add(at, at, f"{indent}{key}: {value}\n")

    def remove_pair(self, mapping: Node, key: str) -> None:
        """Removes `key` and its value; its lines go when nothing else is on them."""
        assert isinstance(mapping, MappingNode)
        pairs = mapping.value
        at = next(
            (i for i, (k, _) in enumerate(pairs) if isinstance(k, ScalarNode) and k.value == key),
            None,
        )
        if at is None:
            return
        key_node, value_node = pairs[at]
        start = int(key_node.start_mark.index)
        line_start = self.text.rfind("\n", 0, start) + 1
        if self.text[line_start:start].strip() == "":
            self._add(line_start, self._line_end(content_end(value_node)), "")
        elif at + 1 < len(pairs):
            # The first key of a sequence item (`- key: v`): the next key takes its place.
            self._add(start, int(pairs[at + 1][0].start_mark.index), "")
        else:
            raise ValueError(f"{self.source}: cannot remove {key!r}, the entry's only key")

    def append_item(self, sequence: Node, lines: Sequence[str]) -> None:
        """A new last item of a block sequence, written as `lines` (the first after `- `, the
        rest indented under it), at the column of the items before it."""
        assert isinstance(sequence, SequenceNode) and sequence.value
        last = sequence.value[-1]
        start = int(last.start_mark.index)
        line_start = self.text.rfind("\n", 0, start) + 1
        dash = self.text.rfind("-", line_start, start)
        column = dash - line_start if dash >= 0 else int(last.start_mark.column) - 2
        indent = " " * column
        body = [f"{indent}- {lines[0]}"] + [f"{indent}  {line}" for line in lines[1:]]
        at = self._line_end(content_end(last))
        self._add(at, at, "\n".join(body) + "\n")

    def _line_end(self, index: int) -> int:
        """The offset just past the end of the line holding `index` (its newline included)."""
        end = self.text.find("\n", index)
        return len(self.text) if end < 0 else end + 1

    def _add(self, start: int, end: int, text: str) -> None:
        for other in self.splices:
            if start < other.end and other.start < end:
                raise ValueError(f"{self.source}: two edits of the same text")
        if start == end == len(self.text) and self.text and not self.text.endswith("\n"):
            text = "\n" + text
        self.splices.append(Splice(start, end, text))

    def result(self) -> str:
        out = self.text
        for splice in sorted(self.splices, key=lambda s: (s.start, s.end), reverse=True):
            out = out[: splice.start] + splice.text + out[splice.end :]
        return out

    @property
    def changed(self) -> bool:
        return self.result() != self.text


def placement_documents(edit: YamlEdit) -> Iterator[tuple[Node, str, str]]:
    """Each PlacementMap document of the file: (node, namespace, name)."""
    for doc in edit.documents:
        kind = edit.get(doc, "kind")
        if not isinstance(kind, ScalarNode) or kind.value != "PlacementMap":
            continue
        name = edit.get(doc, "metadata", "name")
        namespace = edit.get(doc, "metadata", "namespace")
        if isinstance(name, ScalarNode) and isinstance(namespace, ScalarNode):
            yield doc, str(namespace.value), str(name.value)


def placement_entries(edit: YamlEdit, doc: Node) -> dict[int, Node]:
    """The entries of `spec.placements` by their index."""
    out: dict[int, Node] = {}
    placements = edit.get(doc, "spec", "placements")
    if not isinstance(placements, SequenceNode):
        return out
    for entry in placements.value:
        index = edit.get(entry, "index")
        if isinstance(index, ScalarNode) and str(index.value).isdecimal():
            out[int(index.value)] = entry
    return out


def scalar_of(node: Node | None) -> Any:
    return node.value if isinstance(node, ScalarNode) else None
