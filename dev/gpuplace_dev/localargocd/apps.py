"""Reading an ArgoCD Application's state: sync, health, the last operation, its conditions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeio.paths import Resource

APPLICATIONS = Resource("argoproj.io", "v1alpha1", "applications")
APPLICATIONSETS = Resource("argoproj.io", "v1alpha1", "applicationsets")
REFRESH_ANNOTATION = "argocd.argoproj.io/refresh"


@dataclass(frozen=True)
class AppState:
    """What `argocd app get` shows first: sync status and revision, health, the last operation."""

    name: str
    sync: str
    revision: str
    health: str
    health_message: str
    operation: str
    operation_revision: str
    operation_message: str
    conditions: tuple[str, ...]
    resources: tuple[tuple[str, str, str, str], ...]  # kind, namespace/name, sync, health
    #: What the last sync attempt said of each resource it did not sync: "<kind> <ns>/<name>: ...".
    unsynced: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, app: dict[str, Any]) -> AppState:
        status = app.get("status") or {}
        sync = status.get("sync") or {}
        health = status.get("health") or {}
        op = status.get("operationState") or {}
        result = op.get("syncResult") or {}
        resources = tuple(
            (
                str(r.get("kind", "")),
                f"{r.get('namespace', '')}/{r.get('name', '')}".lstrip("/"),
                str(r.get("status", "")),
                str((r.get("health") or {}).get("status", "")),
            )
            for r in status.get("resources") or []
        )
        return cls(
            name=app["metadata"]["name"],
            sync=str(sync.get("status", "")),
            revision=str(sync.get("revision", "")),
            health=str(health.get("status", "")),
            health_message=str(health.get("message", "")),
            operation=str(op.get("phase", "")),
            operation_revision=str(result.get("revision", "")),
            operation_message=str(op.get("message", "")),
            conditions=tuple(
                f"{c.get('type')}: {c.get('message')}" for c in status.get("conditions") or []
            ),
            resources=resources,
            unsynced=tuple(
                f"{r.get('kind')} {r.get('namespace')}/{r.get('name')}: {r.get('message')}"
                for r in result.get("resources") or []
                if r.get("status") not in (None, "Synced")
            ),
        )

    @property
    def attempt_ended(self) -> bool:
        """The last sync attempt is over: the operation ended, or it failed and waits to retry."""
        return self.operation in ("Succeeded", "Failed", "Error") or self.attempt_failed

    @property
    def attempt_failed(self) -> bool:
        """The last sync attempt failed (ArgoCD may retry it: phase Running, 'Retrying attempt')."""
        return self.operation in ("Failed", "Error") or (
            self.operation == "Running" and "Retrying attempt" in self.operation_message
        )

    def resource_health(self, kind: str, name: str) -> str:
        """The health ArgoCD reports for one resource ('' when it is not part of the app)."""
        return next((h for k, n, _, h in self.resources if k == kind and n == name), "")

    def resource_sync(self, kind: str, name: str) -> str:
        return next((s for k, n, s, _ in self.resources if k == kind and n == name), "")

    def line(self) -> str:
        """One line for logs: `sync Synced @ abc1234, health Healthy, last sync Succeeded @ ...`."""
        text = (
            f"Application {self.name}: sync {self.sync or '-'} @ {self.revision[:7] or '-'}, "
            f"health {self.health or '-'}"
        )
        if self.operation:
            phase = "Failed, retrying" if self.attempt_failed else self.operation
            text += f", last sync {phase} @ {self.operation_revision[:7] or '-'}"
        return text

    def describe(self) -> str:
        """`line` plus the messages and every resource's sync and health, for failures."""
        lines = [self.line()]
        if self.health_message:
            lines.append(f"health: {self.health_message}")
        if self.operation_message:
            lines.append(f"last sync: {self.operation_message}")
        lines += [f"condition {c}" for c in self.conditions]
        lines += [f"{k} {n}: {s or '-'}, {h or '-'}" for k, n, s, h in self.resources]
        return "\n".join(lines)
