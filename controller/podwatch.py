"""Bound pods after their binding: whether each runs (rollouts wait for it), the envMode-index
bindings the renumbering tracker follows, and which maps' pods to judge for drift again. Pod events
arrive on the informer threads; the binder sees each first. Drift and rollouts are judged by their
own queue's worker (controller/driftjudge.py), from the maps added here and by the model keeper."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller import podfacts
from controller.binder import Binder
from controller.renumber import RenumberTracker, bound_indices
from controller.snapshot import Published
from controller.statuswriter import StatusKey
from controller.workqueue import WorkQueue
from kubeio.client import Obj
from kubeio.informer import DELETED
from kubeio.pod import Pod
from placement.annotations import LEGACY_MAP_PREFIX
from placement.types import MapKey

#: A bound pod seen, or a slot bound or freed: its map's drift (and, from the binder, its status)
#: is looked at within this long, once however many of the map's slots a drain binds meanwhile.
#: Each bind used to queue a pass of its own, which re-read the map for every pod bound.
BOUND_SETTLE_SECONDS = 0.5


@dataclass(eq=False)
class PodWatch:
    binder: Binder
    renumber: RenumberTracker
    published: Published
    statuses: WorkQueue[StatusKey]
    #: Maps whose bound pods to judge for drift again.
    drift: WorkQueue[MapKey]
    #: bound pod uid -> Running (informer threads write)
    _running: dict[str, bool] = field(default_factory=dict, init=False)
    #: bound pod uid -> (key ring version, annotations) last decoded and judged for it, so that
    #: the pod's later events (kwok or the kubelet writing its status) cost a comparison.
    _bindings_seen: dict[str, tuple[str, Mapping[str, str]]] = field(
        default_factory=dict, init=False
    )

    def is_running(self, uid: str) -> bool:
        return self._running.get(uid, False)

    def on_pod(self, event: str, obj: Obj, _old: Obj | None = None) -> None:
        """One pod event (the pod informers' handler): the binder first, then what follows a
        binding. The object is read here, once (`kubeio.pod.Pod`), and a bound pod's binding is
        decoded and judged once for all of them (`podfacts.BoundPod`)."""
        pod = Pod.of(obj)
        bound = podfacts.BoundPod(pod, self.binder.trust) if pod.bound else None
        if self.binder.active.is_set():
            self.binder.on_pod(event, pod, self.published.current.shared, bound)
        if bound is None:
            return
        uid = bound.uid
        gone = event == DELETED or pod.finished
        annotations = pod.annotations
        if gone:
            self._running.pop(uid, None)
            self._bindings_seen.pop(uid, None)
        else:
            self._running[uid] = pod.phase == "Running"
            if self.binder.active.is_set():
                trust = bound.trust
                seen = (trust.version if trust is not None else "", annotations)
                if self._bindings_seen.get(uid) == seen:
                    return  # the same binding as the pod's last event: nothing to judge again
                self._bindings_seen[uid] = seen
        decision = bound.decision
        if decision is not None and not decision.map.name.startswith(LEGACY_MAP_PREFIX):
            self.drift.add_after(decision.map, BOUND_SETTLE_SECONDS)
        self.track_indices(bound, gone)

    def track_indices(self, bound: podfacts.BoundPod, gone: bool) -> None:
        """Feeds the renumbering tracker: bound pods with a verified envMode-index binding."""
        if gone:
            key = self.renumber.forget(bound.uid)
            if key is not None:
                self.statuses.add(key)
            return
        if not self.binder.active.is_set() or not bound.holds:
            return
        decision = bound.decision
        if decision is None:
            return
        tracked = bound_indices(bound.pod.ref, bound.pod.node_name, decision)
        if tracked is not None:
            self.renumber.track(bound.uid, tracked)

    def rebuild(self, bound: list[podfacts.BoundPod]) -> None:
        """After the binder rebuilt its cache at the start of a leadership (`Binder.rebuild`,
        which read the bound pods' bindings): the renumbering tracker from the bound pods, and
        every held map to judge for drift."""
        for read in bound:
            self.track_indices(read, read.pod.finished)
        self.drift.add_all({h.slot.map for h in self.binder.cache.holdings()})
