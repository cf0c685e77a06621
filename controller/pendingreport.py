"""Why a pod waits, written where users look: the pod's PodScheduled=False condition (reason and
message, as kube-scheduler writes it) and a Warning Event.

Writes run on the binder's worker threads, and a pod's reason can change again before the last one
is written (ClaimPending, then DeviceBusy a moment later): they go through `SerialWrites`, so the
newest reason is the one left on the pod."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

from controller.serialwrites import SerialWrites
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.events import WARNING, EventRecorder
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.times import now_time
from placement.binding import Status

log = logging.getLogger(__name__)


class PendingReports:
    def __init__(self, kube: Kube, events: EventRecorder, submit: Callable[..., object]) -> None:
        self.kube = kube
        self.events = events
        self._writes = SerialWrites(submit)
        self._lock = threading.Lock()
        self._reported: dict[str, tuple[str, str]] = {}  # uid -> the reason last reported

    def report(self, pod: Pod, status: Status) -> None:
        uid = pod.uid
        with self._lock:
            if self._reported.get(uid) == (status.reason, status.message):
                return
            self._reported[uid] = (status.reason, status.message)
        self._writes.put(uid, partial(self._write_condition, pod, status))

    def forget(self, uid: str) -> None:
        """The pod is bound or gone: a write not started yet is dropped, and its next wait is
        reported afresh."""
        with self._lock:
            self._reported.pop(uid, None)
        self._writes.drop(uid)

    def _write_condition(self, pod: Pod, status: Status) -> None:
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": status.reason,
                        "message": status.message,
                        "lastTransitionTime": now_time(),
                        "lastProbeTime": None,
                    }
                ]
            }
        }
        try:
            self.kube.patch(
                PODS.item(pod.name, pod.namespace, "status"),
                body,
                content_type="application/strategic-merge-patch+json",
            )
        except APIError as exc:
            log.info("condition not written: %s", exc)
        self.events.emit(pod.ref, WARNING, status.reason, status.message)
