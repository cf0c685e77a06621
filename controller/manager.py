"""The controller process: informers on every replica, compile/write/bind on the leader only.

Standbys keep their caches warm so that a failover costs one lease expiry plus a slot-cache rebuild
from the pods already in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, assert_never

from controller import podfacts
from controller.binder import Binder
from controller.bindingkey import KeySecret, load_or_create, read_stored, write_back
from controller.changes import (
    Change,
    InventoryChanged,
    NodeChanged,
    PolicyChanged,
    SourceChanged,
    SourceDeleted,
)
from controller.dra import (
    CLAIMS_PATH,
    SLICES_PATH,
    TEMPLATE_SELECTOR,
    TEMPLATES_PATH,
    DraTracker,
    TemplateKeeper,
)
from controller.drift import DriftTracker
from controller.gitsource import GitSource
from controller.inventories import InventoryTracker
from controller.metrics import ControllerMetrics
from controller.renumber import RenumberTracker, bound_indices
from controller.rollout import Rollouts
from controller.settings import ControllerSettings
from controller.sources import SourceState, map_status, only_bound_changed, read_source, restore
from controller.writer import ModelWriter, patch_status
from kubeio.client import Kube
from kubeio.errors import APIError, APINotFoundError
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.informer import DELETED, Informer
from kubeio.leader import LeaderElector, LeaderSettings
from kubeio.paths import CONFIGMAPS, LEASES, NODES, PODS, SECRETS
from placement.annotations import (
    LEGACY_MAP_PREFIX,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
    decode_binding,
)
from placement.binding import Cluster, NodeState, Status, slot_status
from placement.compile import Compiler
from placement.dra import Enforcement
from placement.errors import Diagnostic, PlacementError
from placement.grants import (
    POLICY_CONFIGMAP,
    POLICY_KEY,
    GrantView,
    PlacementPolicy,
    check_map,
    parse_policy,
    resolve,
)
from placement.inventory import NodeInventory
from placement.keyring import KEYRING_FIELD, RingError, TrustView
from placement.maps import PlacementMap
from placement.model import MODEL_LABEL, Model, Provenance, model_data, read_model
from placement.restore import declared_map
from placement.status import MapStatus, Phase
from placement.types import MapKey, NodeName, RolloutStrategy, Sharing, SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)
Obj = dict[str, Any]


OPEN_GRANTS = (
    "no placement policy (ConfigMap %s/%s): every namespace whose users may create ConfigMaps "
    "and pods may place on every node and GPU, first come first served. Fine for a cluster of "
    "one team; on a shared cluster write a policy (README, Grants) or deny by default "
    "(--grants-default-deny, chart value global.grants.defaultDeny)"
)
_RING_HINT = (
    " (mend the Secret, or delete it to start a new key ring: pods bound under the old keys then"
    " keep their GPUs blocked until `gpuplace key adopt`)"
)
#: Installed by the chart, the controller may not create Secrets (RBAC cannot narrow `create` by
#: name): the chart renders the Secret and the leader fills it.
_CREATE_HINT = (
    " (a controller installed by the chart cannot create the Secret: `helm upgrade` or an ArgoCD"
    " sync renders it again, empty, and the leader writes back the ring it holds)"
)


def _legacy_only(obj: Obj) -> bool:
    """A Secret holding only the key of the releases before the ring (written back as a ring)."""
    return KEYRING_FIELD not in (obj.get("data") or {})


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
    def __init__(  # noqa: PLR0915 - one line a piece of state, each with why it is there
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
        self._unblocked: set[WakeKey] = set()  # binder keys those changes may unblock
        self.sources: dict[MapKey, SourceState] = {}
        self._policy = PlacementPolicy()
        self.grants = GrantView()
        self._grants_dirty = True  # the first pass resolves (deny-by-default needs no policy)
        self._node_labels: dict[str, dict[str, str]] = {}
        #: Valid maps and what the compiler needs of them, whether granted or not.
        self._offered: dict[MapKey, tuple[PlacementMap, str, Provenance]] = {}
        self._denied: dict[MapKey, tuple[Diagnostic, ...]] = {}
        self.tracker = InventoryTracker(self._on_inventory)
        self.dra: DraTracker | None = None
        self.templates: TemplateKeeper | None = None
        self._templates_dirty = False
        if settings.enforcement is Enforcement.DRA:
            self.dra = DraTracker(settings.dra, self._wake_binder)
            self.templates = TemplateKeeper(kube, settings.dra)
        self.binder = Binder(
            kube,
            settings.binder,
            self.metrics,
            self.events,
            self._cluster,
            self._on_bound,
            dra=self.dra,
            fence=self._holds_lease,
        )
        self.binder.report.on_map = self._on_trust_change
        self.key_secret = KeySecret(settings.system_namespace, settings.binder.key_secret_name)
        self.writer = ModelWriter(kube, settings.system_namespace)
        self.drift = DriftTracker(kube, self.events, self.metrics.drifted.set)
        self.renumber = RenumberTracker(kube, self.events, self.metrics.renumbered.set)
        self._running: dict[str, bool] = {}  # bound pod uid -> Running (informer threads write)
        #: bound pod uid -> (key ring version, annotations) last decoded and judged for it, so
        #: that the pod's later events (kwok or the kubelet writing its status) cost a comparison.
        self._bindings_seen: dict[str, tuple[str, dict[str, str]]] = {}
        self.rollouts = Rollouts(kube, self.events, self._is_running, self._servable)
        self._drift_dirty: set[MapKey] = set()  # maps whose bound pods to judge again
        # Its own lock: pod events must not wait for a compile holding the main one.
        self._drift_lock = threading.Lock()
        self._loop_beat = time.monotonic()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[Change] = []
        self._status_dirty: set[MapKey] = set()
        self._statuses: dict[MapKey, str] = {}
        self._written: dict[MapKey, tuple[MapStatus, float]] = {}  # last patched, and when
        self._phases: dict[MapKey, Phase] = {}
        self._leading = threading.Event()
        self._stop = threading.Event()
        self.lost_leadership = threading.Event()
        self._term = threading.Lock()  # orders the end of a start-up against its abort
        self._term_over = False
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
                CONFIGMAPS.collection(),
                name="sources",
                label_selector=f"{PLACEMENT_MAP_LABEL}=true",
                resync_seconds=resync,
            )
            inf["sources"].add_handler(self._on_source)
        inf |= {
            "nodes": Informer(self.kube, NODES.collection(), name="nodes"),
            "inventories": Informer(
                self.kube,
                CONFIGMAPS.collection(s.inventory_namespace),
                name="inventories",
            ),
            "leases": Informer(
                self.kube,
                LEASES.collection(s.inventory_namespace),
                name="leases",
            ),
            "model": Informer(
                self.kube,
                CONFIGMAPS.collection(s.system_namespace),
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
                PODS.collection(),
                name=f"pods:{name}",
                field_selector=f"spec.schedulerName={name}",
                resync_seconds=resync,
            )
        if self.dra is not None:
            inf["resourceslices"] = Informer(
                self.kube,
                SLICES_PATH,
                name="resourceslices",
                field_selector=f"spec.driver={s.dra.driver}",
            )
            inf["resourceclaims"] = Informer(self.kube, CLAIMS_PATH, name="resourceclaims")
            inf["claimtemplates"] = Informer(
                self.kube, TEMPLATES_PATH, name="claimtemplates", label_selector=TEMPLATE_SELECTOR
            )
            inf["resourceslices"].add_handler(self.dra.on_slice)
            inf["resourceclaims"].add_handler(self.dra.on_claim)
            inf["claimtemplates"].add_handler(self._on_template)
        inf["policy"] = Informer(
            self.kube,
            CONFIGMAPS.collection(s.system_namespace),
            name="policy",
            field_selector=f"metadata.name={POLICY_CONFIGMAP}",
        )
        inf["bindingkey"] = Informer(
            self.kube,
            SECRETS.collection(s.system_namespace),
            name="bindingkey",
            field_selector=f"metadata.name={s.binder.key_secret_name}",
        )
        inf["bindingkey"].add_handler(self._on_key_secret)
        inf["policy"].add_handler(
            lambda event, obj, _old: self._enqueue(PolicyChanged(None if event == DELETED else obj))
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
            self.settings.alias_label,
        )

    def _shared_maps(self) -> set[str]:
        # Read on every pod event: kept per model, not recomputed from all maps per pod.
        return self._shared

    # -- event handlers (informer threads: enqueue only) ----------------------------------------
    def _enqueue(self, change: Change) -> None:
        with self._wake:
            self._pending.append(change)
            self._wake.notify()

    def _on_source(self, event: str, obj: Obj, _old: Obj | None) -> None:
        self._enqueue(SourceDeleted(obj) if event == DELETED else SourceChanged(obj))

    def _on_node(self, event: str, obj: Obj, _old: Obj | None) -> None:
        self._enqueue(NodeChanged(obj, deleted=event == DELETED))

    def _on_inventory(self, node: NodeName, inventory: NodeInventory | None) -> None:
        self._enqueue(InventoryChanged(node, inventory))

    def _on_pod(self, event: str, obj: Obj, _old: Obj | None) -> None:
        if self.binder.active.is_set():
            self.binder.on_pod(event, obj, self._shared_maps())
        if not podfacts.is_bound(obj):
            return
        uid = podfacts.uid_of(obj)
        gone = event == DELETED or podfacts.is_finished(obj)
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        if gone:
            self._running.pop(uid, None)
            self._bindings_seen.pop(uid, None)
        else:
            self._running[uid] = obj.get("status", {}).get("phase") == "Running"
            if self.binder.active.is_set():
                trust = self.binder.trust
                seen = (trust.version if trust is not None else "", annotations)
                if self._bindings_seen.get(uid) == seen:
                    return  # the same binding as the pod's last event: nothing to judge again
                self._bindings_seen[uid] = seen
        decision = decode_binding(meta["namespace"], annotations)
        if decision is not None and not decision.map.name.startswith(LEGACY_MAP_PREFIX):
            with self._drift_lock:
                self._drift_dirty.add(decision.map)
        self._track_indices(obj, gone)

    def _track_indices(self, pod: Obj, gone: bool) -> None:
        """Feeds the renumbering tracker: bound pods with a verified envMode-index binding."""
        uid = podfacts.uid_of(pod)
        if gone:
            key = self.renumber.forget(uid)
            if key is not None:
                with self._lock:
                    self._status_dirty.add(key)
            return
        if not self.binder.active.is_set():
            return
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        trust = self.binder.trust
        if trust is None or not podfacts.verdict(pod, trust).trust.holds:
            return
        decision = decode_binding(meta["namespace"], annotations)
        if decision is None:
            return
        ref = ObjectRef("Pod", meta["namespace"], meta["name"], uid)
        tracked = bound_indices(ref, pod["spec"]["nodeName"], decision)
        if tracked is not None:
            self.renumber.track(uid, tracked)

    def _is_running(self, uid: str) -> bool:
        return self._running.get(uid, False)

    def _servable(self, uid: str, slot: SlotKey) -> Status | None:
        return slot_status(uid, slot, self._cluster(), self.binder.cache)

    def _on_bound(self, slot: SlotKey) -> None:
        with self._lock:
            self._status_dirty.add(slot.map)
        with self._drift_lock:
            self._drift_dirty.add(slot.map)

    # -- reconcile loop (one thread) ------------------------------------------------------------
    def _apply(self, change: Change) -> set[WakeKey] | None:
        """Feeds one change to the compiler; returns the binder keys it may unblock, or None
        when nothing changed (a node heartbeat, our own status patch coming back)."""
        match change:
            case SourceChanged(obj):
                return self._apply_source(obj)
            case SourceDeleted(obj):
                return self._apply_source_deleted(obj)
            case PolicyChanged(obj):
                return self._apply_policy(obj)
            case NodeChanged(obj, deleted):
                return self._apply_node(obj, deleted)
            case InventoryChanged(node, inventory):
                return self._apply_inventory(node, inventory)
            case _:
                assert_never(change)

    def _apply_source(self, obj: Obj) -> set[WakeKey] | None:
        prev_key = MapKey(obj["metadata"]["namespace"], obj["metadata"]["name"])
        known = self.sources.get(prev_key)
        state = read_source(obj, known)
        if state is known:
            return None  # same text: e.g. our own status patch came back
        self.sources[state.key] = state
        if state.valid is not None and (
            known is None or known.valid != state.valid or known.provenance != state.provenance
        ):
            self._offer(state.valid, state.valid_version, state.provenance)
        self._status_dirty.add(state.key)
        return set()

    def _apply_source_deleted(self, obj: Obj) -> set[WakeKey]:
        key = MapKey(obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.sources.pop(key, None)
        self._offered.pop(key, None)
        self._denied.pop(key, None)
        self.compiler.remove_map(key)
        self._statuses.pop(key, None)
        self._written.pop(key, None)
        return set()

    def _apply_node(self, obj: Obj, deleted: bool) -> set[WakeKey] | None:
        name = NodeName(obj["metadata"]["name"])
        before = self.nodes.get(name)
        after: NodeState | None = None
        labels = dict(obj["metadata"].get("labels") or {})
        if self._node_labels.get(name) != labels or deleted:
            self._grants_dirty = self._grants_dirty or bool(self._policy.grants)
        if deleted:
            self._node_labels.pop(name, None)
            self.nodes.pop(name, None)
            self.compiler.remove_node(name)
            if self._leading.is_set():
                self._remove_inventory(name)
        else:
            self._node_labels[name] = labels
            after = node_state(obj, self.settings.alias_label)
            if before == after:
                return None
            self.nodes[name] = after
            self.compiler.set_node(name, labels)
        if (before and before.alias) or (after and after.alias):
            self._aliases_dirty = True
        keys = {WakeKey.node(name), WakeKey.nodes()}
        for seen in (before, after):
            if seen is not None and seen.alias:
                keys.add(WakeKey.node(seen.alias))
        return keys

    def _apply_inventory(self, node: NodeName, inventory: NodeInventory | None) -> set[WakeKey]:
        if inventory is None:
            self.compiler.remove_inventory(node)
        else:
            self.compiler.set_inventory(inventory)
        self._status_dirty |= self.renumber.check(node, inventory)
        return {WakeKey.inventory(node)}

    def _remove_inventory(self, node: NodeName) -> None:
        """A deleted node's inventory and Lease go with it: no agent renews them any more, and
        a node of the same name joining later starts from its own agent's report. Pods bound to
        the node keep their holdings until they are gone (the pod garbage collector deletes
        them), so their GPUs are not handed out twice meanwhile."""
        ns = self.settings.inventory_namespace
        for path in (
            CONFIGMAPS.item(node, ns),
            LEASES.item(node, ns),
        ):
            try:
                self.kube.delete(path)
            except APINotFoundError:
                pass
            except APIError as exc:
                log.warning("inventory of deleted node %s not removed: %s", node, exc)

    def _sweep_inventories(self) -> None:
        """Removes inventories of nodes that no longer exist and whose Lease nobody renews
        (nodes deleted while no controller was leading)."""
        with self.informers["inventories"].lock:
            names = [n for (_ns, n) in self.informers["inventories"].store]
        for name in names:
            node = NodeName(name)
            if node in self.nodes or name == "kube-root-ca.crt":
                continue
            state = self.tracker.states.get(node)
            if state is None or not state.fresh:
                self._remove_inventory(node)

    # -- grants ------------------------------------------------------------------------------
    def _offer(self, pmap: PlacementMap, version: str, provenance: Provenance) -> None:
        """Hands a valid map to the compiler if its namespace's grants allow all of it; a map
        outside them is never compiled (and stops being served), its status names each entry."""
        self._offered[pmap.key] = (pmap, version, provenance)
        denied = tuple(check_map(self.grants, pmap))
        if denied:
            self._denied[pmap.key] = denied
            self.compiler.remove_map(pmap.key)
        else:
            self._denied.pop(pmap.key, None)
            self.compiler.set_map(pmap, version, provenance)
        self._status_dirty.add(pmap.key)

    def _warn_if_open(self) -> None:
        """Says, while no placement policy exists and deny-by-default is off, that every
        namespace may claim every GPU (fine for one team, not for a shared cluster)."""
        if not self.settings.grants_default_deny:
            log.warning(OPEN_GRANTS, self.settings.system_namespace, POLICY_CONFIGMAP)

    def _apply_policy(self, obj: Obj | None) -> set[WakeKey] | None:
        if obj is None:
            self._policy = PlacementPolicy()
            self._warn_if_open()
        else:
            text = (obj.get("data") or {}).get(POLICY_KEY, "")
            source = f"configmap {self.settings.system_namespace}/{POLICY_CONFIGMAP} {POLICY_KEY}"
            try:
                policy = parse_policy(text, source)
            except PlacementError as exc:
                # The last valid policy keeps applying: a typo must not open every node.
                message = exc.format()
                log.warning("placement policy invalid, keeping the last valid one: %s", message)
                ref = ObjectRef.of({**obj, "kind": "ConfigMap", "apiVersion": "v1"})
                self.events.emit(ref, WARNING, "PolicyInvalid", message)
                return None
            if policy == self._policy:
                return None
            self._policy = policy
        self._grants_dirty = True
        return set()

    def _regrant(self) -> bool:
        """Resolves the policy against the nodes; re-offers every map if the grants changed."""
        view = resolve(
            self._policy,
            self.settings.grants_default_deny,
            self._node_labels,
            self.settings.alias_label,
        )
        if view == self.grants:
            return False
        self.grants = view
        self.compiler.set_grants(view)
        for pmap, version, provenance in list(self._offered.values()):
            self._offer(pmap, version, provenance)
        return True

    def _rebuild_aliases(self) -> None:
        aliases: dict[str, set[NodeName]] = {}
        for state in self.nodes.values():
            if state.alias:
                aliases.setdefault(state.alias, set()).add(state.name)
        self.aliases = {k: frozenset(v) for k, v in aliases.items()}

    def _apply_pending(self) -> None:
        """Feeds everything queued to the compiler (caller holds the lock)."""
        batch, self._pending = self._pending, []
        for change in batch:
            unblocked = self._apply(change)
            if unblocked is not None:
                self._uncompiled = True
                self._unblocked |= unblocked
        if self._aliases_dirty:
            self._rebuild_aliases()
            self._aliases_dirty = False
        if self._grants_dirty:
            self._grants_dirty = False
            if self._regrant():
                self._uncompiled = True
                self._unblocked.add(WakeKey.model())

    def _reconcile_loop(self) -> None:
        last_status = last_expiry = 0.0
        while not self._stop.is_set():
            self._loop_beat = time.monotonic()
            with self._wake:
                if not self._pending:
                    self._wake.wait(0.5)
                # Everything queued since the last pass is compiled once, and only when something
                # changed: node heartbeats and the echoes of status patches arrive many times a
                # second on a large cluster and change nothing.
                self._apply_pending()
                # Also what was applied while this replica was not leading yet, or between the
                # compile that started its leadership and the moment it counted as leading.
                if self._leads() and self._uncompiled:
                    self._compile_and_publish(set())
            if self._leads():
                self._judge_drift()
                self._sync_templates()
            now = time.monotonic()
            if self._leads() and now - last_status > 0.5 and self._status_dirty:
                self._write_statuses()
                last_status = time.monotonic()
            if now - last_expiry >= 1.0:  # looks at every inventory: once a second is enough
                self.tracker.check_expiry()
                last_expiry = now

    def _wake_binder(self, keys: Iterable[WakeKey]) -> None:
        self.binder.wake(keys)

    def _on_template(self, event: str, _obj: Obj, _old: Obj | None) -> None:
        if event in (DELETED, "MODIFIED"):  # someone else changed one: put it back
            self._templates_dirty = True

    def _sync_templates(self) -> None:
        """One ResourceClaimTemplate per map of the model (dra enforcement), after it changed."""
        if self.templates is None or not self._templates_dirty:
            return
        self._templates_dirty = False
        informer = self.informers["claimtemplates"]
        with informer.lock:
            current = dict(informer.store)
        self.templates.sync(list(self.model.maps), current)

    def _judge_drift(self) -> None:
        """Drift of the bound pods of maps that changed or whose pods did, then rollouts."""
        with self._drift_lock:
            dirty, self._drift_dirty = self._drift_dirty, set()
        model = self.model
        changed = self.drift.check(dirty, model, self.binder.cache) if dirty else set()
        changed |= self.rollouts.step(model, self.drift, self.binder.cache)
        if changed:
            with self._lock:
                self._status_dirty |= changed

    def _compile_and_publish(self, keys: set[WakeKey]) -> None:
        if not self._holds_lease():
            return  # the model is the leader's to write; what is pending stays pending
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
            with self._drift_lock:
                self._drift_dirty |= changed
            self._templates_dirty = True
            keys.add(WakeKey.model())
            keys |= {WakeKey.map(k) for k in changed}
        self._status_dirty |= set(reports) & set(self.sources)
        self.ready.set()
        if keys:
            self.binder.wake(keys)

    def _write_statuses(self) -> None:
        if not self._holds_lease():
            return
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
            cmap = self.model.maps.get(key)
            denied = self._denied.get(key)
            if denied:
                state = replace(state, valid=None, valid_version="", errors=denied)
            status = map_status(
                state,
                reports.get(key),
                self.model.generation,
                bound,
                self.drift.count(key),
                cmap.provenance.revision if cmap else "",
                self._rollout_note(key),
                self.renumber.count(key),
                self.binder.report.count(key),
            )
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
        self._count_slots()

    def _rollout_note(self, key: MapKey) -> str:
        """How the map's drifted pods move, for its status (empty while none is drifted)."""
        cmap = self.model.maps.get(key)
        if cmap is None or not self.drift.count(key):
            return ""
        if cmap.rollout.strategy is RolloutStrategy.MANUAL:
            return "manual: delete the drifted pods to move them"
        state = self.rollouts.states.get(key)
        note = cmap.rollout.describe()
        if state is not None and state.down:
            note += f", {state.down} down"
        if state is not None and state.waiting:
            note += f", waiting: {state.waiting}"
        return note

    def _count_slots(self) -> None:
        reports = self.compiler.reports.values()
        total = sum(r.total for r in reports)
        served = sum(r.served for r in reports)
        self.metrics.slots.labels("total").set(total)
        self.metrics.slots.labels("served").set(served)
        self.metrics.slots.labels("blocked").set(total - served)
        self.metrics.slots.labels("bound").set(len(self.binder.cache))
        self.metrics.slots.labels("drifted").set(self.drift.total())

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
    def _holds_lease(self) -> bool:
        """Whether the lease is held and unexpired by the local clock: checked before every
        write only the leader may make (Bindings, the model, statuses, evictions)."""
        return self.elector.holds()

    def _leads(self) -> bool:
        return self._leading.is_set() and self._holds_lease()

    def _start_leading(self) -> None:
        """Runs on its own thread while the elector keeps renewing; gives up at any step once
        the lease is no longer held (the elector then calls _stop_leading)."""
        self.metrics.leader.set(1)
        self._wait_for_sync()
        if not self._holds_lease():
            log.warning("lease lost during start-up: not leading")
            return
        self._compile_from_stored()
        self._sweep_inventories()
        with self.informers["policy"].lock:
            if not self.informers["policy"].store:
                self._warn_if_open()
        # What a bound pod holds depends on what its signature proves: the ring before the rebuild.
        self.binder.trust = self._binding_trust()
        if not self._holds_lease():
            log.warning("lease lost during start-up: not leading")
            return
        bound = self._rebuild_from_pods()
        log.info(
            "leading: model generation %d, %d bound pods in the slot cache",
            self.model.generation,
            bound,
        )
        with self._term:
            if self._term_over or not self._holds_lease():
                log.warning("lease lost during start-up: not leading")
                return
            self.binder.start()
            self._leading.set()

    def _wait_for_sync(self) -> None:
        for informer in self.informers.values():
            informer.wait_synced()
        if self.git is not None:
            self.git.synced.wait()
        if self.settings.startup_delay_seconds:
            # Test hook: a start-up slower than the lease (a large cluster's first sync).
            log.warning("start-up delayed by %.1f s", self.settings.startup_delay_seconds)
            self._stop.wait(self.settings.startup_delay_seconds)

    def _compile_from_stored(self) -> None:
        """The first compile of this leader, seeded with the stored model (earlier `count`
        picks stay, sources invalid now keep serving what the stored model served)."""
        with self.informers["model"].lock:
            stored = model_data(self.informers["model"].store.values())
        seeded: Model | None = None
        try:
            seeded = read_model(stored) if stored else None
        except ValueError as exc:
            log.warning("stored model unreadable, compiling from scratch: %s", exc)
        if seeded is not None:
            with self._lock:
                self.compiler.seed(seeded)
        with self._lock:
            # The informers have queued every object they listed: compile them all at once,
            # not a partial model that the next pass would correct with another generation.
            self._apply_pending()
            if seeded is not None:
                self._restore_last_valid(seeded)
            self._compile_and_publish(set())

    def _rebuild_from_pods(self) -> int:
        """The slot cache, renumbering and drift trackers from the pods the informers hold;
        returns how many bound pods hold a slot."""
        pods = self._pods()
        self.binder.active.set()
        bound = self.binder.rebuild(pods, self._shared_maps())
        for pod in pods:
            if podfacts.is_bound(pod):
                self._track_indices(pod, podfacts.is_finished(pod))
        inventories = {n: state.inventory for n, state in self.tracker.states.items()}
        self._status_dirty |= self.renumber.check_all(inventories)
        with self._drift_lock:
            self._drift_dirty |= {h.slot.map for h in self.binder.cache.holdings()}
        return bound

    def _restore_last_valid(self, stored: Model) -> None:
        """Sources that are invalid now and had no valid version in this process keep serving
        the version the stored model holds, as they would have without the restart (caller
        holds the lock). A map whose source is gone is not restored: deleting it is meant."""
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
                    self.sources[key] = replace(state, provenance=cmap.provenance)
                    self._offer(state.valid, state.valid_version, cmap.provenance)
                continue
            pmap = declared_map(cmap)
            restored = restore(state, pmap, cmap.source_version, cmap.provenance)
            self.sources[key] = restored
            self._offer(pmap, cmap.source_version, cmap.provenance)
            self._status_dirty.add(key)
            log.info(
                "map %s is invalid; serving version %s from the stored model",
                key,
                cmap.source_version,
            )

    def _binding_trust(self) -> TrustView:
        while True:
            try:
                return load_or_create(self.kube, self.key_secret)
            except (APIError, RingError) as exc:
                if self._stop.is_set():
                    raise
                log.error(
                    "binding key ring not usable, not binding until it is: %s%s",
                    exc,
                    _RING_HINT if isinstance(exc, RingError) else _CREATE_HINT,
                )
                self._stop.wait(self.settings.retry_seconds)

    def _on_key_secret(self, event: str, obj: Obj, _old: Obj | None) -> None:
        """The ring's Secret changed (a rotation, an adoption, a deletion, an edit): the leader
        judges every bound pod again. An unreadable ring is reported and the last good one keeps
        serving; a deleted or emptied one gets the ring this leader holds written back."""
        held = self.binder.trust
        if not self.binder.active.is_set() or held is None:
            return  # not leading: the leader's start-up reads the Secret itself
        try:
            stored = None if event == DELETED else read_stored(obj, self.key_secret)
            if stored is None or stored.ring is None:
                view = write_back(self.kube, self.key_secret, held)
            elif _legacy_only(obj):
                view = load_or_create(self.kube, self.key_secret)
            else:
                view = stored.view
        except RingError as exc:
            self.metrics.key_ring_errors.inc()
            log.error(
                "binding key ring unreadable, the last good one serves: %s%s", exc, _RING_HINT
            )
            return
        except APIError as exc:
            log.warning(
                "binding key ring not written, the last good one serves: %s%s", exc, _CREATE_HINT
            )
            return
        if view.version == held.version:
            return
        log.info(
            "binding key ring changed: %d key(s), signing with %s, %d adoption record(s)",
            len(view.ring.keys),
            view.ring.signer.id,
            len(view.adoptions),
        )
        self.binder.retrust(view, self._pods(), self._shared_maps())

    def _pods(self) -> list[Obj]:
        pods: list[Obj] = []
        for key, informer in self.informers.items():
            if key.startswith("pods:"):
                with informer.lock:
                    pods.extend(informer.store.values())
        return pods

    def _on_trust_change(self, key: MapKey) -> None:
        with self._wake:
            self._status_dirty.add(key)
            self._wake.notify()

    def _stop_leading(self) -> None:
        self.metrics.leader.set(0)
        with self._term:
            # A start-up still running on its own thread must not start the binder after this.
            self._term_over = True
            if not self._stop.is_set():
                self.lost_leadership.set()
            self._leading.clear()
        self.binder.stop()
        self.drift.stop()

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

    def health_problems(self) -> list[str]:
        """What makes this replica unhealthy: an informer failing to list or watch, a stuck
        reconcile loop, a leader-election loop that stopped trying, a dead binder."""
        grace = max(30.0, 4 * self.settings.lease_seconds)
        now = time.monotonic()
        problems = [
            f"informer {name} has been failing for over {grace:.0f}s"
            for name, informer in self.informers.items()
            if not informer.healthy(grace)
        ]
        if now - self._loop_beat > grace:
            problems.append(f"reconcile loop stuck for {now - self._loop_beat:.0f}s")
        if now - self.elector.last_attempt > grace and not self._starting_to_lead():
            problems.append(
                f"leader election made no attempt for {now - self.elector.last_attempt:.0f}s"
            )
        if self._leading.is_set() and not self.binder.alive():
            problems.append("binder thread is not running")
        return problems

    def _starting_to_lead(self) -> bool:
        # Between winning the lease and leading, the elector waits for the informers to sync;
        # those have their own check.
        return self.elector.is_leader.is_set() and not self._leading.is_set()

    def healthy(self) -> bool:
        problems = self.health_problems()
        for problem in problems:
            log.error("unhealthy: %s", problem)
        return not problems

    def snapshot(self) -> Mapping[MapKey, SourceState]:
        return dict(self.sources)
