"""Events (core/v1) with a small de-duplication cache so a retrying pod does not flood etcd."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from kubeio.client import Kube, Obj
from kubeio.errors import APIError
from kubeio.paths import EVENTS
from kubeio.times import now_time

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: Obj) -> ObjectRef:
        meta = obj.get("metadata", {})
        return cls(
            str(obj.get("kind", "")),
            str(meta.get("namespace", "")),
            str(meta["name"]),
            str(meta.get("uid", "")),
            str(obj.get("apiVersion", "v1")),
        )


class EventRecorder:
    def __init__(self, kube: Kube, component: str, dedupe_seconds: float = 60.0) -> None:
        self.kube = kube
        self.component = component
        self.dedupe_seconds = dedupe_seconds
        self._seen: dict[tuple[str, str, str, str], float] = {}
        self._lock = threading.Lock()

    def emit(self, ref: ObjectRef, event_type: str, reason: str, message: str) -> None:
        key = (ref.namespace, ref.name, reason, message)
        now = time.monotonic()
        with self._lock:
            if now - self._seen.get(key, -1e9) < self.dedupe_seconds:
                return
            self._seen[key] = now
            if len(self._seen) > 10_000:
                cutoff = now - self.dedupe_seconds
                self._seen = {k: t for k, t in self._seen.items() if t > cutoff}
        namespace = ref.namespace or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {
                "kind": ref.kind,
                "namespace": ref.namespace,
                "name": ref.name,
                "uid": ref.uid,
                "apiVersion": ref.api_version,
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now_time(),
            "lastTimestamp": now_time(),
            "count": 1,
        }
        try:
            self.kube.create(EVENTS.collection(namespace), body)
        except APIError as exc:
            log.info("event not recorded: %s", exc)
