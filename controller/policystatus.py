"""The verdict on each form of the placement policy, and its writing: the `status` of the
PlacementPolicy custom resource (observedGeneration, phase, conditions), the `gpuplace.io/status`
annotation of the ConfigMap form. When both exist the custom resource serves, and the ConfigMap's
status says it is superseded."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.writer import patched
from kubeio.client import Kube, Obj
from kubeio.paths import CONFIGMAPS, PLACEMENT_POLICIES
from kubeio.times import now_time
from placement.annotations import STATUS_ANNOTATION
from placement.errors import MAX_MESSAGE, Diagnostic, cap
from placement.resource import generation
from placement.resourcestatus import comparable, transition_times

log = logging.getLogger(__name__)

VALID = "Valid"
INVALID = "Invalid"
SUPERSEDED = "Superseded"


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    phase: str
    message: str
    generation: int = 0
    errors: tuple[Diagnostic, ...] = ()

    @classmethod
    def valid(cls, obj: Obj, grants: int) -> PolicyVerdict:
        return cls(VALID, f"{grants} grant(s) in force", generation(obj))

    @classmethod
    def invalid(cls, obj: Obj, errors: Sequence[Diagnostic]) -> PolicyVerdict:
        first = errors[0].format() if errors else "invalid"
        message = f"{len(errors)} error(s): {first}; the last valid policy stays in force"
        return cls(INVALID, message, generation(obj), tuple(errors))

    @classmethod
    def superseded(cls, obj: Obj) -> PolicyVerdict:
        message = (
            "superseded: the PlacementPolicy custom resource of the same name is in force; "
            "this ConfigMap is not read while it exists"
        )
        return cls(SUPERSEDED, message, generation(obj))

    def annotation(self) -> str:
        data = {
            "phase": self.phase,
            "message": cap(self.message, MAX_MESSAGE * 2),
            "errors": [d.to_json() for d in self.errors],
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def resource_status(self, previous: Any, now: str) -> dict[str, Any]:
        valid = self.phase != INVALID
        before = transition_times(previous if isinstance(previous, dict) else None).get("Valid")
        since = before[1] if before is not None and before[0] == valid else now
        return {
            "observedGeneration": self.generation,
            "phase": self.phase,
            "message": cap(self.message, MAX_MESSAGE * 2),
            "conditions": [
                {
                    "type": "Valid",
                    "status": "True" if valid else "False",
                    "reason": self.phase,
                    "message": cap(self.message, MAX_MESSAGE * 2),
                    "observedGeneration": self.generation,
                    "lastTransitionTime": since,
                }
            ],
            "errors": [d.to_json() for d in self.errors],
        }


def write_policy_status(
    kube: Kube, obj: Obj, verdict: PolicyVerdict, *, resource: bool, namespace: str
) -> bool:
    """Writes one verdict onto its object unless it already says so; False when it failed."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    what = f"the placement policy {name}"
    if resource:
        current = obj.get("status")
        body = verdict.resource_status(current, now_time())
        if isinstance(current, dict) and comparable(current) == comparable(body):
            return True
        path = PLACEMENT_POLICIES.item(name, subresource="status")
        return patched(kube, path, {"status": body}, what)
    text = verdict.annotation()
    if (meta.get("annotations") or {}).get(STATUS_ANNOTATION) == text:
        return True
    annotations = {"metadata": {"annotations": {STATUS_ANNOTATION: text}}}
    return patched(kube, CONFIGMAPS.item(name, namespace), annotations, what)
