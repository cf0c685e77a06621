"""Drift and rollouts: which bound pods no longer sit where their map puts their slot, and the
evictions that move them (`rollout: evict`). Its queue is keyed by map; it is fed by the model keeper
(the maps a published model changed), the pod watch (a bound pod's binding changed) and the binder
(a slot bound or freed). A reconcile judges its maps against the published snapshot's model and the
slot cache, steps their rollouts, and has each map whose rollout is under way looked at again after
`poll_seconds` (a replacement's pod turning Running is no event of its map's). One worker: the drift
tracker and the rollouts keep their state on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.drift import DriftTracker
from controller.rollout import Rollouts
from controller.slotcache import SlotCache
from controller.snapshot import Published
from controller.statuswriter import StatusKey
from controller.workqueue import Requeue, WorkQueue
from placement.types import MapKey


@dataclass(eq=False)
class DriftJudge:
    drift: DriftTracker
    rollouts: Rollouts
    cache: SlotCache
    published: Published
    statuses: WorkQueue[StatusKey]
    #: Whether the lease is held right now: drift conditions and evictions are the leader's.
    holds_lease: Callable[[], bool]
    poll_seconds: float = 0.5

    def reconcile(self, keys: list[MapKey]) -> Requeue[MapKey]:
        if not self.holds_lease():
            return None
        model = self.published.current.model
        changed = self.drift.check(keys, model, self.cache)
        changed |= self.rollouts.step(model, self.drift, self.cache, keys)
        self.statuses.add_all(changed)  # their counts or rollout notes moved
        return {k: self.poll_seconds for k in keys if self.rollouts.moving(k, model, self.drift)}
