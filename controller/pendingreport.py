"""Why a pod waits, written where users look: the pod's PodScheduled=False condition (reason and
message, as kube-scheduler writes it) and a Warning Event.

Writes run on the binder's worker threads, and a pod's reason can change again before the last one
is written (ClaimPending, then DeviceBusy a moment later): they go through `SerialWrites`, so the
newest reason is the one left on the pod.

Some waits are normally over within milliseconds: a pod seen before kube-controller-manager has
generated its ResourceClaim (ClaimPending). Reporting each would cost two writes per pod (the
condition and the Event) in every burst, so a reason of `delays` is reported only if the pod still
waits for it that long after it was first seen waiting for it; `flush_due` (the binder's thread)
writes those that are due. A pod decided otherwise meanwhile (`settle`: placed; `report`: another
reason) or bound or gone (`forget`) gets no such report.

Contract: `report`, `settle` and `flush_due` run on the binder's decision thread, `forget` on
informer and bind worker threads; `_lock` guards `_reported`, `_deferred` and `_due`, and a write
is queued under it, so that a `forget` after it drops the write if no worker has started it."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from controller.serialwrites import SerialWrites
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.events import WARNING, EventRecorder
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.times import now_time
from placement.binding import Status
from placement.reasons import Reason

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Deferred:
    pod: Pod
    status: Status  # the newest decision's (its message may name more than the first)
    due: float


class PendingReports:
    def __init__(
        self,
        kube: Kube,
        events: EventRecorder,
        submit: Callable[..., object],
        delays: Mapping[Reason, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.events = events
        self._writes = SerialWrites(submit)
        self._delays = dict(delays or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._reported: dict[str, tuple[str, str]] = {}  # uid -> the reason last reported
        self._deferred: dict[str, _Deferred] = {}  # uid -> a report not due yet
        self._due: list[tuple[float, str]] = []  # (due, uid), a heap; stale entries skipped
        #: The earliest `due` in `_deferred` (inf: none); read without the lock by `next_due`.
        self._next_due = float("inf")

    def report(self, pod: Pod, status: Status) -> None:
        uid = pod.uid
        delay = self._delays.get(status.reason)
        with self._lock:
            reported = self._reported.get(uid)
            if reported == (status.reason, status.message):
                self._deferred.pop(uid, None)
                return
            # Deferred unless that reason is on the pod already (its message changed).
            if delay and (reported is None or reported[0] != status.reason):
                deferred = self._deferred.get(uid)
                if deferred is None or deferred.status.reason != status.reason:
                    due = self._clock() + delay
                    self._deferred[uid] = _Deferred(pod, status, due)
                    heapq.heappush(self._due, (due, uid))
                    self._next_due = min(self._next_due, due)
                    return
                deferred.pod, deferred.status = pod, status
                if self._clock() < deferred.due:
                    return
            self._deferred.pop(uid, None)
            self._reported[uid] = (status.reason, status.message)
            # Queued under the lock: a `forget` that follows drops it if it has not started.
            self._writes.put(uid, partial(self._write_condition, pod, status))

    def settle(self, uid: str) -> None:
        """The pod was placed: a report not due yet is dropped."""
        if self._deferred:
            with self._lock:
                self._deferred.pop(uid, None)

    def forget(self, uid: str) -> None:
        """The pod is bound or gone: a write not started yet is dropped, and its next wait is
        reported afresh."""
        with self._lock:
            self._reported.pop(uid, None)
            self._deferred.pop(uid, None)
        self._writes.drop(uid)

    def next_due(self) -> float:
        """When the earliest deferred report is due (the clock's time; inf when none)."""
        return self._next_due

    def flush_due(self) -> int:
        """Writes the deferred reports that are due; returns how many."""
        now = self._clock()
        if now < self._next_due:
            return 0
        written = 0
        with self._lock:
            while self._due and self._due[0][0] <= now:
                when, uid = heapq.heappop(self._due)
                deferred = self._deferred.get(uid)
                if deferred is None or deferred.due != when:
                    continue  # settled, forgotten, or deferred again since
                del self._deferred[uid]
                self._reported[uid] = (deferred.status.reason, deferred.status.message)
                write = partial(self._write_condition, deferred.pod, deferred.status)
                self._writes.put(uid, write)
                written += 1
            self._next_due = self._due[0][0] if self._due else float("inf")
        return written

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
