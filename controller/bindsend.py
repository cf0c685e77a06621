"""The binder's sending step: an assumed decision's writes, from the request loop.

Every Binding leaves from one request loop (kubeio/loop.py), and in dra enforcement so does the
claim's Reserve (its status write) right before it; `drain` ends the sending before the
leadership's Lease may be released (docs/architecture.md, Threads: leadership ends before its
Lease does).
Writes that are not Bindings (Events, deferred reports, a claim's writes before its Reserve, the
Unreserve after a failed Binding) go to `SideWrites`' threads instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from controller.dra import ClaimWriter
from controller.metrics import ControllerMetrics
from controller.pendingreport import PendingReports
from controller.queue import SchedulingQueue
from controller.settings import BinderSettings
from controller.slotcache import SlotCache
from kubeio import bodies
from kubeio.client import Obj, Response
from kubeio.errors import APIConflictError, APIError, APINotFoundError, FencedError
from kubeio.loop import Sender, answer_error
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.requests import Request, prepare
from placement.annotations import signed_binding
from placement.binding import Placement
from placement.draalloc import ClaimPlan
from placement.keyring import RingKey
from placement.types import SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)

#: Threads for the writes that stay off the request loop, none of them a Binding: Events and
#: deferred reports, a claim's writes before its Reserve (clearing an allocation, the finalizer),
#: the Unreserve after a failed Binding.
SIDE_THREADS = 16


class SideWrites:
    """The threads for the writes that stay off the request loop (never a Binding)."""

    def __init__(self, threads: int = SIDE_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="bind-side")

    def run(self, fn: Callable[..., object], *args: Any) -> None:
        """Runs a write that stays off the request loop (never a Binding) on the side threads;
        dropped once the binder stops, as the write would find its leadership over."""
        try:
            future = self._pool.submit(fn, *args)
        except RuntimeError:
            return  # stopped
        future.add_done_callback(_log_failure)

    def shutdown(self, wait: bool = False) -> None:
        """No write after this; one in progress ends on its own (`wait`: waits for it)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


@dataclass(eq=False)
class Waiting:
    """The pods waiting for the binder and the set in flight, both under `lock`: written by the
    informer threads (`Binder.on_pod`) and the binder's threads, read by the claims informer."""

    pods: dict[str, Pod] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Dispatcher:
    """Sends assumed decisions (`dispatch`) from the request loop and settles each on its answer:
    confirmed when the Binding succeeds, forgotten when it fails (every assume has a forget).

    Contract: `dispatch` runs on the binder's thread, the answers on the loop's thread or a side
    thread; `waiting` (its own lock) holds the pods in flight; the slot cache and the queue have
    locks of their own. Pods parked for the Lease (`fenced`) wake once `fence` holds again
    (`lease_returned`, from the binder's thread).
    """

    def __init__(
        self,
        settings: BinderSettings,
        metrics: ControllerMetrics,
        cache: SlotCache,
        queue: SchedulingQueue,
        pending: PendingReports,
        waiting: Waiting,
        side: SideWrites,
        new_sender: Callable[[], Sender],
        fence: Callable[[], bool],
        signer: Callable[[], RingKey],
        on_bound: Callable[[SlotKey], None],
        stopped: threading.Event,
        claims: ClaimWriter | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.cache = cache
        self.queue = queue
        self.pending = pending
        self._pods, self._in_flight, self._lock = waiting.pods, waiting.in_flight, waiting.lock
        self._off_loop = side.run
        self._new_sender = new_sender
        #: Whether this process holds the leader lease now (LeaderElector.holds): checked right
        #: before each Binding, so a leader that was paused past its lease sends none.
        self.fence = fence
        self._signer = signer
        self.on_bound = on_bound
        self._stop = stopped
        self.claims = claims
        #: Where every Binding goes out from, `bind_workers` in flight (opened by `open_loop`,
        #: drained and closed by `drain`).
        self._loop: Sender | None = None
        self._loop_lock = threading.Lock()
        #: Set when a pod was parked for the Lease (`fenced`); the binder's thread wakes them
        #: once `fence` says the Lease is held again.
        self._waiting_for_lease = threading.Event()

    def open_loop(self) -> Sender | None:
        """The request loop the Bindings go out from (opened on first use; None once stopped)."""
        with self._loop_lock:
            if self._loop is None and not self._stop.is_set():
                self._loop = self._new_sender()
            return self._loop

    def alive(self) -> bool:
        """The request loop runs (or was not opened yet)."""
        loop = self._loop
        return loop is None or loop.alive()

    def drain(self) -> bool:
        """Closes the request loop after up to `drain_seconds` for the answers to what it
        wrote; True when every one was answered."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return True
        drained = loop.drain(self.settings.drain_seconds)
        if not drained:
            log.warning(
                "Bindings still unanswered %.1f s after the leadership ended",
                self.settings.drain_seconds,
            )
        loop.close()
        return drained

    def dispatch(self, uid: str, pod: Pod, placement: Placement, claim: ClaimPlan | None) -> None:
        """Sends an assumed decision's writes from the request loop: the Binding, after (dra) the
        claim's Reserve. A claim that needs writes before its status (an allocation to clear,
        the finalizer not written yet) gets them on a side thread first."""
        loop = self.open_loop()
        if loop is None:
            self._failed(uid, pod, None, FencedError(0, "Fenced", "the binder stopped"))
            return
        if claim is None or claim.done or self.claims is None:
            self._send(loop, uid, pod, placement, claim)
            return
        reserve = self.claims.reserve_request(claim, pod)
        if reserve is not None:
            self._reserve_and_send(loop, uid, pod, placement, claim, reserve)
            return
        self._off_loop(self._prepare_claim, loop, uid, pod, placement, claim)

    def _prepare_claim(
        self, loop: Sender, uid: str, pod: Pod, placement: Placement, claim: ClaimPlan
    ) -> None:
        """dra, on a side thread: the claim's writes before its Reserve; then the Reserve and the
        Binding from the loop, as for any claim."""
        assert self.claims is not None
        try:
            if self._stop.is_set() or not self.fence():
                raise FencedError(0, "Fenced", "lease not held")
            version = self.claims.prepare(claim)
        except FencedError as exc:
            self._failed(uid, pod, None, exc)
            return
        except APIError as exc:
            self._claim_refused(uid, pod, exc)
            return
        reserve = self.claims.status_request(claim, pod, version)
        self._reserve_and_send(loop, uid, pod, placement, claim, reserve)

    def _claim_refused(self, uid: str, pod: Pod, exc: APIError) -> None:
        """The claim changed since the decision (regenerated, deallocated): decided again from
        what the claims informer shows next."""
        self.metrics.binds.labels("claim-refused").inc()
        log.info("claim not allocated: %s", exc, extra={"pod": pod.key})
        self.cache.forget(uid)
        self.finish(uid, requeue=True)

    def _reserve_and_send(
        self,
        loop: Sender,
        uid: str,
        pod: Pod,
        placement: Placement,
        claim: ClaimPlan,
        reserve: Request,
    ) -> None:
        """dra: the claim's status (Reserve, as one write) and then the Binding, both from the
        request loop."""

        def reserved(answer: Response | APIError) -> None:
            error = answer_error(answer)
            if error is None:
                self._send(loop, uid, pod, placement, claim)
            elif isinstance(error, FencedError):
                self._failed(uid, pod, None, error)
            else:
                self._claim_refused(uid, pod, error)

        loop.submit(reserve, reserved, guard=self.fence)

    def _send(
        self,
        loop: Sender,
        uid: str,
        pod: Pod,
        placement: Placement,
        claim: ClaimPlan | None = None,
    ) -> None:
        """The Binding from the request loop, which asks the fence right before writing it; its
        outcome comes back on the loop's thread. A failure that may unreserve a claim (a write)
        is handled on a side thread, not on the loop."""
        body = binding_body(pod, placement, self._signer())
        request = prepare("POST", PODS.item(pod.name, pod.namespace, "binding"), body=body)

        def done(answer: Response | APIError) -> None:
            error = answer_error(answer)
            if error is None:
                self._bound(uid, placement)
            elif claim is None:
                self._failed(uid, pod, None, error)
            else:
                self._off_loop(self._failed, uid, pod, claim, error)

        loop.submit(request, done, guard=self.fence)

    def _failed(self, uid: str, pod: Pod, claim: ClaimPlan | None, exc: APIError) -> None:
        """The Binding was not stored (or may not have been): the assumed decision is forgotten."""
        if isinstance(exc, FencedError):
            # The decision came from a cache that another leader may already have outdated.
            # Decided again once the lease is held: by this process if a late renewal keeps it,
            # else the binder stops with the lost leadership and the next leader decides.
            self.metrics.binds.labels("fenced").inc()
            log.debug("lease not held: Binding not sent", extra={"pod": pod.key})
            self.cache.forget(uid)
            self.finish(uid, requeue=False)
            self.fenced(uid)
            return
        if isinstance(exc, (APINotFoundError, APIConflictError)):
            # Gone, recreated, or already bound by someone else: the pod's next event decides.
            self.metrics.binds.labels("conflict").inc()
            log.info("bind refused: %s", exc, extra={"pod": pod.key})
            if isinstance(exc, APINotFoundError):
                # A pod already bound (409) keeps its claim; a deleted one loses it with the pod.
                self._unreserve(claim)
            self.cache.forget(uid)
            self.finish(uid, requeue=False)
            return
        self.metrics.binds.labels("error").inc()
        log.warning("bind failed: %s", exc, extra={"pod": pod.key})
        if 400 <= exc.status < 500:
            # Refused, so surely not bound. After a timeout or a 5xx the Binding may have
            # been stored: the allocation stays, and the retry finds it done and reuses it.
            self._unreserve(claim)
        self.cache.forget(uid)
        self.finish(uid, requeue=True)

    def _bound(self, uid: str, placement: Placement) -> None:
        """The Binding was stored: the assumed decision is confirmed."""
        self.metrics.binds.labels("bound").inc()
        started = self.queue.added_at.get(uid)
        if started is not None:
            self.metrics.bind_latency.observe(time.monotonic() - started)
        self.queue.remove(uid)
        self.queue.succeeded(uid)
        self.cache.confirm(uid)
        with self._lock:
            self._in_flight.discard(uid)
            self._pods.pop(uid, None)
            self.metrics.pending.set(len(self._pods))
        self.pending.forget(uid)
        self.on_bound(placement.slot)

    def lease_returned(self) -> None:
        """Wakes the pods parked for the Lease once it is held again."""
        if self._waiting_for_lease.is_set() and self.fence():
            self._waiting_for_lease.clear()
            self.queue.wake([WakeKey.lease()])

    def fenced(self, uid: str) -> None:
        """A pod not decided or not bound because the Lease was not held: nothing about the pod
        refused it, so it waits for the Lease, not for a backoff that grows with each lapse (a
        leader whose renewals run late under load would otherwise push its whole backlog out to
        the maximum backoff). If the Lease is lost, the binder stops and the next leader decides."""
        with self._lock:
            if uid not in self._pods:
                return  # bound meanwhile, or gone
        self.queue.unschedulable(uid, frozenset({WakeKey.lease()}))
        if not self._waiting_for_lease.is_set():
            log.warning("lease not held: decisions and Bindings wait until it is renewed")
            self._waiting_for_lease.set()

    def _unreserve(self, claim: ClaimPlan | None) -> None:
        """Every reserve has an unreserve when its bind fails, so no claim keeps devices for a
        pod that is not bound; a failure here leaves it to kube-controller-manager (pod gone) or
        to the pod's next decision, which reallocates a claim that differs."""
        if claim is None or self.claims is None:
            return
        try:
            self.claims.unreserve(claim)
        except APIError as exc:
            log.warning(
                "claim %s/%s not unreserved: %s", claim.claim.namespace, claim.claim.name, exc
            )

    def finish(self, uid: str, requeue: bool) -> None:
        with self._lock:
            self._in_flight.discard(uid)
            still_pending = uid in self._pods
        if requeue and still_pending:
            self.queue.backoff(uid)


def binding_body(pod: Pod, placement: Placement, signer: RingKey) -> Obj:
    annotations = signed_binding(
        signer.secret, signer.id, pod.uid, pod.namespace, placement.decision
    )
    return bodies.binding(pod.name, pod.namespace, pod.uid, placement.decision.node, annotations)


def _log_failure(future: Future[object]) -> None:
    error = future.exception() if not future.cancelled() else None
    if error is not None:
        log.error("a write off the request loop failed", exc_info=error)
