"""Which bound pods are Drifted, written onto the pods as a condition and an Event.

Contract: `check` and `drifted` run on the drift queue's one worker only (controller/driftjudge.py);
`count` and `total` are read by the status writer from its own (one read of a dict each); condition
writes go to a small executor so a slow apiserver never holds up a judgement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from controller.slotcache import Holding, SlotCache
from kubeio.client import Kube
from kubeio.errors import APIError, APINotFoundError
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.paths import PODS
from kubeio.times import now_time
from placement.annotations import DRIFTED_CONDITION, LEGACY_MAP_PREFIX
from placement.drift import BoundSlot, Drift, drift_of
from placement.model import Model
from placement.reasons import EventReason
from placement.types import MapKey

log = logging.getLogger(__name__)


def bound_slot(holding: Holding) -> BoundSlot:
    return BoundSlot(holding.slot, holding.node, holding.gpus, holding.revision)


def condition(drift: Drift | None) -> dict[str, str | None]:
    now = now_time()
    if drift is None:
        return {
            "type": DRIFTED_CONDITION,
            "status": "False",
            "reason": EventReason.MATCHES_MAP,
            "message": "the pod runs where its map puts its slot",
            "lastTransitionTime": now,
        }
    return {
        "type": DRIFTED_CONDITION,
        "status": "True",
        "reason": drift.kind.value,
        "message": drift.message(),
        "lastTransitionTime": now,
    }


class DriftTracker:
    def __init__(
        self,
        kube: Kube,
        events: EventRecorder,
        on_count: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.kube = kube
        self.events = events
        self.on_count = on_count  # total drifted pods, after each check that changed it
        self._drifts: dict[str, tuple[Holding, Drift]] = {}  # uid -> its holding and drift
        self._by_map: dict[MapKey, set[str]] = {}
        #: Per map, the compiled map its holdings were last judged against and those holdings:
        #: a holding judged against the same compiled map has the same drift (`drift_of` reads
        #: nothing else), so a pass re-judges only what is new. A drain queues a map's pass bind
        #: after bind, and each would otherwise judge every pod of the map again.
        self._judged: dict[MapKey, tuple[object, dict[str, Holding]]] = {}
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="drift")

    def count(self, key: MapKey) -> int:
        return len(self._by_map.get(key, ()))

    def maps(self) -> list[MapKey]:
        """Maps with drifted pods."""
        return list(self._by_map)

    def total(self) -> int:
        return len(self._drifts)

    def drifted(self, key: MapKey) -> list[tuple[Holding, Drift]]:
        return sorted(
            (self._drifts[uid] for uid in self._by_map.get(key, ())),
            key=lambda pair: pair[0].slot.index,
        )

    def is_drifted(self, uid: str) -> bool:
        return uid in self._drifts

    def check(self, keys: Iterable[MapKey], model: Model, cache: SlotCache) -> set[MapKey]:
        """Re-judges every bound pod of the maps `keys` against `model`; returns the maps whose
        drifted pods changed."""
        changed: set[MapKey] = set()
        wanted = {k for k in keys if not k.name.startswith(LEGACY_MAP_PREFIX)}
        if not wanted:  # a legacy pod's map is its own annotation: it cannot drift
            return changed
        for key in wanted:
            # The map's own holdings: a drain queues its maps bind after bind, and a pass must
            # not cost more with every pod the cache holds.
            current = {h.uid: h for h in cache.map_holdings(key) if not h.assumed}
            if self._recheck_map(key, current, model):
                changed.add(key)
        if changed:
            self.on_count(len(self._drifts))
        return changed

    def _recheck_map(self, key: MapKey, current: dict[str, Holding], model: Model) -> bool:
        """Re-judges the bound pods `current` (by uid) of map `key`, writes what changed; whether
        any pod's drift changed."""
        changed = False
        for uid in self._by_map.get(key, set()) - current.keys():  # released: the pod is gone
            self._drifts.pop(uid, None)
            changed = True
        judged = self._still_judged(key, model.maps.get(key), current)
        after: set[str] = set()
        for uid, holding in current.items():
            known = self._drifts.get(uid)
            if judged.get(uid) is holding:
                if known is not None:
                    after.add(uid)
                continue
            judged[uid] = holding
            drift = drift_of(bound_slot(holding), model)
            if drift is not None:
                after.add(uid)
            if (known[1] if known else None) == drift:
                continue
            changed = True
            if drift is None:
                del self._drifts[uid]
            else:
                self._drifts[uid] = (holding, drift)
            self._executor.submit(self._write, holding, drift, known is not None)
        if after:
            self._by_map[key] = after
        else:
            self._by_map.pop(key, None)
        return changed

    def _still_judged(
        self, key: MapKey, cmap: object, current: dict[str, Holding]
    ) -> dict[str, Holding]:
        """The holdings of `current` last judged against `cmap` (the map's compiled map now),
        kept as the map's memo for this pass to add to."""
        against, judged = self._judged.pop(key, (None, {}))
        kept = (
            {uid: current[uid] for uid in judged.keys() & current.keys()} if against is cmap else {}
        )
        if current:
            self._judged[key] = (cmap, kept)
        return kept

    def forget_all(self) -> None:
        self._drifts.clear()
        self._by_map.clear()
        self._judged.clear()
        self.on_count(0)

    def _write(self, holding: Holding, drift: Drift | None, was_drifted: bool) -> None:
        if drift is None and not was_drifted:
            return
        namespace, _, name = holding.pod.partition("/")
        # The uid makes the write fail on a pod recreated under the same name (uid is immutable).
        body = {"metadata": {"uid": holding.uid}, "status": {"conditions": [condition(drift)]}}
        try:
            self.kube.patch(
                PODS.item(name, namespace, "status"),
                body,
                content_type="application/strategic-merge-patch+json",
            )
        except APINotFoundError:
            return
        except APIError as exc:
            log.warning("drift condition of %s not written: %s", holding.pod, exc)
            return
        ref = ObjectRef("Pod", namespace, name, holding.uid)
        if drift is None:
            self.events.emit(
                ref, NORMAL, EventReason.MATCHES_MAP, "the pod runs where its map puts it again"
            )
        else:
            self.events.emit(ref, WARNING, EventReason.DRIFTED, drift.message())

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
