"""The binder's steps for one pod: plan it (its claim checked in dra enforcement), park the free
slots it found unservable, and either report it waiting or assume its decision and send it.

The binder decides a pod alone with these steps, and a gang (controller/gangs.py) decides each of
its members with the same ones before sending all of them or none: one way to plan, wait and send,
whoever decides.

Contract: every method runs on the binder's thread; `waiting` (its own lock) holds the pods in
flight; the slot cache and the queue have locks of their own. Every assume has a forget when its
send fails.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller import podfacts
from controller.bindsend import Dispatcher, Waiting
from controller.dra import DraTracker
from controller.legacyscope import LegacyScope
from controller.metrics import ControllerMetrics
from controller.pendingreport import PendingReports
from controller.queue import SchedulingQueue
from controller.settings import BinderSettings
from controller.slotcache import SlotCache
from kubeio.pod import Pod
from placement.binding import Cluster, Code, Placement, PodFacts, Status, plan
from placement.draalloc import ClaimPlan
from placement.types import MapKey
from placement.wake import WakeKey


@dataclass(frozen=True)
class OnePod:
    settings: BinderSettings
    metrics: ControllerMetrics
    cache: SlotCache
    queue: SchedulingQueue
    pending: PendingReports
    waiting: Waiting
    dispatcher: Dispatcher
    dra: DraTracker | None = None  # `dra` enforcement: claims are allocated before binding
    #: The namespaces whose pods are placed by a gpu-scheduling-map line of their own.
    legacy_scope: LegacyScope = podfacts.EVERY

    def facts(self, pod: Pod) -> PodFacts:
        return podfacts.facts_for(pod, self.settings, self.legacy_scope)

    def decide(self, uid: str, pod: Pod, facts: PodFacts, cluster: Cluster) -> None:
        """The pod decided alone: it waits with why, or its Binding is sent."""
        outcome, claim = self.outcome(pod, facts, cluster)
        if isinstance(outcome, Status):
            self.wait(uid, pod, outcome)
            return
        self.send(uid, pod, outcome, claim)

    def outcome(
        self, pod: Pod, facts: PodFacts, cluster: Cluster
    ) -> tuple[Placement | Status, ClaimPlan | None]:
        """The decision for one pod alone, its claim checked in dra enforcement."""
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
        return outcome, claim

    def wait(self, uid: str, pod: Pod, outcome: Status) -> None:
        """The pod waits for what its status names, and reports why (condition, Event)."""
        self.metrics.unschedulable.labels(outcome.reason).inc()
        if outcome.code is Code.UNRESOLVABLE and not outcome.waits_for:
            self.queue.unschedulable(uid, frozenset({WakeKey.pod(uid)}))
        else:
            self.queue.unschedulable(uid, outcome.waits_for, outcome.cohort)
        self.pending.report(pod, outcome)

    def send(self, uid: str, pod: Pod, outcome: Placement, claim: ClaimPlan | None) -> None:
        """Assumes the decision and sends its writes (every assume has a forget on failure)."""
        self.queue.placed(uid)
        self.pending.settle(uid)
        self.cache.assume(uid, pod.key, outcome)
        with self.waiting.lock:
            self.waiting.in_flight.add(uid)
        try:
            self.dispatcher.dispatch(uid, pod, outcome, claim)
        except Exception:
            self.cache.forget(uid)
            self.dispatcher.finish(uid, requeue=False)
            raise

    def _park(self, cluster: Cluster, facts: PodFacts, outcome: Placement | Status) -> None:
        """The free slots an allocation found unservable are left out of the next decisions
        until what they wait for changes (`Binder.wake`)."""
        if outcome.unservable and facts.map_name is not None:
            cmap = cluster.model.maps.get(MapKey(facts.namespace, facts.map_name))
            if cmap is not None:
                self.cache.park(cmap, outcome.unservable)
