"""YAML loading that remembers where every value and key came from.

PyYAML's composer gives marks for each node; we build plain Python values from the node tree and keep
a table from field path to (line, column), so validation errors can point at the exact spot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from placement.errors import Diagnostic, Location, PlacementError

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

    def locate(self, path: Path, *, key: bool = False) -> Location:
        """The location of `path`, or of its nearest ancestor that has one."""
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


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, doc: Document) -> None:
        self.loader = loader
        self.doc = doc
        self.errors: list[Diagnostic] = []
        # Nodes already walked: an alias is not walked again, so anchors that reference anchors
        # ("billion laughs") cost their size in the text, not their expanded size.
        self._seen: set[int] = set()
        self._lines: list[str] | None = None

    def construct(self, node: yaml.Node) -> Any:
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

    def lines(self, node: yaml.Node) -> list[str]:
        if self._lines is None:
            buffer = node.start_mark.buffer
            self._lines = buffer.split("\n") if buffer else []
        return self._lines

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if id(node) in self._seen:
            return self.construct(node)
        self._seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct(key_node)
                if not isinstance(key, str | int | float | bool) or key is None:
                    self.errors.append(
                        Diagnostic(
                            Location(
                                self.doc.source,
                                key_node.start_mark.line + 1,
                                key_node.start_mark.column + 1,
                                format_path(path),
                            ),
                            "mapping keys must be plain scalars",
                        )
                    )
                    continue
                child = (*path, key if isinstance(key, str) else str(key))
                if key in out:
                    first = self.doc.keys.get(child, (0, 0))
                    self.errors.append(
                        Diagnostic(
                            Location(
                                self.doc.source,
                                key_node.start_mark.line + 1,
                                key_node.start_mark.column + 1,
                                format_path(child),
                            ),
                            f"duplicate key {key!r} (first at line {first[0]})",
                        )
                    )
                    continue
                self.doc.keys[child] = (
                    key_node.start_mark.line + 1,
                    key_node.start_mark.column + 1,
                )
                out[key] = self.build(value_node, child)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and node.style == "|":
            # Literal content starts on the line after the indicator and keeps its line breaks:
            # record that line and its indent (folded `>` content does not map line for line).
            lines = self.lines(node)
            row = node.start_mark.line + 1
            while row < len(lines) and not lines[row].strip():
                row += 1
            indent = len(lines[row]) - len(lines[row].lstrip(" ")) if row < len(lines) else 0
            self.doc.block_scalars[path] = (node.start_mark.line + 2, indent)
        return self.construct(node)


def load_documents(text: str, source: str) -> Iterator[Document]:
    """Yields each document of a YAML stream; raises PlacementError on YAML syntax errors."""
    try:
        # The reader rejects non-printable characters as soon as it is given the text.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise _unreadable(text, source, exc) from exc
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # an empty document
                continue
            doc = Document(source, None)
            builder = _Builder(loader, doc)
            doc.value = builder.build(node, ())
            if builder.errors:
                raise PlacementError(tuple(builder.errors))
            yield doc
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
