"""The `status` of a PlacementMap custom resource, in Kubernetes conventions.

The same verdict as the ConfigMap form's `gpuplace.io/status` annotation (`MapStatus`), written as
`observedGeneration` (of the object read), `conditions` (`Valid`, `Ready`, `Degraded`, `Drifted`,
`Progressing`, each with a reason and a message, and `GangStuck` while a gang map's gang waits),
the slot counts, the gang's standing, the revision and source file.
ArgoCD's health check for the kind (argocd/health/placementmap.lua) reads the conditions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from placement.errors import MAX_MESSAGE, Diagnostic, cap
from placement.status import COMPILING, GangStatus, MapStatus, Phase, SlotCounts


class ConditionType(StrEnum):
    VALID = "Valid"
    READY = "Ready"
    DEGRADED = "Degraded"
    DRIFTED = "Drifted"
    PROGRESSING = "Progressing"
    GANG_STUCK = "GangStuck"


@dataclass(frozen=True, slots=True)
class Condition:
    type: ConditionType
    status: bool
    reason: str
    message: str = ""

    def to_json(self, generation: int, since: str) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": cap(self.message, MAX_MESSAGE * 2),
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }


def conditions(status: MapStatus) -> tuple[Condition, ...]:
    """The five conditions of a map's verdict, and `GangStuck` while its gang waits (False:
    waiting within its timeoutSeconds; True: past it)."""
    slots = status.slots
    invalid = status.phase is Phase.INVALID
    compiling = status.phase is Phase.VALID and status.message == COMPILING
    if invalid or status.errors:
        reason = "Invalid" if invalid else status.phase.value
        valid = Condition(ConditionType.VALID, False, reason, status.message)
    else:
        valid = Condition(ConditionType.VALID, True, "Valid", "the map is valid")
    if compiling:
        ready = Condition(ConditionType.READY, False, "Compiling", "waiting for the model")
    elif status.phase is Phase.VALID:
        ready = Condition(
            ConditionType.READY, True, "Serving", f"{slots.served} of {slots.total} slots served"
        )
    else:
        ready = Condition(ConditionType.READY, False, status.phase.value, status.message)
    degraded = Condition(
        ConditionType.DEGRADED,
        status.phase in (Phase.DEGRADED, Phase.CONFLICT),
        status.phase.value if status.phase in (Phase.DEGRADED, Phase.CONFLICT) else "AsDeclared",
        status.message if status.phase in (Phase.DEGRADED, Phase.CONFLICT) else "",
    )
    drifted = Condition(
        ConditionType.DRIFTED,
        slots.drifted > 0,
        "PodsDrifted" if slots.drifted else "NoDrift",
        f"{slots.drifted} pod(s) drifted; {status.rollout}" if slots.drifted else "",
    )
    rolling = bool(slots.drifted) and status.rollout.startswith("evict")
    if compiling:
        progressing = Condition(ConditionType.PROGRESSING, True, "Compiling", "")
    elif rolling:
        progressing = Condition(ConditionType.PROGRESSING, True, "RollingOut", status.rollout)
    else:
        progressing = Condition(ConditionType.PROGRESSING, False, "Stable", "")
    out: tuple[Condition, ...] = (valid, ready, degraded, drifted, progressing)
    gang = status.gang
    if gang is not None and gang.waiting:
        reason = "GangStuck" if gang.stuck else "GangWaiting"
        out += (Condition(ConditionType.GANG_STUCK, gang.stuck, reason, gang.describe()),)
    return out


def _diagnostics(items: Sequence[Diagnostic]) -> list[dict[str, Any]]:
    return [d.to_json() for d in items]


def resource_status(
    status: MapStatus,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: str,
    *,
    source_file: str = "",
    supersedes: str = "",
) -> dict[str, Any]:
    """The `status` of the custom resource at metadata.generation `generation`; `previous` is the
    status on the object (a condition that did not change keeps its lastTransitionTime)."""
    since = transition_times(previous)
    conds = []
    for cond in conditions(status):
        before = since.get(cond.type.value)
        kept = before[1] if before is not None and before[0] == cond.status else now
        conds.append(cond.to_json(generation, kept))
    slots = status.slots
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": status.phase.value,
        "message": cap(status.message, MAX_MESSAGE * 2),
        "conditions": conds,
        "slots": {
            "total": slots.total,
            "served": slots.served,
            "bound": slots.bound,
            "blocked": slots.blocked,
            "drifted": slots.drifted,
            "renumbered": slots.renumbered,
            "unverifiable": slots.unverifiable,
        },
        "modelGeneration": status.observed_generation,
        "observedVersion": status.observed_version,
        "servingVersion": status.serving_version,
        "revision": status.revision,
        "sourceFile": source_file,
        "rollout": status.rollout,
        "errors": _diagnostics(status.errors),
        "warnings": _diagnostics(status.warnings),
        "supersedes": supersedes,
    }
    if status.gang is not None:
        out["gang"] = status.gang.to_json()
    return out


def transition_times(previous: Mapping[str, Any] | None) -> dict[str, tuple[bool, str]]:
    """Each condition of a status by type: whether it is True, and since when."""
    out: dict[str, tuple[bool, str]] = {}
    items = (previous or {}).get("conditions")
    if not isinstance(items, list):
        return out
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            out[item["type"]] = (item.get("status") == "True", str(item.get("lastTransitionTime")))
    return out


def comparable(status: Mapping[str, Any] | None) -> str:
    """A status as text, transition times aside: equal texts mean a write would change nothing."""
    if status is None:
        return ""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or ()
        if isinstance(c, dict)
    ]
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def status_from_resource(data: Mapping[str, Any]) -> MapStatus:
    """The verdict a custom resource's `status` carries (what `gpuplace status` shows)."""
    slots = data.get("slots") if isinstance(data.get("slots"), dict) else {}
    assert isinstance(slots, dict)

    def count(name: str) -> int:
        value = slots.get(name, 0)
        return value if isinstance(value, int) else 0

    def diagnostics(name: str) -> tuple[Diagnostic, ...]:
        items = data.get(name)
        if not isinstance(items, list):
            return ()
        return tuple(Diagnostic.from_json(i) for i in items if isinstance(i, dict))

    phase = data.get("phase")
    return MapStatus(
        phase=Phase(phase) if phase in {p.value for p in Phase} else Phase.INVALID,
        observed_generation=int(data.get("modelGeneration") or 0),
        observed_version=str(data.get("observedVersion") or ""),
        message=str(data.get("message") or ""),
        errors=diagnostics("errors"),
        slots=SlotCounts(
            count("total"),
            count("served"),
            count("bound"),
            count("blocked"),
            count("drifted"),
            count("renumbered"),
            count("unverifiable"),
        ),
        serving_version=str(data.get("servingVersion") or ""),
        warnings=diagnostics("warnings"),
        revision=str(data.get("revision") or ""),
        rollout=str(data.get("rollout") or ""),
        gang=GangStatus.from_json(data.get("gang")),
    )
