"""`rollout: evict`: drifted pods are evicted through the Eviction API, a few at a time.

Per map, at most `maxUnavailable` of its slots are down at once: a slot counts as down from its
pod's eviction until a replacement is bound to it and Running, and so does any slot whose pod is
bound but not Running. The Eviction API honours PodDisruptionBudgets (a 429 waits for the next
pass). A pod is evicted only when its new slot can be served now (node Ready and schedulable,
devices present, healthy and free), so a replacement never waits on a slot another drifted pod
still holds; slots that swap places wait for an operator (the map's status says so).

Contract: `step` and `moving` run on the drift queue's one worker only (controller/driftjudge.py);
`state` is read by the status writer from its own (one read of a dict).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from controller.drift import DriftTracker
from controller.slotcache import Holding, SlotCache
from kubeio import bodies
from kubeio.client import Kube
from kubeio.errors import (
    APIError,
    APIForbiddenError,
    APINotFoundError,
    APITooManyRequestsError,
)
from kubeio.events import NORMAL, EventRecorder, ObjectRef
from kubeio.paths import PODS
from placement.binding import Status
from placement.model import Model
from placement.reasons import EventReason
from placement.types import MapKey, RolloutStrategy, SlotKey

log = logging.getLogger(__name__)

#: A PodDisruptionBudget refusal is retried after this long, not on every pass.
_PDB_RETRY_SECONDS = 2.0
#: Without RBAC for evictions, asking again is pointless until an operator grants it.
_FORBIDDEN_RETRY_SECONDS = 60.0
#: Eviction calls in flight at once (each is an Eviction and an Event).
_EVICT_WORKERS = 16


@dataclass(frozen=True, slots=True)
class RolloutState:
    """What a map's rollout is doing, for its status."""

    down: int = 0
    waiting: str = ""  # why no eviction happened although pods are drifted


class Rollouts:
    def __init__(
        self,
        kube: Kube,
        events: EventRecorder,
        running: Callable[[str], bool],
        servable: Callable[[str, SlotKey], Status | None],
    ) -> None:
        self.kube = kube
        self.events = events
        self.running = running  # pod uid -> bound and Running
        self.servable = servable  # (pod uid, slot) -> why the slot cannot take it now, or None
        self._evicted: dict[MapKey, dict[int, str]] = {}  # slot index -> uid evicted from it
        self._retry_at: dict[MapKey, float] = {}
        self.states: dict[MapKey, RolloutState] = {}

    def state(self, key: MapKey) -> RolloutState | None:
        return self.states.get(key)

    def moving(self, key: MapKey, model: Model, drift: DriftTracker) -> bool:
        """Whether the map's rollout has pods to evict or evicted pods to wait for."""
        return key in self._evicted or (
            drift.count(key) > 0
            and (m := model.maps.get(key)) is not None
            and m.rollout.strategy is RolloutStrategy.EVICT
        )

    def step(
        self,
        model: Model,
        drift: DriftTracker,
        cache: SlotCache,
        only: Iterable[MapKey] | None = None,
    ) -> set[MapKey]:
        """Evicts what the budgets allow, in the maps `only` (None: every map); returns maps whose
        rollout state changed."""
        changed: set[MapKey] = set()
        candidates = drift.maps() if only is None else only
        keys = {k for k in candidates if self.moving(k, model, drift)}
        if only is None:
            keys |= set(self._evicted)
        now = time.monotonic()
        for key in sorted(keys):
            state = self._step_map(key, model, drift, cache, now)
            if self.states.get(key, RolloutState()) != state:
                changed.add(key)
                if state == RolloutState():
                    self.states.pop(key, None)
                else:
                    self.states[key] = state
        return changed

    def _step_map(
        self, key: MapKey, model: Model, drift: DriftTracker, cache: SlotCache, now: float
    ) -> RolloutState:
        cmap = model.maps.get(key)
        evicted = self._evicted.setdefault(key, {})
        taken = cache.taken_indices(key)
        for index, uid in list(evicted.items()):
            holder = taken.get(index)
            if holder is not None and holder != uid and self.running(holder):
                del evicted[index]  # the replacement is bound and Running
        if cmap is None or cmap.rollout.strategy is not RolloutStrategy.EVICT:
            # The map went away or back to manual: nothing more is evicted; what was is done.
            self._evicted.pop(key, None)
            return RolloutState()
        down = set(evicted) | {i for i, uid in taken.items() if not self.running(uid)}
        if not evicted:
            self._evicted.pop(key, None)
        budget = cmap.rollout.max_unavailable - len(down)
        if budget <= 0:
            return RolloutState(len(down), "")
        if now < self._retry_at.get(key, 0.0):
            return self.states.get(key, RolloutState(len(down), "waiting to retry an eviction"))
        waiting = self._evict_drifted(key, drift, evicted, down, budget, now)
        return RolloutState(len(down), waiting)

    def _evict_drifted(
        self,
        key: MapKey,
        drift: DriftTracker,
        evicted: dict[int, str],
        down: set[int],
        budget: int,
        now: float,
    ) -> str:
        """Evicts the movable drifted pods of map `key` while the `budget` of pods down allows,
        adding each index it evicts to `down`; returns what the rollout waits for ("" if nothing).
        Which pods is decided here, in order; their Eviction calls then run concurrently (one
        after another, 50 evictions took 5 s)."""
        waiting = ""
        chosen: list[Holding] = []
        messages: list[str] = []
        for holding, found in drift.drifted(key):
            if budget <= 0:
                break
            if not found.movable or holding.slot.index in evicted:
                continue
            blocked = self.servable(holding.uid, holding.slot)
            if blocked is not None:
                waiting = waiting or f"index {holding.slot.index}: {blocked.reason}"
                continue
            if holding.slot.index not in down:  # evicting a pod that is down costs no budget
                budget -= 1
            chosen.append(holding)
            messages.append(found.message())
        outcomes = self._evict_all(chosen, messages)
        for holding, outcome in zip(chosen, outcomes, strict=True):
            if outcome == "evicted":
                evicted[holding.slot.index] = holding.uid
                self._evicted[key] = evicted
                down.add(holding.slot.index)
        if "pdb" in outcomes:
            self._retry_at[key] = now + _PDB_RETRY_SECONDS
            return "waiting for a PodDisruptionBudget"
        if "forbidden" in outcomes:
            self._retry_at[key] = now + _FORBIDDEN_RETRY_SECONDS
            return "the controller may not evict pods (Helm value controller.allowEvictions)"
        return waiting

    def _evict_all(self, chosen: list[Holding], messages: list[str]) -> list[str]:
        calls = list(zip(chosen, messages, strict=True))
        if len(calls) <= 1:
            return [self._evict(h.pod, h.uid, why) for h, why in calls]
        with ThreadPoolExecutor(min(_EVICT_WORKERS, len(calls)), "evict") as pool:
            return list(
                pool.map(lambda call: self._evict(call[0].pod, call[0].uid, call[1]), calls)
            )

    def _evict(self, pod: str, uid: str, why: str) -> str:
        namespace, _, name = pod.partition("/")
        try:
            self.kube.create(
                PODS.item(name, namespace, "eviction"), bodies.eviction(name, namespace, uid)
            )
        except APITooManyRequestsError:
            return "pdb"
        except APIForbiddenError as exc:
            log.warning("eviction of %s forbidden: %s", pod, exc)
            return "forbidden"
        except APINotFoundError:
            return "gone"
        except APIError as exc:
            log.warning("eviction of %s failed: %s", pod, exc)
            return "error"
        log.info("evicted drifted pod %s: %s", pod, why)
        self.events.emit(
            ObjectRef("Pod", namespace, name, uid),
            NORMAL,
            EventReason.EVICTED_FOR_ROLLOUT,
            f"evicted to move to its new slot (rollout: evict): {why}",
        )
        return "evicted"
