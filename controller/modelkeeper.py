"""Sources -> compile -> model: the one writer of the model, and of the snapshot every other reconciler
reads (controller/snapshot.py). Its queue has one key, `MODEL`, added with every typed change the
informers put in the inbox (maps, the policy, nodes, inventories); a pass applies them all, compiles
once when something changed, and on the leader publishes the model ConfigMaps; then it swaps the
snapshot and only then tells the others: the maps whose status to write, whose pods to judge for
drift, the claim templates, the binder's wake keys. Runs on the model queue's one worker, and on the
thread that starts a leadership (`lead`); both hold the inbox's lock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import assert_never

from controller.changequeue import ChangeQueue
from controller.changes import (
    Change,
    InventoryChanged,
    NodeChanged,
    PolicyChanged,
    SourceChanged,
    SourceDeleted,
)
from controller.grantkeeper import GrantKeeper
from controller.metrics import ControllerMetrics
from controller.nodekeeper import NodeKeeper
from controller.renumber import RenumberTracker
from controller.snapshot import Published, Snapshot
from controller.sources import Form, SourceState, merge, read_resource, read_source, restore
from controller.statuswriter import POLICY, StatusKey
from controller.templatesync import TEMPLATES
from controller.workqueue import WorkQueue
from controller.writer import ModelWriter
from kubeio.client import Obj, obj_key
from placement.compile import Compiler
from placement.inventory import NodeInventory
from placement.model import Model, read_model
from placement.restore import declared_map
from placement.types import MapKey, NodeName, Sharing
from placement.wake import WakeKey

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ModelKeeper:
    compiler: Compiler
    grants: GrantKeeper
    nodes: NodeKeeper
    renumber: RenumberTracker
    writer: ModelWriter
    metrics: ControllerMetrics
    #: The typed changes the informers queue (its lock orders a pass against a leadership's start).
    inbox: ChangeQueue
    published: Published
    #: The other concerns' queues, told after each swap.
    statuses: WorkQueue[StatusKey] = field(kw_only=True)
    drift: WorkQueue[MapKey] = field(kw_only=True)
    templates: WorkQueue[str] | None = field(kw_only=True)
    #: The model ConfigMaps' data by name, as stored (the writer compares against it).
    stored: Callable[[], Mapping[str, Mapping[str, str]]] = field(kw_only=True)
    #: Wakes the binder's waiting pods for these keys.
    wake: Callable[[set[WakeKey]], None] = field(kw_only=True)
    #: Whether this replica leads (a deleted node's inventory is then removed).
    leading: Callable[[], bool] = field(kw_only=True)
    #: Whether the lease is held right now (checked before the model is written).
    holds_lease: Callable[[], bool] = field(kw_only=True)

    #: Set once this replica's leadership has published its first model (readiness).
    ready: threading.Event = field(default_factory=threading.Event, init=False)
    model: Model = field(default_factory=Model, init=False)
    #: Maps with sharing: shared, in the current model (read on every pod event).
    shared: set[str] = field(default_factory=set, init=False)
    #: The state each map is served from (`sources.merge` of its forms).
    sources: dict[MapKey, SourceState] = field(default_factory=dict, init=False)
    #: Each map's state in each form that declares it (ConfigMap, custom resource).
    forms: dict[MapKey, dict[Form, SourceState]] = field(default_factory=dict, init=False)
    #: changes applied to the compiler and not compiled yet
    _uncompiled: bool = field(default=False, init=False)
    #: binder keys those changes may unblock
    _unblocked: set[WakeKey] = field(default_factory=set, init=False)
    #: What to tell the other concerns once the pass's snapshot is published.
    _status_keys: set[StatusKey] = field(default_factory=set, init=False)
    _drift_keys: set[MapKey] = field(default_factory=set, init=False)
    _wake_keys: set[WakeKey] = field(default_factory=set, init=False)
    _templates_due: bool = field(default=False, init=False)
    #: Whether the snapshot lags what this keeper holds (a node heartbeat changes nothing, and a
    #: large cluster sends many a second: no copy for them).
    _stale: bool = field(default=True, init=False)

    @property
    def uncompiled(self) -> bool:
        return self._uncompiled

    # -- the model queue's reconcile ------------------------------------------------------------
    def reconcile(self, _keys: list[str]) -> None:
        """One pass: everything queued since the last, compiled once and only when something
        changed (node heartbeats and the echoes of status patches arrive many times a second on a
        large cluster and change nothing); on the leader also what was applied before it led."""
        with self.inbox.lock:
            self.apply_all(self.inbox.take())
            if self.leading() and self._uncompiled:
                self.publish(self.stored, first=not self.ready.is_set())
            self.flush()

    def lead(self, stored: Mapping[str, Mapping[str, str]]) -> None:
        """A leadership's first pass (its start-up thread), seeded with the stored model: earlier
        `count` picks stay, and sources invalid now keep serving what the stored model served.
        Everything the informers listed is compiled at once, not a partial model that the next
        pass would correct with another generation."""
        with self.inbox.lock:
            seeded = self.seed(stored)
            self.apply_all(self.inbox.take())
            if seeded is not None:
                self.restore_last_valid(seeded)
            self.publish(self.stored, first=True)
            self.flush()

    def flush(self) -> None:
        """Publishes this pass's snapshot, then tells the other concerns what changed: they read
        the new snapshot, never the one before (caller holds the inbox's lock)."""
        if self._stale or self.grants.verdicts_dirty:
            self._swap()
        status_keys, self._status_keys = self._status_keys, set()
        drift_keys, self._drift_keys = self._drift_keys, set()
        wake_keys, self._wake_keys = self._wake_keys, set()
        self.statuses.add_all(status_keys)
        self.drift.add_all(drift_keys)
        if self._templates_due and self.templates is not None:
            self.templates.add(TEMPLATES)
        self._templates_due = False
        if wake_keys:
            self.wake(wake_keys)

    def _swap(self) -> None:
        self._stale = False
        self.published.swap(
            Snapshot(
                model=self.model,
                shared=self.shared,
                sources=MappingProxyType(dict(self.sources)),
                forms=MappingProxyType(
                    {k: MappingProxyType(dict(v)) for k, v in self.forms.items()}
                ),
                reports=MappingProxyType(dict(self.compiler.reports)),
                denied=MappingProxyType(dict(self.grants.denied)),
                policy_objects=MappingProxyType(dict(self.grants.policy_objects)),
                verdicts=MappingProxyType(dict(self.grants.verdicts)),
            )
        )
        if self.grants.verdicts_dirty:
            self.grants.verdicts_dirty = False
            self._status_keys.add(POLICY)

    # -- applying changes -------------------------------------------------------------------
    def apply_all(self, batch: Iterable[Change]) -> None:
        """Feeds a batch of changes to the compiler; compiled by the next `publish`."""
        for change in batch:
            unblocked = self.apply(change)
            if unblocked is not None:
                self._uncompiled = self._stale = True
                self._unblocked |= unblocked
        self.nodes.refresh_aliases()
        regranted = self.grants.regrant()
        if regranted is not None:
            self._stale = True
            self._status_keys.update(regranted)
            self._uncompiled = True
            self._unblocked.add(WakeKey.model())

    def apply(self, change: Change) -> set[WakeKey] | None:
        """One change; returns the binder keys it may unblock, or None when nothing changed (a
        node heartbeat, our own status patch coming back)."""
        match change:
            case SourceChanged(obj, form):
                return self._apply_source(obj, form)
            case SourceDeleted(obj, form):
                return self._apply_source_deleted(obj, form)
            case PolicyChanged(obj, form):
                return set() if self.grants.apply_policy(obj, form) else None
            case NodeChanged(obj, deleted):
                return self.nodes.apply(obj, deleted, self.leading())
            case InventoryChanged(node, inventory):
                return self._apply_inventory(node, inventory)
            case _:
                assert_never(change)

    def _apply_source(self, obj: Obj, form: Form) -> set[WakeKey] | None:
        key = MapKey(*obj_key(obj))
        forms = self.forms.setdefault(key, {})
        known = forms.get(form)
        read = read_resource if form is Form.RESOURCE else read_source
        state = read(obj, known)
        if state is known:
            return None  # same text: e.g. our own status patch came back
        forms[form] = state
        self._serve(key, merge(forms, self.sources.get(key)))
        return set()

    def _serve(self, key: MapKey, state: SourceState) -> None:
        """Makes `state` the one the map is served from; offers its valid version if it is new."""
        known = self.sources.get(key)
        self.sources[key] = state
        if state.valid is not None and (
            known is None
            or known.valid != state.valid
            or known.valid_version != state.valid_version
            or known.provenance != state.provenance
        ):
            self.grants.offer(state.valid, state.valid_version, state.provenance)
        self._status_keys.add(key)

    def _keep(self, key: MapKey, state: SourceState) -> None:
        """Replaces the served state by one rebuilt from the stored model; a single form's
        state with it, so the next read of that form starts from it."""
        self._stale = True
        self.sources[key] = state
        if not state.form_conflict and state.form in self.forms.get(key, {}):
            self.forms[key][state.form] = state

    def _apply_source_deleted(self, obj: Obj, form: Form) -> set[WakeKey]:
        key = MapKey(*obj_key(obj))
        forms = self.forms.get(key, {})
        forms.pop(form, None)
        if forms:  # the other form still declares the map: it serves it now
            self._serve(key, merge(forms, self.sources.get(key)))
            return set()
        self.forms.pop(key, None)
        self.sources.pop(key, None)
        self.grants.forget(key)
        self.compiler.remove_map(key)
        self._status_keys.add(key)  # its status bookkeeping goes
        return set()

    def _apply_inventory(self, node: NodeName, inventory: NodeInventory | None) -> set[WakeKey]:
        if inventory is None:
            self.compiler.remove_inventory(node)
        else:
            self.compiler.set_inventory(inventory)
        self._status_keys.update(self.renumber.check(node, inventory))
        return {WakeKey.inventory(node)}

    # -- compiling and publishing -------------------------------------------------------------
    def publish(self, current: Callable[[], Mapping[str, Mapping[str, str]]], first: bool) -> bool:
        """Compiles what changed and, when the model did (or on a leadership's `first` pass),
        writes it (`current`: the model ConfigMaps' data by name); the binder is woken by the
        `flush` that follows. Only while the lease is held (returns False otherwise: what is
        pending stays pending)."""
        if not self.holds_lease():
            return False
        keys, self._uncompiled, self._unblocked = self._unblocked, False, set()
        self._stale = True  # the reports, at least
        started = time.perf_counter()
        model, reports = self.compiler.build()
        self.metrics.compile_seconds.observe(time.perf_counter() - started)
        if model.generation != self.model.generation or first:
            self.writer.write(model, current())
            changed = {
                k
                for k in set(model.maps) | set(self.model.maps)
                if model.maps.get(k) is not self.model.maps.get(k)
            }
            self.model = model
            self.shared = {str(k) for k, m in model.maps.items() if m.sharing is Sharing.SHARED}
            self.metrics.model_generation.set(model.generation)
            self._status_keys.update(changed)
            self._drift_keys.update(changed)
            self._templates_due = True
            keys.add(WakeKey.model())
            keys |= {WakeKey.map(k) for k in changed}
        self._status_keys.update(set(reports) & set(self.sources))
        self._wake_keys |= keys
        if first:
            self.ready.set()
        return True

    def seed(self, stored: Mapping[str, Mapping[str, str]]) -> Model | None:
        """Seeds the compiler with the stored model (earlier `count` picks stay); returns it, or
        None when there is none or it cannot be read."""
        try:
            seeded = read_model(stored) if stored else None
        except ValueError as exc:
            log.warning("stored model unreadable, compiling from scratch: %s", exc)
            return None
        if seeded is not None:
            self.compiler.seed(seeded)
        return seeded

    def restore_last_valid(self, stored: Model) -> None:
        """Sources that are invalid now and had no valid version in this process keep serving
        the version the stored model holds, as they would have without the restart. A map whose
        source is gone is not restored: deleting it is meant."""
        for key, cmap in stored.maps.items():
            state = self.sources.get(key)
            if state is None:
                continue
            if state.valid is not None:
                if (
                    state.valid_version == cmap.source_version
                    and state.provenance != cmap.provenance
                ):
                    # The same text, re-stamped by later commits that left it alone: it still
                    # came from the revision the model recorded (and no shard is rewritten).
                    self._keep(key, replace(state, provenance=cmap.provenance))
                    self.grants.offer(state.valid, state.valid_version, cmap.provenance)
                    self._status_keys.add(key)
                continue
            pmap = declared_map(cmap)
            restored = restore(state, pmap, cmap.source_version, cmap.provenance)
            self._keep(key, restored)
            self.grants.offer(pmap, cmap.source_version, cmap.provenance)
            self._status_keys.add(key)
            log.info(
                "map %s is invalid; serving version %s from the stored model",
                key,
                cmap.source_version,
            )
