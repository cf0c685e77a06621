"""The binder: one decision thread, one request loop for every Binding.

Decisions are serialized (slot and GPU choices never race); each accepted decision is assumed in the
cache before its Binding is sent, and forgotten if the Binding fails. A pod that cannot be placed gets
PodScheduled=False with the reason, an Event, and waits for the objects its status names.

Every Binding leaves from the request loop (kubeio/loop.py), and in dra enforcement so does the
claim's Reserve (its status write) right before it: one path, which `stop` drains before the
leadership's Lease may be released (DESIGN.md, Trust: leadership ends before the lease does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from controller import podfacts
from controller.claimfinalizers import ClaimFinalizers
from controller.dra import ClaimWriter, DraTracker
from controller.metrics import ControllerMetrics
from controller.pendingreport import PendingReports
from controller.queue import SchedulingQueue
from controller.settings import BinderSettings
from controller.slotcache import Conflict, Holding, SlotCache
from controller.trustreport import TrustReport
from kubeio import bodies
from kubeio.client import Kube, Obj, Response
from kubeio.errors import APIConflictError, APIError, APINotFoundError, FencedError
from kubeio.events import WARNING, EventRecorder
from kubeio.loop import RequestLoop, Sender, answer_error
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.requests import Request, prepare
from placement.annotations import signed_binding
from placement.binding import Cluster, Code, Placement, PodFacts, Status, plan
from placement.draalloc import ClaimPlan
from placement.keyring import RingKey, TrustView
from placement.reasons import EventReason, Reason
from placement.types import MapKey, SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)

#: Threads for the writes that stay off the request loop, none of them a Binding: Events and
#: deferred reports, a claim's writes before its Reserve (clearing an allocation, the finalizer),
#: the Unreserve after a failed Binding.
SIDE_THREADS = 16


def binding_body(pod: Pod, placement: Placement, signer: RingKey) -> Obj:
    annotations = signed_binding(
        signer.secret, signer.id, pod.uid, pod.namespace, placement.decision
    )
    return bodies.binding(pod.name, pod.namespace, pod.uid, placement.decision.node, annotations)


class Binder:
    """Decides on one thread, binds from one request loop (`bind_workers` Bindings in flight).

    Contract: informer threads feed pods (`on_pod`, `rebuild`) and wake keys (`wake`); the binder
    thread pops and decides (`_decide`), the only place a slot or GPU is chosen, so decisions never
    race. `_lock` guards the pending pods and the set in flight; the slot cache and the queue have
    locks of their own. A decision is assumed in the cache before its Binding is sent and is
    confirmed when the Binding succeeds or forgotten when it fails (every assume has a forget).
    In dra enforcement, `finalizers` (claimfinalizers.py) protects each pod's claim on threads of
    its own from the moment the claim is seen, so that Reserve normally is the claim's status
    write alone, sent from the loop right before the Binding.
    """

    def __init__(
        self,
        kube: Kube,
        settings: BinderSettings,
        metrics: ControllerMetrics,
        events: EventRecorder,
        cluster: Callable[[], Cluster],
        on_bound: Callable[[SlotKey], None] = lambda _key: None,  # a slot was bound or freed
        dra: DraTracker | None = None,  # `dra` enforcement: claims are allocated before binding
        fence: Callable[[], bool] = lambda: True,
        sender: Callable[[], Sender] | None = None,  # the Bindings' loop (tests: a fake)
    ) -> None:
        self.kube = kube
        #: Whether this process holds the leader lease now (LeaderElector.holds): checked right
        #: before each Binding, so a leader that was paused past its lease sends none.
        self.fence = fence
        self._new_sender = sender or (
            lambda: RequestLoop(kube, settings.bind_workers, name="bind-loop")
        )
        #: Where every Binding goes out from, `bind_workers` in flight (opened by `prepare` or
        #: `start`, drained and closed by `stop`).
        self._loop: Sender | None = None
        self._loop_lock = threading.Lock()
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.cluster = cluster
        self.on_bound = on_bound
        self.dra = dra
        #: dra enforcement: each claim's finalizer, written when the claim is first seen (leader
        #: only: between `start` and `stop`), so that Reserve writes only the claim's status.
        self.finalizers: ClaimFinalizers | None = None
        self.claims: ClaimWriter | None = None
        if dra is not None:
            self.finalizers = ClaimFinalizers(
                kube,
                fence=fence,
                serves=self._serves,
                latest=dra.claim,
                count=lambda when: metrics.claim_finalizers.labels(when.value).inc(),
            )
            self.claims = ClaimWriter(kube, dra.settings, self.finalizers)
        self.cache = SlotCache(self._may_share)
        #: The binding key ring and adoption records (controller/bindingkey.py): set by the
        #: leader before `rebuild`, swapped whole by `retrust` when the Secret changes.
        self.trust: TrustView | None = None
        self.report = TrustReport(kube, events, metrics.unverifiable.set, metrics.unverified.inc)
        self._not_granted: set[str] = set()  # pre-bound legacy pods already reported as such
        self.queue = SchedulingQueue(max_backoff=settings.max_backoff_seconds)
        self._pods: dict[str, Pod] = {}
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._side = ThreadPoolExecutor(SIDE_THREADS, thread_name_prefix="bind-side")
        self.pending = PendingReports(
            kube,
            events,
            self._off_loop,
            delays={Reason.CLAIM_PENDING: settings.claim_pending_report_seconds},
        )
        self._stop = threading.Event()
        #: Set when a pod was parked for the Lease (`_fenced`); the binder's thread wakes them
        #: once `fence` says the Lease is held again.
        self._waiting_for_lease = threading.Event()
        self._thread: threading.Thread | None = None
        self.active = threading.Event()

    # -- feeding -------------------------------------------------------------------------------
    def rebuild(self, pods: Iterable[Pod], shared_maps: set[str]) -> int:
        """Rebuilds the slot cache from bound pods' annotations; queues the unbound ones."""
        count = 0
        for pod in pods:
            self.on_pod("ADDED", pod, shared_maps)
            if pod.bound:
                count += 1
        return count

    def on_pod(
        self,
        event: str,
        pod: Pod,
        shared_maps: set[str] | None = None,
        bound: podfacts.BoundPod | None = None,
    ) -> None:
        """One pod event. `bound`: the pod's binding as its event's other readers see it (read
        here when not given), so that it is decoded and judged once."""
        uid = pod.uid
        if event == "DELETED" or pod.finished:
            with self._lock:
                self._pods.pop(uid, None)
            self._release(uid)
            return
        if pod.bound:
            with self._lock:
                self._pods.pop(uid, None)
            self.queue.remove(uid)
            self.pending.forget(uid)
            held = self.cache.holding(uid)
            if held is not None:
                if held.assumed:
                    self.cache.confirm(uid)
                    self.on_bound(held.slot)
            else:
                self._hold_bound(bound or podfacts.BoundPod(pod, self.trust), shared_maps or set())
            return
        if pod.deleting:
            return
        with self._lock:
            self._pods[uid] = pod
            if uid in self._in_flight:
                return
        self.queue.add(uid)
        self.metrics.pending.set(len(self._pods))
        if self.finalizers is not None and self.dra is not None and self._thread is not None:
            # The claims informer may have shown the pod's claim before this pod event.
            claim = self.dra.unprotected_claim_of(pod)
            if claim is not None:
                self.finalizers.want(claim)

    def _serves(self, uid: str) -> bool:
        """Whether `uid` is a pod waiting for this binder (read by the claims informer)."""
        return uid in self._pods

    def _adopt_prebound(self, uid: str, pod: Pod) -> Holding | None:
        """A pod the earlier tools bound: it holds the GPUs its legacy line declares, so that no
        map pod is bound onto them (unless its namespace's grants do not give it those GPUs)."""
        adopted = podfacts.prebound_legacy(pod, self.cluster())
        if isinstance(adopted, str):
            if uid not in self._not_granted:
                self._not_granted.add(uid)
                self._off_loop(self.events.emit, pod.ref, WARNING, Reason.NOT_GRANTED, adopted)
            return None
        if adopted is not None:
            self.metrics.prebound.inc()
        return adopted

    def _hold_bound(self, bound: podfacts.BoundPod, shared_maps: set[str]) -> None:
        """A bound pod the cache does not hold yet: holds what its binding proves (or, when the
        ring cannot disprove it, what it claims), reported when the ring does not verify it."""
        if bound.trust is None:
            raise RuntimeError("the binder judged a bound pod before the key ring was loaded")
        holding = bound.holding(shared_maps)
        if holding is None and self.settings.legacy:
            holding = self._adopt_prebound(bound.uid, bound.pod)
        if holding is not None:
            self._report_conflicts(bound.pod, self.cache.add_bound(holding))
            self.on_bound(holding.slot)
        self.report.judged(bound.judged(), podfacts.flagged_unverifiable(bound.pod))

    def retrust(self, trust: TrustView, bound: Iterable[Pod], shared_maps: set[str]) -> None:
        """The key ring or the adoption records changed: every bound pod is judged again. A pod
        that holds now and did not is added, one that no longer holds is released."""
        self.trust = trust
        for pod in bound:
            if pod.finished or not pod.bound:
                continue
            uid = pod.uid
            held = self.cache.holding(uid)
            read = podfacts.BoundPod(pod, trust)
            if held is None:
                self._hold_bound(read, shared_maps)
                continue
            if held.assumed:
                continue  # bound by this leader a moment ago: signed with its key
            if not read.holds:
                self._release(uid)
            self.report.judged(read.judged(), podfacts.flagged_unverifiable(pod))

    def _release(self, uid: str) -> None:
        self._not_granted.discard(uid)
        self.report.gone(uid)
        self.queue.remove(uid)
        self.pending.forget(uid)
        holding = self.cache.release(uid)
        if holding is not None:
            self.metrics.gpus_held_twice.set(len(self.cache.conflicts()))
            self.on_bound(holding.slot)  # the map's bound count moved
            keys = [WakeKey.slot(holding.slot), WakeKey.map(holding.slot.map)]
            keys += [WakeKey.gpu(holding.node, gpu) for gpu in holding.gpus]
            self.wake(keys)

    def wake(self, keys: Iterable[WakeKey]) -> None:
        """What changed: the pods and the parked free slots (controller/freeslots.py) that wait
        for it; a map whose slots are unparked wakes the pods that wait for one of its slots."""
        keys = list(keys)
        unparked = self.cache.unpark(keys)
        self.queue.wake([*keys, *(WakeKey.map(key) for key in unparked)])

    # -- running ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Opens the Bindings' connections ahead of the first bind (from the leader's start-up,
        while the informers sync): a backlog's first Bindings then do not each wait for TCP and
        TLS on the thread that sends the rest."""
        loop = self._open_loop()
        if loop is not None:
            loop.warm(self.settings.bind_workers)

    def _open_loop(self) -> Sender | None:
        """The request loop the Bindings go out from (opened on first use; None once stopped)."""
        with self._loop_lock:
            if self._loop is None and not self._stop.is_set():
                self._loop = self._new_sender()
            return self._loop

    def _off_loop(self, fn: Callable[..., object], *args: Any) -> None:
        """Runs a write that stays off the request loop (never a Binding) on the side threads;
        dropped once the binder stops, as the write would find its leadership over."""
        try:
            future = self._side.submit(fn, *args)
        except RuntimeError:
            return  # stopped
        future.add_done_callback(_log_failure)

    def start(self) -> None:
        self.active.set()
        if self.finalizers is not None and self.dra is not None:
            self.dra.attach(self.finalizers)
            self.finalizers.start(self.dra.unprotected())
        self._open_loop()
        self._thread = threading.Thread(target=self._run, name="binder", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """The deciding thread runs, and so does the request loop (a loop that failed would fail
        every Binding: the health check restarts the process)."""
        loop = self._loop
        return (
            self._thread is not None and self._thread.is_alive() and (loop is None or loop.alive())
        )

    def _signer(self) -> RingKey:
        trust = self.trust
        if trust is None:
            raise RuntimeError("the binder bound a pod before the key ring was loaded")
        return trust.ring.signer

    def stop(self) -> bool:
        """Ends this leadership's binding, before its Lease may be released: no decision after
        it, no Binding written after its drain began, and up to `drain_seconds` for the answers to
        the Bindings (and Reserves) already written. True when every one was answered: only then
        does nothing of this leader's reach the apiserver after the Lease is given up."""
        self.report.stop()
        self._stop.set()
        self.queue.close()
        if self.finalizers is not None and self.dra is not None:
            self.dra.attach(None)
            self.finalizers.stop()
        # A claim's write in progress ends on its own; whatever it would send next is refused.
        self._side.shutdown(wait=False, cancel_futures=True)
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

    def _run(self) -> None:
        last_flush = time.monotonic()
        while not self._stop.is_set():
            # Woken in time for the next deferred report (a pod still waiting for its claim).
            wait = min(1.0, max(0.0, self.pending.next_due() - time.monotonic()))
            uid = self.queue.pop(timeout=wait)
            self.pending.flush_due()
            if time.monotonic() - last_flush > self.settings.flush_seconds:
                self.cache.unpark_all(self.cluster().model.maps)
                self.queue.wake_all()
                last_flush = time.monotonic()
            self._lease_returned()
            if uid is None:
                continue
            with self._lock:
                pod = self._pods.get(uid)
                if pod is None or uid in self._in_flight:
                    continue
            try:
                self._decide(uid, pod)
            except Exception:
                log.exception("decision failed", extra={"pod": pod.key})
                self.queue.backoff(uid)

    def _decide(self, uid: str, pod: Pod) -> None:
        if not self.fence():
            self._fenced(uid)
            return
        facts = podfacts.facts(pod, self.settings.legacy)
        cluster = self.cluster()
        outcome: Placement | Status = plan(facts, cluster, self.cache)
        self._park(cluster, facts, outcome)
        claim: ClaimPlan | None = None
        if isinstance(outcome, Placement) and self.dra is not None and facts.map_name is not None:
            tolerations = cluster.model.tolerations(outcome.slot.map, outcome.slot.index)
            state = cluster.inventories.get(outcome.decision.node)
            checked = self.dra.check(
                pod,
                outcome,
                self.cache,
                tolerations,
                cluster.model.grants,
                state.inventory if state is not None else None,
            )
            if isinstance(checked, Status):
                outcome = checked
            else:
                claim = checked
                # The container sees only its own GPUs: host indices would name the wrong ones.
                uuids = ",".join(outcome.decision.devices)
                outcome = replace(
                    outcome, decision=replace(outcome.decision, cuda_visible_devices=uuids)
                )
        if isinstance(outcome, Status):
            self.metrics.unschedulable.labels(outcome.reason).inc()
            if outcome.code is Code.UNRESOLVABLE and not outcome.waits_for:
                self.queue.unschedulable(uid, frozenset({WakeKey.pod(uid)}))
            else:
                self.queue.unschedulable(uid, outcome.waits_for, outcome.cohort)
            self._report(pod, outcome)
            return
        self.queue.placed(uid)
        self.pending.settle(uid)
        self.cache.assume(uid, pod.key, outcome)
        with self._lock:
            self._in_flight.add(uid)
        try:
            self._dispatch(uid, pod, outcome, claim)
        except Exception:
            self.cache.forget(uid)
            self._finish(uid, requeue=False)
            raise

    def _park(self, cluster: Cluster, facts: PodFacts, outcome: Placement | Status) -> None:
        """The free slots an allocation found unservable are left out of the next decisions
        until what they wait for changes (`wake`)."""
        if outcome.unservable and facts.map_name is not None:
            cmap = cluster.model.maps.get(MapKey(facts.namespace, facts.map_name))
            if cmap is not None:
                self.cache.park(cmap, outcome.unservable)

    def _dispatch(self, uid: str, pod: Pod, placement: Placement, claim: ClaimPlan | None) -> None:
        """Sends an assumed decision's writes from the request loop: the Binding, after (dra) the
        claim's Reserve. A claim that needs writes before its status (an allocation to clear,
        the finalizer not written yet) gets them on a side thread first."""
        loop = self._open_loop()
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
        self._finish(uid, requeue=True)

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
            self._finish(uid, requeue=False)
            self._fenced(uid)
            return
        if isinstance(exc, (APINotFoundError, APIConflictError)):
            # Gone, recreated, or already bound by someone else: the pod's next event decides.
            self.metrics.binds.labels("conflict").inc()
            log.info("bind refused: %s", exc, extra={"pod": pod.key})
            if isinstance(exc, APINotFoundError):
                # A pod already bound (409) keeps its claim; a deleted one loses it with the pod.
                self._unreserve(claim)
            self.cache.forget(uid)
            self._finish(uid, requeue=False)
            return
        self.metrics.binds.labels("error").inc()
        log.warning("bind failed: %s", exc, extra={"pod": pod.key})
        if 400 <= exc.status < 500:
            # Refused, so surely not bound. After a timeout or a 5xx the Binding may have
            # been stored: the allocation stays, and the retry finds it done and reuses it.
            self._unreserve(claim)
        self.cache.forget(uid)
        self._finish(uid, requeue=True)

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

    def _lease_returned(self) -> None:
        """Wakes the pods parked for the Lease once it is held again."""
        if self._waiting_for_lease.is_set() and self.fence():
            self._waiting_for_lease.clear()
            self.queue.wake([WakeKey.lease()])

    def _fenced(self, uid: str) -> None:
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

    def _finish(self, uid: str, requeue: bool) -> None:
        with self._lock:
            self._in_flight.discard(uid)
            still_pending = uid in self._pods
        if requeue and still_pending:
            self.queue.backoff(uid)

    def _report(self, pod: Pod, status: Status) -> None:
        self.pending.report(pod, status)

    # -- a second holder ------------------------------------------------------------------------
    def _may_share(self, a: Holding, b: Holding, gpu: str) -> bool:
        """Legacy lines of one map that name the same GPU share it; so, for want of a way to
        judge, do two pods of one map the model no longer has (pre-bound legacy lines)."""
        if a.slot.map != b.slot.map:
            return False
        cmap = self.cluster().model.maps.get(a.slot.map)
        return cmap is None or cmap.lines_share(a.slot.index, b.slot.index, gpu)

    def _report_conflicts(self, pod: Pod, conflicts: list[Conflict]) -> None:
        """A bound pod holds a GPU that another bound pod holds and neither may share: both run
        there, so both hold it (no third pod is bound onto it), and it is said out loud, in the
        log, an Event on the pod and `gpuplace_gpus_held_twice`, never recorded silently."""
        self.metrics.gpus_held_twice.set(len(self.cache.conflicts()))
        for conflict in conflicts:
            others = [
                f"pod {held.pod} (uid {uid})" if (held := self.cache.holding(uid)) else uid
                for uid in conflict.holders
                if uid != pod.uid
            ]
            message = (
                f"GPU {conflict.gpu} on node {conflict.node} is also held by {', '.join(others)}: "
                "their bindings both name it and neither may share it; delete one of the pods"
            )
            log.warning("GPU held twice: %s", message, extra={"pod": pod.key})
            self._off_loop(self.events.emit, pod.ref, WARNING, EventReason.GPU_HELD_TWICE, message)


def _log_failure(future: Future[object]) -> None:
    error = future.exception() if not future.cancelled() else None
    if error is not None:
        log.error("a write off the request loop failed", exc_info=error)
