"""Located diagnostics: every problem a user can cause says where, what, and what to do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Location:
    """Where something is in its source: a file or object, and a 1-based line and column."""

    source: str
    line: int = 0
    column: int = 0
    path: str = ""  # field path inside the document, e.g. spec.placements[2].devices[1]

    def __str__(self) -> str:
        if self.line:
            return f"{self.source}:{self.line}:{self.column}"
        return self.source


@dataclass(frozen=True, slots=True)
class Diagnostic:
    location: Location
    message: str
    severity: str = "error"
    hint: str = ""

    def format(self) -> str:
        where = str(self.location)
        what = f"{self.location.path}: {self.message}" if self.location.path else self.message
        text = f"{where}: {self.severity}: {what}"
        return f"{text} ({self.hint})" if self.hint else text

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.location.source,
            "line": self.location.line,
            "column": self.location.column,
            "path": self.location.path,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
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
        Exception.__init__(self, self.format())

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)

    @classmethod
    def single(cls, location: Location, message: str, hint: str = "") -> PlacementError:
        return cls((Diagnostic(location, message, hint=hint),))


def format_all(diagnostics: Iterable[Diagnostic]) -> str:
    return "\n".join(d.format() for d in diagnostics)
