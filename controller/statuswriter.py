"""Map status: the one writer of `gpuplace.io/status` on source ConfigMaps and of the PlacementMaps'
status, of the map Events on phase transitions, of the map and slot gauges and of the placement
policy's verdicts. Its queue is keyed by map (and `POLICY`); every other part adds the maps whose
status may have changed. A reconcile reads the published snapshot (controller/snapshot.py) and the
counts (controller/counts.py) and writes on the leader only; a status whose only news is the bound
count is held back while one was written recently (its key comes back when the hold ends), so that
a burst of binds costs one patch per map."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Final, Literal

from controller.counts import MapCounts
from controller.metrics import ControllerMetrics
from controller.policystatus import write_policy_status
from controller.snapshot import Published, Snapshot
from controller.sources import Form, SourceState, map_status, only_bound_changed
from controller.workqueue import RETRY, Requeue
from controller.writer import patch_resource_status, patch_status
from kubeio.client import Kube, Obj
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.informer import Informer
from kubeio.times import now_time
from placement.annotations import STATUS_ANNOTATION
from placement.model import Model
from placement.resourcestatus import comparable, resource_status
from placement.status import MapStatus, Phase
from placement.types import API_VERSION, KIND, MapKey, RolloutStrategy

#: What a status is written onto: a map's form and key.
Target = tuple[Form, MapKey]
#: The status queue's key for the placement policy's verdicts.
POLICY: Final = "policy"
StatusKey = MapKey | Literal["policy"]


@dataclass(eq=False)
class StatusWriter:
    kube: Kube
    events: EventRecorder
    metrics: ControllerMetrics
    published: Published
    counts: MapCounts
    #: The source ConfigMaps' informer; None when maps come from git (no object to patch) or
    #: the ConfigMap form is off.
    sources: Informer | None = field(kw_only=True)
    #: The PlacementMap custom resources' informer; None when that form is off.
    resources: Informer | None = field(default=None, kw_only=True)
    bound_seconds: float = field(kw_only=True)
    #: The policy's informers by form (its status is written when its verdict changes).
    policies: Mapping[Form, Informer] = field(default_factory=dict, kw_only=True)
    system_namespace: str = field(default="gpuplace-system", kw_only=True)
    #: Whether the lease is held right now: checked before each batch of writes.
    holds_lease: Callable[[], bool] = field(default=lambda: True, kw_only=True)
    _statuses: dict[Target, str] = field(default_factory=dict, init=False)
    #: last patched, and when
    _written: dict[Target, tuple[MapStatus, float]] = field(default_factory=dict, init=False)
    _phases: dict[MapKey, Phase] = field(default_factory=dict, init=False)
    #: Every map's status as last computed (read by the per-map series at scrape time; a dict
    #: swapped entry by entry on the status worker, copied by the reader).
    latest: dict[MapKey, MapStatus] = field(default_factory=dict, init=False)
    _last_phase: dict[Target, Phase] = field(default_factory=dict, init=False)

    def forget(self, key: MapKey) -> None:
        """The map's source is gone."""
        for form in Form:
            self._statuses.pop((form, key), None)
            self._written.pop((form, key), None)
        self.latest.pop(key, None)
        self._phases.pop(key, None)

    def reconcile(self, keys: list[StatusKey]) -> Requeue[StatusKey]:
        """Writes the status of each map of `keys` whose status changed, onto each form that
        declares it, and the policy's verdicts for `POLICY`; then the gauges. Returns the keys
        held back (for how long) or whose write failed."""
        if not self.holds_lease():
            return None  # the leadership is ending: what the next leader lists, it writes
        snap = self.published.current
        again: dict[StatusKey, float] = {}
        for key in keys:
            if key == POLICY:
                if not self._write_policy(snap):
                    again[key] = RETRY
                continue
            assert isinstance(key, MapKey)
            delay = self._write_map(key, snap)
            if delay is not None:
                again[key] = delay
        self._gauges(snap)
        return again

    def status(self, key: MapKey, snap: Snapshot) -> MapStatus | None:
        """The map's status from the snapshot and the counts; None when it has no source."""
        state = snap.sources.get(key)
        if state is None:
            return None
        cmap = snap.model.maps.get(key)
        denied = snap.denied.get(key)
        if denied:
            state = replace(state, valid=None, valid_version="", errors=denied)
        return map_status(
            state,
            snap.reports.get(key),
            snap.model.generation,
            self.counts.bound(key),
            self.counts.drifted(key),
            cmap.provenance.revision if cmap else "",
            rollout_note(key, snap.model, self.counts),
            self.counts.renumbered(key),
            self.counts.unverifiable(key),
            self.counts.gang(key),
        )

    def _write_map(self, key: MapKey, snap: Snapshot) -> float | None:
        """One map's status onto each form; None when done, else when to try again."""
        status = self.status(key, snap)
        if status is None:
            self.forget(key)
            return None
        state = snap.sources[key]
        self.latest[key] = status
        self._phases[key] = status.phase
        declared = snap.forms.get(key) or {state.form: state}
        both = len(declared) > 1 and not state.form_conflict
        supersedes = f"configmap {key}" if both else ""
        again: float | None = None
        for form, own in declared.items():
            shown = for_form(status, state, own, declared)
            delay = self._write_one(key, shown, form, own, supersedes)
            if delay is not None:
                again = delay if again is None or delay == RETRY else min(again, delay)
        return again

    def _gauges(self, snap: Snapshot) -> None:
        phases: dict[str, int] = {p.value: 0 for p in Phase}
        for key in snap.sources:
            phase = self._phases.get(key)
            if phase is not None:
                phases[phase.value] += 1
        for phase_name, count in phases.items():
            self.metrics.maps.labels(phase_name).set(count)
        reports = snap.reports.values()
        total = sum(r.total for r in reports)
        served = sum(r.served for r in reports)
        self.metrics.slots.labels("total").set(total)
        self.metrics.slots.labels("served").set(served)
        self.metrics.slots.labels("blocked").set(total - served)
        self.metrics.slots.labels("bound").set(self.counts.bound_total())
        self.metrics.slots.labels("drifted").set(self.counts.drifted_total())

    def _write_one(
        self,
        key: MapKey,
        status: MapStatus,
        form: Form = Form.CONFIGMAP,
        own: SourceState | None = None,
        supersedes: str = "",
    ) -> float | None:
        """Patches one status if it changed; None when done, else when to try again (the rest of
        its hold, or `RETRY` when the write failed)."""
        target = (form, key)
        if form is Form.RESOURCE:
            obj = self.resources.get(key.namespace, key.name) if self.resources else None
            if obj is None:
                return None
            current = obj.get("status") if isinstance(obj.get("status"), dict) else None
            body = resource_status(
                status,
                own.generation if own is not None else 0,
                current,
                now_time(),
                source_file=own.provenance.file if own is not None else "",
                supersedes=supersedes,
            )
            text = comparable(body)
            on_object = comparable(current) if current is not None else None
            write = partial(patch_resource_status, self.kube, key, body)
        else:
            obj = self.sources.get(key.namespace, key.name) if self.sources else None
            text = status.to_json()
            on_object = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(
                STATUS_ANNOTATION
            )
            if self.sources is None:  # git source: no ConfigMap to carry the status
                self._statuses[target] = text
                return None
            write = partial(patch_status, self.kube, key, status)
        if self._statuses.get(target) == text and on_object == text:
            return None
        hold = self._hold(target, status, on_object)
        if hold > 0:
            return hold
        if not write():
            return RETRY
        self._statuses[target] = text
        self._written[target] = (status, time.monotonic())
        self._event_on_transition(target, obj, status)
        return None

    def _hold(self, target: Target, status: MapStatus, on_object: str | None) -> float:
        """How much longer to hold back a status whose only news is the bound count, written
        recently; 0: write it now."""
        written = self._written.get(target)
        if written is None or on_object != self._statuses.get(target):
            return 0.0
        last, when = written
        left = self.bound_seconds - (time.monotonic() - when)
        return left if left > 0 and only_bound_changed(last, status) else 0.0

    def _event_on_transition(self, target: Target, obj: Obj | None, status: MapStatus) -> None:
        """An Event on the object when its phase changes (and on every write that is not
        Valid)."""
        before = self._last_phase.get(target)
        self._last_phase[target] = status.phase
        if before == status.phase and status.phase is Phase.VALID:
            return
        if obj is None:
            return
        if target[0] is Form.RESOURCE:
            ref = ObjectRef.of({**obj, "kind": KIND, "apiVersion": API_VERSION})
        else:
            ref = ObjectRef.of({**obj, "kind": "ConfigMap", "apiVersion": "v1"})
        kind = NORMAL if status.phase is Phase.VALID else WARNING
        self.events.emit(ref, kind, status.phase.value, status.message)

    def _write_policy(self, snap: Snapshot) -> bool:
        """The placement policy's verdicts, onto the objects they judge; whether all were
        written."""
        done = True
        for form, verdict in snap.verdicts.items():
            informer = self.policies.get(form)
            obj = snap.policy_objects.get(form)
            if informer is None or obj is None:
                continue
            meta = obj.get("metadata") or {}
            current = (
                informer.get(str(meta.get("namespace") or ""), str(meta.get("name") or "")) or obj
            )
            done &= write_policy_status(
                self.kube,
                current,
                verdict,
                resource=form is Form.RESOURCE,
                namespace=self.system_namespace,
            )
        return done


def for_form(
    status: MapStatus,
    served: SourceState,
    own: SourceState,
    declared: Mapping[Form, SourceState],
) -> MapStatus:
    """The status one form of a map shows: the map's, with that form's own text fingerprint,
    and, on a ConfigMap that a custom resource of the same content supersedes, saying so."""
    shown = replace(status, observed_data_hash=own.data_hash, observed_version=own.version)
    superseded = (
        own.form is Form.CONFIGMAP
        and Form.RESOURCE in declared
        and served.form is Form.RESOURCE
        and not served.form_conflict
    )
    if superseded:
        message = (
            f"superseded by PlacementMap {served.key}: the custom resource of the same content "
            f"serves this map; this ConfigMap can be deleted. {status.message}"
        )
        shown = replace(shown, message=message)
    return shown


def rollout_note(key: MapKey, model: Model, counts: MapCounts) -> str:
    """How the map's drifted pods move, for its status (empty while none is drifted)."""
    cmap = model.maps.get(key)
    if cmap is None or not counts.drifted(key):
        return ""
    if cmap.rollout.strategy is RolloutStrategy.MANUAL:
        return "manual: delete the drifted pods to move them"
    state = counts.rollout(key)
    note = cmap.rollout.describe()
    if state is not None and state.down:
        note += f", {state.down} down"
    if state is not None and state.waiting:
        note += f", waiting: {state.waiting}"
    return note
