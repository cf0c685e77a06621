"""Located diagnostics: every problem a user can cause says where, what, and what to do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Bounds on what one problem may print: an error message is read by a person, logged, and stored
#: in a status annotation, so input that repeats a bad value cannot make any of them large.
MAX_MESSAGE = 500
MAX_PATH = 200
MAX_DIAGNOSTICS = 50


def cap(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with a note of how much was left out."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(note))] + note


@dataclass(frozen=True, slots=True)
class Location:
    """Where something is in its source: a file or object, and a 1-based line and column."""

    source: str
    line: int = 0
    column: int = 0
    path: str = ""  # field path inside the document, e.g. spec.placements[2].devices[1]

    def __post_init__(self) -> None:
        if len(self.path) > MAX_PATH:
            object.__setattr__(self, "path", cap(self.path, MAX_PATH))

    def __str__(self) -> str:
        if self.line:
            return f"{self.source}:{self.line}:{self.column}"
        return self.source

    def within(self) -> str:
        """Where, inside its source, for a message about another place of the same source:
        `line 7, column 15` in a file, the field path in an object read from the apiserver."""
        if self.line:
            return f"line {self.line}, column {self.column}"
        return self.path or self.source


@dataclass(frozen=True, slots=True)
class Diagnostic:
    location: Location
    message: str
    severity: str = "error"
    hint: str = ""

    def format(self) -> str:
        where = str(self.location)
        message = cap(self.message, MAX_MESSAGE)
        what = f"{self.location.path}: {message}" if self.location.path else message
        text = f"{where}: {self.severity}: {what}"
        return f"{text} ({cap(self.hint, MAX_MESSAGE)})" if self.hint else text

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.location.source,
            "line": self.location.line,
            "column": self.location.column,
            "path": self.location.path,
            "severity": self.severity,
            "message": cap(self.message, MAX_MESSAGE),
            "hint": cap(self.hint, MAX_MESSAGE),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Diagnostic:
        return cls(
            Location(
                str(data.get("source", "")),
                int(data.get("line", 0)),
                int(data.get("column", 0)),
                str(data.get("path", "")),
            ),
            str(data.get("message", "")),
            str(data.get("severity", "error")),
            str(data.get("hint", "")),
        )


@dataclass(slots=True)
class PlacementError(Exception):
    """Raised for input that is not a valid placement map; carries every diagnostic found."""

    diagnostics: Sequence[Diagnostic] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.diagnostics = capped(self.diagnostics)
        Exception.__init__(self, self.format())

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)

    @classmethod
    def single(cls, location: Location, message: str, hint: str = "") -> PlacementError:
        return cls((Diagnostic(location, message, hint=hint),))


def capped(diagnostics: Sequence[Diagnostic]) -> tuple[Diagnostic, ...]:
    """At most MAX_DIAGNOSTICS of them; the last one says how many more there were."""
    if len(diagnostics) <= MAX_DIAGNOSTICS:
        return tuple(diagnostics)
    kept = tuple(diagnostics[: MAX_DIAGNOSTICS - 1])
    last = kept[-1].location
    more = len(diagnostics) - len(kept)
    return (*kept, Diagnostic(Location(last.source), f"{more} more problems not shown"))


def format_all(diagnostics: Iterable[Diagnostic]) -> str:
    return "\n".join(d.format() for d in diagnostics)


def oversized(text: str, limit: int) -> int | None:
    """The text's size in UTF-8 bytes when it is over `limit`, else None; counted without encoding
    a text whose characters could not reach the limit even at 4 bytes each."""
    if len(text) * 4 <= limit:
        return None
    size = len(text.encode())
    return size if size > limit else None
