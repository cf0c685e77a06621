"""The `status` schemas of the PlacementMap and PlacementPolicy CRDs: what the controller writes
(placement/resourcestatus.py, controller/policystatus.py), field for field."""

from __future__ import annotations

from typing import Any

from placement.status import Phase


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _integer(description: str, *, int64: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "description": description}
    if int64:
        out["format"] = "int64"
    return out


def condition_schema() -> dict[str, Any]:
    """A metav1.Condition, as Kubernetes' own types declare it."""
    return {
        "type": "object",
        "description": "One aspect of the object's state.",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": {
                "type": "string",
                "maxLength": 316,
                "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                "description": "Condition type, e.g. Valid, Ready, Degraded, Drifted.",
            },
            "status": {
                "type": "string",
                "enum": ["True", "False", "Unknown"],
                "description": "True, False or Unknown.",
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "minimum": 0,
                "description": "metadata.generation the condition was set for.",
            },
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When the status last changed.",
            },
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                "description": "Why, in CamelCase.",
            },
            "message": {
                "type": "string",
                "maxLength": 32768,
                "description": "Why, for people.",
            },
        },
    }


def _conditions() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "Conditions in Kubernetes conventions.",
        "items": condition_schema(),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }


def _diagnostics(description: str) -> dict[str, Any]:
    """placement.errors.Diagnostic.to_json()."""
    return {
        "type": "array",
        "description": description,
        "items": {
            "type": "object",
            "properties": {
                "source": _string("Where: the file, or the object."),
                "line": _integer("1-based line; 0 for an object read from the apiserver."),
                "column": _integer("1-based column; 0 for an object."),
                "path": _string("Field path, e.g. spec.placements[2].devices[0]."),
                "severity": _string("error or warning."),
                "message": _string("What is wrong."),
                "hint": _string("What to do about it."),
            },
        },
    }


def _status(description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        # Closed, as every schema of a CRD is unless it says x-kubernetes-preserve-unknown-fields:
        # true (the apiserver refuses an explicit false).
        "properties": properties,
    }


def map_status_schema() -> dict[str, Any]:
    slots = {
        "total": "Slots the map declares.",
        "served": "Slots the model serves.",
        "bound": "Slots with a bound pod.",
        "blocked": "Slots that cannot be served now (a missing or unhealthy GPU, a conflict).",
        "drifted": "Bound pods whose binding their slot no longer matches.",
        "renumbered": "Bound pods whose NVML indices now name other GPUs.",
        "unverifiable": "Bound pods signed with a key the key ring no longer holds.",
    }
    return _status(
        "The controller's verdict on the map (written by the leader).",
        {
            "observedGeneration": _integer(
                "metadata.generation of the spec this status is about.", int64=True
            ),
            "phase": {
                "type": "string",
                "enum": [p.value for p in Phase],
                "description": "Valid, Invalid (the last valid version keeps serving), Conflict "
                "or Degraded.",
            },
            "message": _string("The verdict, for people."),
            "conditions": _conditions(),
            "slots": {
                "type": "object",
                "description": "Slot counts.",
                "properties": {name: _integer(text) for name, text in slots.items()},
            },
            "modelGeneration": _integer("Generation of the model that reflects this status."),
            "observedVersion": _string("Digest of the spec that was read."),
            "servingVersion": _string("Digest of the version in service (the last valid)."),
            "revision": _string("Git revision of the version in service, when stamped."),
            "sourceFile": _string("File in git the map came from, when stamped."),
            "rollout": _string("How drifted pods move (set while any is drifted)."),
            "errors": _diagnostics("Why the spec is invalid, with field paths."),
            "warnings": _diagnostics("Warnings on the version in service."),
            "supersedes": _string(
                "The ConfigMap of the same map that this custom resource supersedes, if any."
            ),
            "gang": _gang(),
        },
    )


def _gang() -> dict[str, Any]:
    """placement.status.GangStatus.to_json()."""
    return {
        "type": "object",
        "description": "A gang map's gang while it waits (none of its pods bound until all can "
        "be): how many ranks could be bound now and which slots keep it waiting.",
        "properties": {
            "ranks": _integer("Slots of the gang."),
            "ready": _integer("Slots whose pod could be bound now."),
            "waiting": {
                "type": "array",
                "description": "The slots the gang waits for, in slot order.",
                "items": {
                    "type": "object",
                    "properties": {
                        "slot": _integer("The slot's index (its rank)."),
                        "reason": _string(
                            "Why its pod waits, e.g. NodeCordoned; empty while it has no pod."
                        ),
                    },
                },
            },
            "stuck": {
                "type": "boolean",
                "description": "Whether the gang has waited past its timeoutSeconds.",
            },
            "timeoutSeconds": _integer("The gang's timeoutSeconds."),
        },
    }


def policy_status_schema() -> dict[str, Any]:
    return _status(
        "The controller's verdict on the policy.",
        {
            "observedGeneration": _integer(
                "metadata.generation of the spec this status is about.", int64=True
            ),
            "phase": {
                "type": "string",
                "enum": ["Valid", "Invalid"],
                "description": "Valid, or Invalid (the last valid policy stays in force).",
            },
            "message": _string("The verdict, for people."),
            "conditions": _conditions(),
            "errors": _diagnostics("Why the spec is invalid, with field paths."),
            "supersedes": _string(
                "The ConfigMap form of the policy that this custom resource supersedes, if any."
            ),
        },
    )
