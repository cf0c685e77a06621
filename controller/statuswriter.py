"""Map status: the one writer of `gpuplace.io/status` on source ConfigMaps, of the map Events on
phase transitions, and of the map and slot gauges. Takes the maps marked dirty (by any part of the
controller) at most twice a second on the leader; a status whose only news is the bound count is
held back while one was written recently, so that a burst of binds costs one patch per map."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controller.dirty import DirtyMaps
from controller.grantkeeper import GrantKeeper
from controller.metrics import ControllerMetrics
from controller.podwatch import PodWatch
from controller.sources import SourceState, map_status, only_bound_changed
from controller.writer import patch_status
from kubeio.client import Kube, Obj
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.informer import Informer
from placement.annotations import STATUS_ANNOTATION
from placement.compile import Compiler
from placement.model import Model
from placement.status import MapStatus, Phase
from placement.types import MapKey, RolloutStrategy


@dataclass(eq=False)
class StatusWriter:
    kube: Kube
    events: EventRecorder
    metrics: ControllerMetrics
    dirty: DirtyMaps
    #: The source ConfigMaps' informer; None when maps come from git (no object to patch).
    sources: Informer | None = field(kw_only=True)
    bound_seconds: float = field(kw_only=True)
    _statuses: dict[MapKey, str] = field(default_factory=dict, init=False)
    #: last patched, and when
    _written: dict[MapKey, tuple[MapStatus, float]] = field(default_factory=dict, init=False)
    _phases: dict[MapKey, Phase] = field(default_factory=dict, init=False)
    #: Every map's status as last computed (read by the per-map series at scrape time; a dict
    #: swapped entry by entry on the reconcile thread, copied by the reader).
    latest: dict[MapKey, MapStatus] = field(default_factory=dict, init=False)

    def forget(self, key: MapKey) -> None:
        """The map's source is gone."""
        self._statuses.pop(key, None)
        self._written.pop(key, None)
        self.latest.pop(key, None)

    def write(
        self,
        states: Mapping[MapKey, SourceState],
        model: Model,
        compiler: Compiler,
        grants: GrantKeeper,
        pods: PodWatch,
    ) -> None:
        """Writes the status of every dirty map whose status changed."""
        reports = compiler.reports
        deferred: set[MapKey] = set()
        for key in sorted(self.dirty.take()):
            state = states.get(key)
            if state is None:
                continue
            cmap = model.maps.get(key)
            denied = grants.denied.get(key)
            if denied:
                state = replace(state, valid=None, valid_version="", errors=denied)
            status = map_status(
                state,
                reports.get(key),
                model.generation,
                pods.binder.cache.bound_count(key),
                pods.drift.count(key),
                cmap.provenance.revision if cmap else "",
                rollout_note(key, model, pods),
                pods.renumber.count(key),
                pods.binder.report.count(key),
            )
            self.latest[key] = status
            if not self._write_one(key, status):
                deferred.add(key)
        self.dirty.update(deferred)
        phases: dict[str, int] = {p.value: 0 for p in Phase}
        for key in states:
            phase = self._phases.get(key)
            if phase is not None:
                phases[phase.value] += 1
        for phase_name, count in phases.items():
            self.metrics.maps.labels(phase_name).set(count)
        self._count_slots(compiler, pods)

    def _write_one(self, key: MapKey, status: MapStatus) -> bool:
        """Patches one status if it changed; False when it is held back for later."""
        text = status.to_json()
        obj = self.sources.get(key.namespace, key.name) if self.sources else None
        on_object = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(
            STATUS_ANNOTATION
        )
        if self._statuses.get(key) == text and on_object == text:
            return True
        if self.sources is None:  # git source: no ConfigMap to carry the status
            self._statuses[key] = text
            self._phases[key] = status.phase
            return True
        if self._coalesce(key, status, on_object):
            return False
        if patch_status(self.kube, key, status):
            self._statuses[key] = text
            self._written[key] = (status, time.monotonic())
            self._event_on_transition(key, obj, status)
        return True

    def _coalesce(self, key: MapKey, status: MapStatus, on_object: str | None) -> bool:
        """Whether to hold back a status whose only news is the bound count, written recently."""
        written = self._written.get(key)
        if written is None or on_object != self._statuses.get(key):
            return False
        last, when = written
        recent = time.monotonic() - when < self.bound_seconds
        return recent and only_bound_changed(last, status)

    def _event_on_transition(self, key: MapKey, obj: Obj | None, status: MapStatus) -> None:
        before = self._phases.get(key)
        self._phases[key] = status.phase
        if before == status.phase and status.phase is Phase.VALID:
            return
        if obj is None:
            return
        ref = ObjectRef.of({**obj, "kind": "ConfigMap", "apiVersion": "v1"})
        kind = NORMAL if status.phase is Phase.VALID else WARNING
        self.events.emit(ref, kind, status.phase.value, status.message)

    def _count_slots(self, compiler: Compiler, pods: PodWatch) -> None:
        reports = compiler.reports.values()
        total = sum(r.total for r in reports)
        served = sum(r.served for r in reports)
        self.metrics.slots.labels("total").set(total)
        self.metrics.slots.labels("served").set(served)
        self.metrics.slots.labels("blocked").set(total - served)
        self.metrics.slots.labels("bound").set(len(pods.binder.cache))
        self.metrics.slots.labels("drifted").set(pods.drift.total())


def rollout_note(key: MapKey, model: Model, pods: PodWatch) -> str:
    """How the map's drifted pods move, for its status (empty while none is drifted)."""
    cmap = model.maps.get(key)
    if cmap is None or not pods.drift.count(key):
        return ""
    if cmap.rollout.strategy is RolloutStrategy.MANUAL:
        return "manual: delete the drifted pods to move them"
    state = pods.rollouts.states.get(key)
    note = cmap.rollout.describe()
    if state is not None and state.down:
        note += f", {state.down} down"
    if state is not None and state.waiting:
        note += f", waiting: {state.waiting}"
    return note
