"""A GPU held by two bound pods, or named by two claims' allocations, that may not share it: said
out loud, never recorded silently."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from controller.metrics import ControllerMetrics
from controller.slotcache import Conflict, SlotCache
from kubeio.events import WARNING, EventRecorder, ObjectRef
from kubeio.pod import Pod
from placement.draalloc import HeldTwice as ClaimsHeldTwice
from placement.reasons import EventReason
from placement.types import MapKey

log = logging.getLogger(__name__)

#: The object a map's Events go to (its PlacementMap or its source ConfigMap), if known.
MapRef = Callable[[MapKey], ObjectRef | None]


class HeldTwice:
    """Reports the conflicts the slot cache found when it added a bound pod, and the devices
    that two claims' allocations name (binder's threads); the Events leave on the binder's side
    threads (`off_loop`). `gpuplace_gpus_held_twice` counts both."""

    def __init__(
        self,
        cache: SlotCache,
        metrics: ControllerMetrics,
        events: EventRecorder,
        off_loop: Callable[..., Any],
        map_ref: MapRef = lambda _key: None,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.events = events
        self._off_loop = off_loop
        self._map_ref = map_ref
        #: The doubly allocated devices last reported, with their claims (reported once each);
        #: `report_claims` runs on whichever thread woke the binder, hence the lock.
        self._claims: dict[tuple[str, str, str], tuple[tuple[str, str], ...]] = {}
        self._lock = threading.Lock()
        self._count = -1  # what the gauge says (-1: not set yet)

    def recount(self) -> None:
        # Called for every bound pod the cache adds (40,000 at a large cluster's start-up): the
        # gauge is set only when the count moved.
        count = self.cache.conflict_count() + len(self._claims)
        if count != self._count:
            self._count = count
            self.metrics.gpus_held_twice.set(count)

    def report(self, pod: Pod, conflicts: list[Conflict]) -> None:
        """A bound pod holds a GPU that another bound pod holds and neither may share: both run
        there, so both hold it (no third pod is bound onto it), and it is said out loud, in the
        log, an Event on the pod and `gpuplace_gpus_held_twice`, never recorded silently."""
        self.recount()
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

    def report_claims(self, found: Iterable[ClaimsHeldTwice]) -> None:
        """The devices two claims' allocations name now (`DraTracker.held_twice`): each new one
        is said in the log and an Event on every pod the claims are reserved for (or made for)
        and on the map of each gpuplace pod among them; the metric counts those still held."""
        doubles = list(found)
        now = {f.device: tuple(c.key for c in f.claims) for f in doubles}
        with self._lock:
            if not now and not self._claims:
                return
            new = [f for f in doubles if self._claims.get(f.device) != now[f.device]]
            self._claims = now
            self.recount()
        for double in new:
            message = double.describe()
            log.warning("GPU held twice: %s", message)
            for ref in self._refs(double):
                self._off_loop(self.events.emit, ref, WARNING, EventReason.GPU_HELD_TWICE, message)

    def _refs(self, double: ClaimsHeldTwice) -> list[ObjectRef]:
        refs: dict[tuple[str, str, str], ObjectRef] = {}
        for claim in double.claims:
            pods = list(zip(claim.reserved_names, claim.reserved_for, strict=False))
            if claim.owner_uid is not None:
                held = self.cache.holding(claim.owner_uid)
                if held is not None:
                    name = held.pod.partition("/")[2]
                    pods.append((name, claim.owner_uid))
                    ref = self._map_ref(held.slot.map)
                    if ref is not None:
                        refs[(ref.kind, ref.namespace, ref.name)] = ref
            for name, uid in pods:
                refs[("Pod", claim.namespace, name)] = ObjectRef("Pod", claim.namespace, name, uid)
        return [refs[k] for k in sorted(refs)]
