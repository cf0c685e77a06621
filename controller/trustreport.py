"""Bound pods whose binding the key ring does not verify, reported where operators look.

- Forged (placement/keyring.py): holds nothing; a Warning Event `BindingUnverified` once per pod
  and `gpuplace_unverified_bindings_total`.
- Unverifiable (signed with a key the ring no longer holds): holds its GPUs, fail closed; a
  Warning Event `BindingUnverifiable`, the pod condition `gpuplace.io/BindingUnverifiable=True`
  (what `gpuplace status` shows), `gpuplace_unverifiable_bindings`, and a count in its map's status.
  When it is adopted (`gpuplace key adopt`) or its key is back in the ring, the condition turns
  False and a Normal Event says so.

Contract: `judged` and `gone` run on informer threads and the leader's start-up thread, the
readers (`count`, `total`) on the status queue's worker; every method takes `_lock`. Condition and
Event writes go to a small executor, so a slow apiserver never holds up an informer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from controller.serialwrites import SerialWrites
from kubeio.client import Kube
from kubeio.errors import APIError, APINotFoundError
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.paths import PODS
from kubeio.times import now_time
from placement.annotations import UNVERIFIABLE_CONDITION
from placement.keyring import Trust, Verdict
from placement.reasons import EventReason
from placement.types import MapKey

log = logging.getLogger(__name__)

FORGED_REASON = EventReason.BINDING_UNVERIFIED
UNVERIFIABLE_REASON = EventReason.BINDING_UNVERIFIABLE
ADOPTED_REASON = EventReason.BINDING_ADOPTED
VERIFIED_REASON = EventReason.BINDING_VERIFIED


@dataclass(frozen=True, slots=True)
class Judged:
    ref: ObjectRef
    map: MapKey | None  # the map of its binding, when the annotations name one
    verdict: Verdict


class TrustReport:
    def __init__(
        self,
        kube: Kube,
        events: EventRecorder,
        on_unverifiable: Callable[[int], None] = lambda _n: None,  # gauge: how many now
        on_forged: Callable[[], None] = lambda: None,  # counter: one more forged binding seen
        on_map: Callable[[MapKey], None] = lambda _key: None,
    ) -> None:
        #: Called with the map of a pod whose count of unverifiable bindings changed (its status
        #: is rewritten).
        self.on_map = on_map
        self.kube = kube
        self.events = events
        self.on_unverifiable = on_unverifiable
        self.on_forged = on_forged
        self._lock = threading.Lock()
        self._unverifiable: dict[str, Judged] = {}  # by pod uid
        self._forged: set[str] = set()
        #: pods that were reported unverifiable in this process or carry the condition: their
        #: condition is turned False when their binding is verified or adopted.
        self._flagged: set[str] = set()
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="trust")
        #: A pod's condition written True, then False (adopted), must land in that order.
        self._writes = SerialWrites(self._executor.submit)

    def judged(self, pod: Judged, flagged: bool = False) -> None:
        """The verdict on a bound pod; `flagged`: its condition says unverifiable now."""
        uid = pod.ref.uid
        trust = pod.verdict.trust
        with self._lock:
            if flagged:
                self._flagged.add(uid)
            if trust is Trust.FORGED:
                first = uid not in self._forged
                self._forged.add(uid)
                if first:
                    self._executor.submit(self._forged_event, pod)
                return
            self._forged.discard(uid)
            if trust is Trust.UNVERIFIABLE:
                # Written once; not again by a new leader that finds the condition already True.
                first = uid not in self._unverifiable
                write = first and not flagged
                self._unverifiable[uid] = pod
                self._flagged.add(uid)
                count = len(self._unverifiable)
            else:
                first = write = False
                was = self._unverifiable.pop(uid, None) is not None
                cleared = uid in self._flagged
                self._flagged.discard(uid)
                count = len(self._unverifiable)
                if not (was or cleared):
                    return
        if trust is Trust.UNVERIFIABLE:
            if first:
                self.on_unverifiable(count)
                if pod.map is not None:
                    self.on_map(pod.map)
            if write:
                self._writes.put(uid, partial(self._write, pod, True))
            return
        self.on_unverifiable(count)
        if pod.map is not None:
            self.on_map(pod.map)
        self._writes.put(uid, partial(self._write, pod, False))

    def gone(self, uid: str) -> None:
        with self._lock:
            self._forged.discard(uid)
            self._flagged.discard(uid)
            was = self._unverifiable.pop(uid, None)
            count = len(self._unverifiable)
        if was is not None:
            self.on_unverifiable(count)
            if was.map is not None:
                self.on_map(was.map)

    def count(self, key: MapKey) -> int:
        with self._lock:
            return sum(1 for j in self._unverifiable.values() if j.map == key)

    def total(self) -> int:
        with self._lock:
            return len(self._unverifiable)

    def unverifiable(self) -> list[Judged]:
        with self._lock:
            return sorted(self._unverifiable.values(), key=lambda j: (j.ref.namespace, j.ref.name))

    def _forged_event(self, pod: Judged) -> None:
        self.on_forged()
        why = pod.verdict.why(f"{pod.ref.namespace}/{pod.ref.name}")
        log.warning("unverified binding: %s", why)
        self.events.emit(pod.ref, WARNING, FORGED_REASON, why)

    def _write(self, pod: Judged, unverifiable: bool) -> None:
        name = f"{pod.ref.namespace}/{pod.ref.name}"
        if unverifiable:
            status, reason, kind = "True", UNVERIFIABLE_REASON, WARNING
            message = pod.verdict.why(name)
            log.warning("unverifiable binding: %s", message)
        else:
            status, kind = "False", NORMAL
            if pod.verdict.trust is Trust.ADOPTED:
                reason = ADOPTED_REASON
                message = f"pod {name}: its binding was re-adopted (`gpuplace key adopt`)"
            else:
                reason = VERIFIED_REASON
                message = f"pod {name}: its binding verifies under the key ring again"
            log.info("%s", message)
        condition = {
            "type": UNVERIFIABLE_CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_time(),
        }
        # The uid makes the write fail on a pod recreated under the same name (uid is immutable).
        body = {"metadata": {"uid": pod.ref.uid}, "status": {"conditions": [condition]}}
        try:
            self.kube.patch(
                PODS.item(pod.ref.name, pod.ref.namespace, "status"),
                body,
                content_type="application/strategic-merge-patch+json",
            )
        except APINotFoundError:
            return
        except APIError as exc:
            log.warning("condition %s of %s not written: %s", UNVERIFIABLE_CONDITION, name, exc)
        self.events.emit(pod.ref, kind, reason, message)

    def stop(self, *, drain: bool = False) -> None:
        """Stops writing (leadership lost): what is queued is dropped, unless `drain` asks for
        every queued write to be made first."""
        if not drain:
            self._writes.drop_all()
        self._executor.shutdown(wait=drain, cancel_futures=not drain)
