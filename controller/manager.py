"""The controller process: informers on every replica, compile/write/bind on the leader only.

Standbys keep their caches warm so that a failover costs one lease expiry plus a slot-cache rebuild
from the pods already in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from controller.binder import Binder
from controller.gitsource import GitSource
from controller.inventories import InventoryTracker
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings
from controller.sources import SourceState, map_status, only_bound_changed, read_source
from controller.writer import ModelWriter, patch_status
from kubeio.client import Kube
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.informer import DELETED, Informer
from kubeio.leader import LeaderElector, LeaderSettings
from placement.annotations import PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
from placement.binding import Cluster, NodeState
from placement.compile import Compiler
from placement.inventory import NodeInventory
from placement.model import MODEL_LABEL, Model, decode_model
from placement.status import MapStatus, Phase
from placement.types import MapKey, NodeName, Sharing, SlotKey

log = logging.getLogger(__name__)
Obj = dict[str, Any]


def node_state(obj: Obj, alias_label: str) -> NodeState:
    conditions = obj.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    labels = obj["metadata"].get("labels") or {}
    return NodeState(
        NodeName(obj["metadata"]["name"]),
        ready,
        not obj.get("spec", {}).get("unschedulable", False),
        labels.get(alias_label),
    )


class Controller:
    def __init__(
        self, kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.events = EventRecorder(kube, "gpuplace-controller")
        self.compiler = Compiler(settings.alias_label)
        self.model = Model()
        self._shared: set[str] = set()  # maps with sharing: shared, in the current model
        self.nodes: dict[NodeName, NodeState] = {}
        self.aliases: dict[str, frozenset[NodeName]] = {}
        self._aliases_dirty = False
        self._uncompiled = False  # changes applied to the compiler and not compiled yet
        self._unblocked: set[str] = set()  # binder keys those changes may unblock
        self.sources: dict[MapKey, SourceState] = {}
        self.tracker = InventoryTracker(self._on_inventory)
        self.binder = Binder(
            kube, settings.binder, self.metrics, self.events, self._cluster, self._on_bound
        )
        self.writer = ModelWriter(kube, settings.system_namespace)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[tuple[str, Any]] = []
        self._status_dirty: set[MapKey] = set()
        self._statuses: dict[MapKey, str] = {}
        self._written: dict[MapKey, tuple[MapStatus, float]] = {}  # last patched, and when
        self._phases: dict[MapKey, Phase] = {}
        self._leading = threading.Event()
        self._stop = threading.Event()
        self.lost_leadership = threading.Event()
        self.ready = threading.Event()
        self.informers = self._make_informers()
        self.git: GitSource | None = None
        if settings.source == "git":
            self.git = GitSource(settings.git, self._enqueue)
        self.elector = LeaderElector(
            kube,
            LeaderSettings(
                settings.system_namespace,
                settings.lease_name,
                settings.identity,
                settings.lease_seconds,
                settings.renew_deadline_seconds,
                settings.retry_seconds,
            ),
            self._start_leading,
            self._stop_leading,
        )

    # -- wiring ---------------------------------------------------------------------------------
    def _make_informers(self) -> dict[str, Informer]:
        s = self.settings
        resync = s.resync_seconds
        inf: dict[str, Informer] = {}
        if s.source == "configmap":
            inf["sources"] = Informer(
                self.kube,
                "/api/v1/configmaps",
                name="sources",
                label_selector=f"{PLACEMENT_MAP_LABEL}=true",
                resync_seconds=resync,
            )
            inf["sources"].add_handler(self._on_source)
        inf |= {
            "nodes": Informer(self.kube, "/api/v1/nodes", name="nodes"),
            "inventories": Informer(
                self.kube,
                f"/api/v1/namespaces/{s.inventory_namespace}/configmaps",
                name="inventories",
            ),
            "leases": Informer(
                self.kube,
                f"/apis/coordination.k8s.io/v1/namespaces/{s.inventory_namespace}/leases",
                name="leases",
            ),
            "model": Informer(
                self.kube,
                f"/api/v1/namespaces/{s.system_namespace}/configmaps",
                name="model",
                label_selector=f"{MODEL_LABEL}=true",
            ),
        }
        names = [s.binder.scheduler_name]
        if s.binder.legacy:
            names += [n for n in s.binder.legacy_scheduler_names if n not in names]
        for name in names:
            inf[f"pods:{name}"] = Informer(
                self.kube,
                "/api/v1/pods",
                name=f"pods:{name}",
                field_selector=f"spec.schedulerName={name}",
                resync_seconds=resync,
            )
        inf["nodes"].add_handler(self._on_node)
        inf["inventories"].add_handler(self.tracker.on_configmap)
        inf["leases"].add_handler(self.tracker.on_lease)
        for key, informer in inf.items():
            if key.startswith("pods:"):
                informer.add_handler(self._on_pod)
        return inf

    def _cluster(self) -> Cluster:
        return Cluster(
            self.model,
            self.nodes,
            self.aliases,
            self.tracker.states,
            self.settings.binder.require_inventory,
        )

    def _shared_maps(self) -> set[str]:
        # Read on every pod event: kept per model, not recomputed from all maps per pod.
        return self._shared

    # -- event handlers (informer threads: enqueue only) ----------------------------------------
    def _enqueue(self, kind: str, payload: Any) -> None:
        with self._wake:
            self._pending.append((kind, payload))
            self._wake.notify()

    def _on_source(self, event: str, obj: Obj, _old: Obj | None) -> None:
        self._enqueue("source-deleted" if event == DELETED else "source", obj)

    def _on_node(self, event: str, obj: Obj, _old: Obj | None) -> None:
        self._enqueue("node-deleted" if event == DELETED else "node", obj)

    def _on_inventory(self, node: NodeName, inventory: NodeInventory | None) -> None:
        self._enqueue("inventory", (node, inventory))

    def _on_pod(self, event: str, obj: Obj, _old: Obj | None) -> None:
        if self.binder.active.is_set():
            self.binder.on_pod(event, obj, self._shared_maps())

    def _on_bound(self, slot: SlotKey) -> None:
        with self._lock:
            self._status_dirty.add(slot.map)

    # -- reconcile loop (one thread) ------------------------------------------------------------
    def _apply(self, kind: str, payload: Any) -> set[str] | None:
        """Feeds one change to the compiler; returns the binder keys it may unblock, or None
        when nothing changed (a node heartbeat, our own status patch coming back)."""
        if kind == "source":
            prev_key = MapKey(payload["metadata"]["namespace"], payload["metadata"]["name"])
            known = self.sources.get(prev_key)
            state = read_source(payload, known)
            if state is known:
                return None  # same text: e.g. our own status patch came back
            self.sources[state.key] = state
            if state.valid is not None and (known is None or known.valid != state.valid):
                self.compiler.set_map(state.valid, state.valid_version)
            self._status_dirty.add(state.key)
            return set()
        if kind == "source-deleted":
            key = MapKey(payload["metadata"]["namespace"], payload["metadata"]["name"])
            self.sources.pop(key, None)
            self.compiler.remove_map(key)
            self._statuses.pop(key, None)
            self._written.pop(key, None)
            return set()
        if kind in ("node", "node-deleted"):
            name = NodeName(payload["metadata"]["name"])
            before = self.nodes.get(name)
            after: NodeState | None = None
            if kind == "node-deleted":
                self.nodes.pop(name, None)
                self.compiler.remove_node(name)
            else:
                after = node_state(payload, self.settings.alias_label)
                if before == after:
                    return None
                self.nodes[name] = after
                self.compiler.set_node(name, payload["metadata"].get("labels") or {})
            if (before and before.alias) or (after and after.alias):
                self._aliases_dirty = True
            keys = {f"node:{name}", "nodes"}
            for seen in (before, after):
                if seen is not None and seen.alias:
                    keys.add(f"node:{seen.alias}")
            return keys
        if kind == "inventory":
            node, inventory = payload
            if inventory is None:
                self.compiler.remove_inventory(node)
            else:
                self.compiler.set_inventory(inventory)
            return {f"inventory:{node}"}
        return None

    def _rebuild_aliases(self) -> None:
        aliases: dict[str, set[NodeName]] = {}
        for state in self.nodes.values():
            if state.alias:
                aliases.setdefault(state.alias, set()).add(state.name)
        self.aliases = {k: frozenset(v) for k, v in aliases.items()}

    def _apply_pending(self) -> None:
        """Feeds everything queued to the compiler (caller holds the lock)."""
        batch, self._pending = self._pending, []
        for kind, payload in batch:
            unblocked = self._apply(kind, payload)
            if unblocked is not None:
                self._uncompiled = True
                self._unblocked |= unblocked
        if self._aliases_dirty:
            self._rebuild_aliases()
            self._aliases_dirty = False

    def _reconcile_loop(self) -> None:
        last_status = last_expiry = 0.0
        while not self._stop.is_set():
            with self._wake:
                if not self._pending:
                    self._wake.wait(0.5)
                # Everything queued since the last pass is compiled once, and only when something
                # changed: node heartbeats and the echoes of status patches arrive many times a
                # second on a large cluster and change nothing.
                self._apply_pending()
                # Also what was applied while this replica was not leading yet, or between the
                # compile that started its leadership and the moment it counted as leading.
                if self._leading.is_set() and self._uncompiled:
                    self._compile_and_publish(set())
            now = time.monotonic()
            if self._leading.is_set() and now - last_status > 0.5 and self._status_dirty:
                self._write_statuses()
                last_status = time.monotonic()
            if now - last_expiry >= 1.0:  # looks at every inventory: once a second is enough
                self.tracker.check_expiry()
                last_expiry = now

    def _compile_and_publish(self, keys: set[str]) -> None:
        keys |= self._unblocked
        self._uncompiled, self._unblocked = False, set()
        started = time.perf_counter()
        model, reports = self.compiler.build()
        self.metrics.compile_seconds.observe(time.perf_counter() - started)
        if model.generation != self.model.generation or not self.ready.is_set():
            current = {
                name: obj.get("data") or {}
                for (_ns, name), obj in self.informers["model"].store.items()
            }
            self.writer.write(model, current)
            changed = {
                k
                for k in set(model.maps) | set(self.model.maps)
                if model.maps.get(k) is not self.model.maps.get(k)
            }
            self.model = model
            self._shared = {str(k) for k, m in model.maps.items() if m.sharing is Sharing.SHARED}
            self.metrics.model_generation.set(model.generation)
            self._status_dirty |= changed
            keys.add("model")
            keys |= {f"map:{k}" for k in changed}
        self._status_dirty |= set(reports) & set(self.sources)
        self.ready.set()
        if keys:
            self.binder.wake(keys)

    def _write_statuses(self) -> None:
        with self._lock:
            dirty, self._status_dirty = self._status_dirty, set()
        reports = self.compiler.reports
        phases: dict[str, int] = {p.value: 0 for p in Phase}
        deferred: set[MapKey] = set()
        for key in sorted(dirty):
            state = self.sources.get(key)
            if state is None:
                continue
            bound = self.binder.cache.bound_count(key)
            status = map_status(state, reports.get(key), self.model.generation, bound)
            text = status.to_json()
            sources = self.informers.get("sources")
            obj = sources.get(key.namespace, key.name) if sources else None
            on_object = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(
                STATUS_ANNOTATION
            )
            if self._statuses.get(key) == text and on_object == text:
                continue
            if sources is None:  # git source: no ConfigMap to carry the status
                self._statuses[key] = text
                self._phases[key] = status.phase
                continue
            if self._coalesce(key, status, on_object):
                deferred.add(key)
                continue
            if patch_status(self.kube, key, status):
                self._statuses[key] = text
                self._written[key] = (status, time.monotonic())
                self._event_on_transition(key, obj, status)
        if deferred:
            with self._lock:
                self._status_dirty |= deferred
        for key in self.sources:
            phase = self._phases.get(key)
            if phase is not None:
                phases[phase.value] += 1
        for phase_name, count in phases.items():
            self.metrics.maps.labels(phase_name).set(count)

    def _coalesce(self, key: MapKey, status: MapStatus, on_object: str | None) -> bool:
        """Whether to hold back a status whose only news is the bound count, written recently."""
        written = self._written.get(key)
        if written is None or on_object != self._statuses.get(key):
            return False
        last, when = written
        recent = time.monotonic() - when < self.settings.status_bound_seconds
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

    # -- leadership -----------------------------------------------------------------------------
    def _start_leading(self) -> None:
        self.metrics.leader.set(1)
        for informer in self.informers.values():
            informer.wait_synced()
        if self.git is not None:
            self.git.synced.wait()
        stored = {
            name: obj.get("data") or {}
            for (_ns, name), obj in self.informers["model"].store.items()
        }
        if stored:
            try:
                with self._lock:
                    self.compiler.seed(decode_model(stored))
            except (ValueError, KeyError) as exc:
                log.warning("stored model unreadable, compiling from scratch: %s", exc)
        with self._lock:
            # The informers have queued every object they listed: compile them all at once,
            # not a partial model that the next pass would correct with another generation.
            self._apply_pending()
            self._compile_and_publish(set())
        pods: list[Obj] = []
        for key, informer in self.informers.items():
            if key.startswith("pods:"):
                with informer.lock:
                    pods.extend(informer.store.values())
        self.binder.active.set()
        bound = self.binder.rebuild(pods, self._shared_maps())
        log.info(
            "leading: model generation %d, %d bound pods in the slot cache",
            self.model.generation,
            bound,
        )
        self.binder.start()
        self._leading.set()

    def _stop_leading(self) -> None:
        self.metrics.leader.set(0)
        if self._leading.is_set() and not self._stop.is_set():
            self.lost_leadership.set()
        self._leading.clear()
        self.binder.stop()

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Blocks until stop() or the loss of leadership."""
        for informer in self.informers.values():
            informer.start()
        if self.git is not None:
            self.git.start()
        loop = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        loop.start()
        self.elector.run()

    def stop(self) -> None:
        self._stop.set()
        self.elector.stop()
        if self.git is not None:
            self.git.stop()
        for informer in self.informers.values():
            informer.stop()

    def snapshot(self) -> Mapping[MapKey, SourceState]:
        return dict(self.sources)
