"""Map status: the one writer of `gpuplace.io/status` on source ConfigMaps, of the map Events on
phase transitions, and of the map and slot gauges. Takes the maps marked dirty (by any part of the
controller) at most twice a second on the leader; a status whose only news is the bound count is
held back while one was written recently, so that a burst of binds costs one patch per map."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from controller.dirty import DirtyMaps
from controller.grantkeeper import GrantKeeper
from controller.metrics import ControllerMetrics
from controller.podwatch import PodWatch
from controller.policystatus import write_policy_status
from controller.sources import Form, SourceState, map_status, only_bound_changed
from controller.writer import patch_resource_status, patch_status
from kubeio.client import Kube, Obj
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.informer import Informer
from kubeio.times import now_time
from placement.annotations import STATUS_ANNOTATION
from placement.compile import Compiler
from placement.model import Model
from placement.resourcestatus import comparable, resource_status
from placement.status import MapStatus, Phase
from placement.types import API_VERSION, KIND, MapKey, RolloutStrategy

#: What a status is written onto: a map's form and key.
Target = tuple[Form, MapKey]


@dataclass(eq=False)
class StatusWriter:
    kube: Kube
    events: EventRecorder
    metrics: ControllerMetrics
    dirty: DirtyMaps
    #: The source ConfigMaps' informer; None when maps come from git (no object to patch) or
    #: the ConfigMap form is off.
    sources: Informer | None = field(kw_only=True)
    #: The PlacementMap custom resources' informer; None when that form is off.
    resources: Informer | None = field(default=None, kw_only=True)
    bound_seconds: float = field(kw_only=True)
    #: The policy's informers by form (its status is written when its verdict changes).
    policies: Mapping[Form, Informer] = field(default_factory=dict, kw_only=True)
    system_namespace: str = field(default="gpuplace-system", kw_only=True)
    _statuses: dict[Target, str] = field(default_factory=dict, init=False)
    #: last patched, and when
    _written: dict[Target, tuple[MapStatus, float]] = field(default_factory=dict, init=False)
    _phases: dict[MapKey, Phase] = field(default_factory=dict, init=False)
    #: Every map's status as last computed (read by the per-map series at scrape time; a dict
    #: swapped entry by entry on the reconcile thread, copied by the reader).
    latest: dict[MapKey, MapStatus] = field(default_factory=dict, init=False)
    _last_phase: dict[Target, Phase] = field(default_factory=dict, init=False)

    def forget(self, key: MapKey) -> None:
        """The map's source is gone."""
        for form in Form:
            self._statuses.pop((form, key), None)
            self._written.pop((form, key), None)
        self.latest.pop(key, None)

    def write(
        self,
        states: Mapping[MapKey, SourceState],
        model: Model,
        compiler: Compiler,
        grants: GrantKeeper,
        pods: PodWatch,
        forms: Mapping[MapKey, Mapping[Form, SourceState]] | None = None,
    ) -> None:
        """Writes the status of every dirty map whose status changed, onto each form that
        declares it."""
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
                pods.binder.gangs.state(key),
            )
            self.latest[key] = status
            self._phases[key] = status.phase
            declared = (forms or {}).get(key) or {state.form: state}
            both = len(declared) > 1 and not state.form_conflict
            supersedes = f"configmap {key}" if both else ""
            for form, own in declared.items():
                shown = for_form(status, state, own, declared)
                if not self._write_one(key, shown, form, own, supersedes):
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
        self._write_policy(grants)

    def _write_one(
        self,
        key: MapKey,
        status: MapStatus,
        form: Form = Form.CONFIGMAP,
        own: SourceState | None = None,
        supersedes: str = "",
    ) -> bool:
        """Patches one status if it changed; False when it is held back for later."""
        target = (form, key)
        if form is Form.RESOURCE:
            obj = self.resources.get(key.namespace, key.name) if self.resources else None
            if obj is None:
                return True
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
                return True
            write = partial(patch_status, self.kube, key, status)
        if self._statuses.get(target) == text and on_object == text:
            return True
        if self._coalesce(target, status, on_object):
            return False
        if write():
            self._statuses[target] = text
            self._written[target] = (status, time.monotonic())
            self._event_on_transition(target, obj, status)
        return True

    def _coalesce(self, target: Target, status: MapStatus, on_object: str | None) -> bool:
        """Whether to hold back a status whose only news is the bound count, written recently."""
        written = self._written.get(target)
        if written is None or on_object != self._statuses.get(target):
            return False
        last, when = written
        recent = time.monotonic() - when < self.bound_seconds
        return recent and only_bound_changed(last, status)

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

    def _write_policy(self, grants: GrantKeeper) -> None:
        """The placement policy's verdicts, onto the objects they judge."""
        if not grants.verdicts_dirty:
            return
        done = True
        for form, verdict in grants.verdicts.items():
            informer = self.policies.get(form)
            obj = grants.policy_objects.get(form)
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
        grants.verdicts_dirty = not done

    def _count_slots(self, compiler: Compiler, pods: PodWatch) -> None:
        reports = compiler.reports.values()
        total = sum(r.total for r in reports)
        served = sum(r.served for r in reports)
        self.metrics.slots.labels("total").set(total)
        self.metrics.slots.labels("served").set(served)
        self.metrics.slots.labels("blocked").set(total - served)
        self.metrics.slots.labels("bound").set(len(pods.binder.cache))
        self.metrics.slots.labels("drifted").set(pods.drift.total())


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
