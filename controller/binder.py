"""The binder: one decision thread, one request loop for every Binding.

Decisions are serialized (slot and GPU choices never race); each accepted decision is assumed in the
cache before its Binding is sent, and forgotten if the Binding fails. A pod that cannot be placed gets
PodScheduled=False with the reason, an Event, and waits for the objects its status names.

Every Binding leaves from the request loop (kubeio/loop.py), and in dra enforcement so does the
claim's Reserve (its status write) right before it: one path, which `stop` drains before the
leadership's Lease may be released (docs/architecture.md, Threads: leadership ends before its
Lease does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial

from controller import podfacts
from controller.bindsend import Dispatcher, SideWrites, Waiting
from controller.claimfinalizers import ClaimFinalizers
from controller.dra import ClaimWriter, DraTracker
from controller.gangs import Gangs
from controller.heldtwice import HeldTwice, MapRef
from controller.legacyscope import LegacyScope
from controller.metrics import ControllerMetrics
from controller.onepod import OnePod
from controller.pendingreport import PendingReports
from controller.queue import SchedulingQueue
from controller.settings import BinderSettings
from controller.slotcache import Holding, SlotCache
from controller.trustreport import TrustReport
from kubeio.client import Kube
from kubeio.events import WARNING, EventRecorder
from kubeio.loop import RequestLoop, Sender
from kubeio.pod import Pod
from placement.binding import Cluster
from placement.keyring import RingKey, TrustView
from placement.reasons import Reason
from placement.types import MapKey, SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)


class Binder:
    """Decides on one thread, binds from one request loop (`bind_workers` Bindings in flight).

    Contract: informer threads feed pods (`on_pod`, `rebuild`) and wake keys (`wake`); the binder
    thread pops and decides (`_decide`), the only place a slot or GPU is chosen, so decisions never
    race: a pod alone by the steps of controller/onepod.py, a gang's members together by
    controller/gangs.py with the same steps. `_lock` guards the pending pods and the set in
    flight; the slot cache and the queue have locks of their own. A decision is assumed in the
    cache before its Binding is sent and is confirmed when the Binding succeeds or forgotten when
    it fails (every assume has a forget).
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
        on_trust_change: Callable[[MapKey], None] = lambda _key: None,  # a map's trust report
        map_ref: MapRef = lambda _key: None,  # where a map's Events go
        legacy_scope: LegacyScope = podfacts.EVERY,  # namespaces placed by a legacy line
    ) -> None:
        self.kube = kube
        #: Whether this process holds the leader lease now (LeaderElector.holds): checked right
        #: before each decision and each Binding, so a leader paused past its lease sends none.
        self.fence = fence
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.cluster = cluster
        self.on_bound = on_bound
        self.dra = dra
        self.legacy_scope = legacy_scope
        waiting = Waiting()
        self._pods, self._in_flight, self._lock = waiting.pods, waiting.in_flight, waiting.lock
        #: dra enforcement: each claim's finalizer, written when the claim is first seen (leader
        #: only: between `start` and `stop`), so that Reserve writes only the claim's status.
        self.finalizers: ClaimFinalizers | None = None
        claims: ClaimWriter | None = None
        if dra is not None:
            self.finalizers = ClaimFinalizers(
                kube,
                fence=fence,
                serves=self._serves,
                latest=dra.claim,
                count=lambda when: metrics.claim_finalizers.labels(when.value).inc(),
            )
            claims = ClaimWriter(kube, dra.settings, self.finalizers)
        self.cache = SlotCache(self._may_share)
        #: The binding key ring and adoption records (controller/bindingkey.py): set by the
        #: leader before `rebuild`, swapped whole by `retrust` when the Secret changes.
        self.trust: TrustView | None = None
        self.report = TrustReport(
            kube, events, metrics.unverifiable.set, metrics.unverified.inc, on_trust_change
        )
        self._not_granted: set[str] = set()  # pre-bound legacy pods already reported as such
        self.queue = SchedulingQueue(max_backoff=settings.max_backoff_seconds)
        self.side = SideWrites()
        self.held_twice = HeldTwice(self.cache, metrics, events, self.side.run, map_ref)
        self.pending = PendingReports(
            kube,
            events,
            self.side.run,
            delays={Reason.CLAIM_PENDING: settings.claim_pending_report_seconds},
        )
        self._stop = threading.Event()
        self.dispatcher = Dispatcher(
            settings,
            metrics,
            self.cache,
            self.queue,
            self.pending,
            waiting,
            self.side,
            sender or (lambda: RequestLoop(kube, settings.bind_workers, name="bind-loop")),
            fence,
            self._signer,
            on_bound,
            self._stop,
            claims,
        )
        self._thread: threading.Thread | None = None
        self.active = threading.Event()
        self.steps = OnePod(
            settings,
            metrics,
            self.cache,
            self.queue,
            self.pending,
            waiting,
            self.dispatcher,
            dra,
            legacy_scope,
        )
        self.gangs = Gangs(
            self.steps,
            waiting,
            metrics.gangs_stuck.set,
            on_change=on_trust_change,  # the map's status shows how its gang stands
            on_stuck=partial(_map_event, self.side.run, events, map_ref, Reason.GANG_STUCK),
        )

    # -- feeding -------------------------------------------------------------------------------
    def rebuild(self, pods: Iterable[Pod], shared_maps: set[str]) -> list[podfacts.BoundPod]:
        """Rebuilds the slot cache from bound pods' annotations; queues the unbound ones.
        Returns the bound pods' bindings as read (each decoded and judged once, for the
        other readers of a leadership's start too)."""
        bound: list[podfacts.BoundPod] = []
        for pod in pods:
            read = podfacts.BoundPod(pod, self.trust) if pod.bound else None
            self.on_pod("ADDED", pod, shared_maps, read)
            if read is not None:
                bound.append(read)
        return bound

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
            self.gangs.forget(uid)
            self._release(uid)
            return
        if pod.bound:
            with self._lock:
                self._pods.pop(uid, None)
            self.gangs.forget(uid)
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
        self.gangs.note(uid, pod)
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
                self.side.run(self.events.emit, pod.ref, WARNING, Reason.NOT_GRANTED, adopted)
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
        if holding is None and podfacts.is_legacy(bound.pod, self.settings, self.legacy_scope):
            holding = self._adopt_prebound(bound.uid, bound.pod)
        if holding is not None:
            self.held_twice.report(bound.pod, self.cache.add_bound(holding))
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
            self.held_twice.recount()
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
        if self.dra is not None and self.active.is_set() and not self._stop.is_set():
            # The leader's: a device two claims' allocations name, whoever wrote them.
            self.held_twice.report_claims(self.dra.held_twice(self.cache))

    # -- running ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Opens the Bindings' connections ahead of the first bind (from the leader's start-up,
        while the informers sync): a backlog's first Bindings then do not each wait for TCP and
        TLS on the thread that sends the rest."""
        loop = self.dispatcher.open_loop()
        if loop is not None:
            loop.warm(self.settings.bind_workers)

    def start(self) -> None:
        self.active.set()
        if self.finalizers is not None and self.dra is not None:
            self.dra.attach(self.finalizers)
            self.finalizers.start(self.dra.unprotected())
        self.dispatcher.open_loop()
        self._thread = threading.Thread(target=self._run, name="binder", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """The deciding thread runs, and so does the request loop (a loop that failed would fail
        every Binding: the health check restarts the process)."""
        return self._thread is not None and self._thread.is_alive() and self.dispatcher.alive()

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
        self.side.shutdown()
        return self.dispatcher.drain()

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
            self.dispatcher.lease_returned()
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
            self.dispatcher.fenced(uid)
            return
        facts = self.steps.facts(pod)
        cluster = self.cluster()
        if not self.gangs.decide(uid, pod, facts, cluster):
            self.steps.decide(uid, pod, facts, cluster)

    # -- a second holder ------------------------------------------------------------------------
    def _may_share(self, a: Holding, b: Holding, gpu: str) -> bool:
        """Legacy lines of one map that name the same GPU share it; so, for want of a way to
        judge, do two pods of one map the model no longer has (pre-bound legacy lines)."""
        if a.slot.map != b.slot.map:
            return False
        cmap = self.cluster().model.maps.get(a.slot.map)
        return cmap is None or cmap.lines_share(a.slot.index, b.slot.index, gpu)


def _map_event(
    run: Callable[..., None],
    events: EventRecorder,
    map_ref: MapRef,
    reason: Reason,
    key: MapKey,
    message: str,
) -> None:
    """A Warning Event on the map's object (when one is known), sent off the binder's loop."""
    ref = map_ref(key)
    if ref is not None:
        run(events.emit, ref, WARNING, reason, message)
