"""The `gpuplace.io/status` annotation on each source ConfigMap."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from placement.errors import Diagnostic


class Phase(StrEnum):
    VALID = "Valid"
    INVALID = "Invalid"
    CONFLICT = "Conflict"
    DEGRADED = "Degraded"


@dataclass(frozen=True, slots=True)
class SlotCounts:
    total: int = 0
    served: int = 0
    bound: int = 0
    blocked: int = 0


@dataclass(frozen=True, slots=True)
class MapStatus:
    phase: Phase
    observed_generation: int = 0  # model generation that reflects this status
    observed_version: str = ""  # digest of the placement.yaml that was read
    message: str = ""
    errors: tuple[Diagnostic, ...] = ()
    slots: SlotCounts = field(default_factory=SlotCounts)
    serving_version: str = ""  # digest of the version in service (the last valid one)
    warnings: tuple[Diagnostic, ...] = ()  # of the version in service, e.g. legacy lines sharing

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "phase": self.phase.value,
            "observedGeneration": self.observed_generation,
            "observedVersion": self.observed_version,
            "servingVersion": self.serving_version,
            "message": self.message,
            "errors": [d.to_json() for d in self.errors],
            "slots": {
                "total": self.slots.total,
                "served": self.slots.served,
                "bound": self.slots.bound,
                "blocked": self.slots.blocked,
            },
        }
        if self.warnings:
            data["warnings"] = [d.to_json() for d in self.warnings]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MapStatus:
        data = json.loads(text)
        slots = data.get("slots", {})
        return cls(
            phase=Phase(data["phase"]),
            observed_generation=int(data.get("observedGeneration", 0)),
            observed_version=str(data.get("observedVersion", "")),
            message=str(data.get("message", "")),
            errors=tuple(Diagnostic.from_json(e) for e in data.get("errors", [])),
            slots=SlotCounts(
                int(slots.get("total", 0)),
                int(slots.get("served", 0)),
                int(slots.get("bound", 0)),
                int(slots.get("blocked", 0)),
            ),
            serving_version=str(data.get("servingVersion", "")),
            warnings=tuple(Diagnostic.from_json(w) for w in data.get("warnings", [])),
        )
