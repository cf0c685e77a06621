"""The controller process: shared informers on every replica; compile, write and bind on the leader.

The manager owns the lifecycle and nothing else: the shared informers (`controller.informers`),
leader election, the reconcile loop's thread and lock, and health. Each concern is a reconciler of
its own, wired here:

- `ModelKeeper` (modelkeeper.py): sources -> compile -> model, the model's one writer; with
  `GrantKeeper` (grants) and `NodeKeeper` (nodes, aliases, inventories of deleted nodes);
- `StatusWriter` (statuswriter.py): the maps' status annotation, their Events and gauges;
- `PodWatch` (podwatch.py): bound pods after binding, drift and rollouts;
- `KeyWatch` (keywatch.py): the binding key ring;
- `Binder` (binder.py): the hot path, with its own queue, slot cache and request loop;
- `DraTracker` and `TemplateKeeper` (dra.py): ResourceSlices, claims and claim templates.

Informer threads only enqueue typed changes (`controller.changes`) or mark maps dirty; the reconcile
loop applies them in order. Standbys keep their caches warm so that a failover costs one lease
expiry plus a slot-cache rebuild from the pods already in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from controller import changes, heap
from controller.binder import Binder
from controller.bindingkey import KeySecret
from controller.changes import Change
from controller.dirty import DirtyMaps
from controller.dra import DraTracker, TemplateKeeper
from controller.drift import DriftTracker
from controller.gitsource import GitSource
from controller.grantkeeper import GrantKeeper
from controller.informers import SharedInformers, snapshot
from controller.inventories import InventoryTracker
from controller.keywatch import KeyWatch
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import PodWatch
from controller.renumber import RenumberTracker
from controller.rollout import Rollouts
from controller.settings import ControllerSettings
from controller.sources import Form, SourceState
from controller.statuswriter import StatusWriter
from controller.writer import ModelWriter
from kubeio.client import Kube, Obj
from kubeio.events import EventRecorder
from kubeio.informer import DELETED, Informer
from kubeio.leader import LeaderElector, LeaderSettings
from placement.binding import Cluster, Status, slot_status
from placement.compile import Compiler
from placement.dra import Enforcement
from placement.inventory import NodeInventory
from placement.model import model_data
from placement.types import MapKey, NodeName, SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self, kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.events = EventRecorder(kube, "gpuplace-controller")
        self.informers = SharedInformers.create(kube, settings)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[Change] = []
        self.statuses = DirtyMaps()
        self.compiler = Compiler(settings.alias_label)
        self.grants = GrantKeeper(settings, self.compiler, self.events)
        self.nodes = NodeKeeper(
            kube, settings.inventory_namespace, settings.alias_label, self.compiler, self.grants
        )
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
        self.renumber = RenumberTracker(kube, self.events, self.metrics.renumbered.set)
        self.maps = ModelKeeper(
            self.compiler,
            self.grants,
            self.nodes,
            self.tracker,
            self.renumber,
            ModelWriter(kube, settings.system_namespace),
            self.metrics,
            self.statuses,
            require_inventory=settings.binder.require_inventory,
            alias_label=settings.alias_label,
        )
        self.drift = DriftTracker(kube, self.events, self.metrics.drifted.set)
        self.rollouts = Rollouts(kube, self.events, self._is_running, self._servable)
        self.pods = PodWatch(self.binder, self.drift, self.rollouts, self.renumber, self.statuses)
        self.status_writer = StatusWriter(
            kube,
            self.events,
            self.metrics,
            self.statuses,
            sources=self.informers.sources,
            resources=self.informers.resources,
            bound_seconds=settings.status_bound_seconds,
            policies=self._policy_informers(),
            system_namespace=settings.system_namespace,
        )
        self.keys = KeyWatch(
            kube,
            KeySecret(settings.system_namespace, settings.binder.key_secret_name),
            self.binder,
            self.metrics,
            self.informers.pods_held,
            lambda: self.maps.shared,
        )
        self._loop_beat = time.monotonic()
        self._leading = threading.Event()
        self._stop = threading.Event()
        self.lost_leadership = threading.Event()
        self._term = threading.Lock()  # orders the end of a start-up against its abort
        self._term_over = False
        self.ready = threading.Event()
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
        self._wire()

    # -- wiring ---------------------------------------------------------------------------------
    def _wire(self) -> None:
        inf = self.informers
        maps = self.maps
        maps.on_published = self._on_published
        maps.on_deleted = self.status_writer.forget
        maps.wake = self.binder.wake
        maps.leading = self._leading.is_set
        maps.holds_lease = self._holds_lease
        if self.dra is not None:
            self.tracker.taints_of = self.dra.taints_on
            self.dra.on_taints = self.tracker.retaint
        if inf.sources is not None:
            inf.sources.add_handler(self._on_source)
        if inf.resources is not None:
            inf.resources.add_handler(self._on_resource)
        inf.nodes.add_handler(
            lambda event, obj, _old: self._enqueue(
                changes.NodeChanged(obj, deleted=event == DELETED)
            )
        )
        inf.inventories.add_handler(self.tracker.on_configmap)
        inf.leases.add_handler(self.tracker.on_lease)
        for informer in inf.pods:
            informer.add_handler(lambda event, obj, _old: self.pods.on_pod(event, obj, maps.shared))
        if inf.dra is not None and self.dra is not None:
            inf.dra.slices.add_handler(self.dra.on_slice)
            inf.dra.claims.add_handler(self.dra.on_claim)
            inf.dra.taint_rules.add_handler(self.dra.on_taint_rule)
            inf.dra.templates.add_handler(self._on_template)
        for form, informer in self._policy_informers().items():
            informer.add_handler(self._policy_handler(form))
        inf.binding_key.add_handler(self.keys.on_secret)

    def _cluster(self) -> Cluster:
        return self.maps.cluster()

    # -- event handlers (informer threads: enqueue or mark only) --------------------------------
    def _enqueue(self, change: Change) -> None:
        with self._wake:
            self._pending.append(change)
            self._wake.notify()

    def _on_source(self, event: str, obj: Obj, _old: Obj | None) -> None:
        self._enqueue(
            changes.SourceDeleted(obj) if event == DELETED else changes.SourceChanged(obj)
        )

    def _on_resource(self, event: str, obj: Obj, _old: Obj | None) -> None:
        form = Form.RESOURCE
        self._enqueue(
            changes.SourceDeleted(obj, form)
            if event == DELETED
            else changes.SourceChanged(obj, form)
        )

    def _policy_informers(self) -> dict[Form, Informer]:
        out = {Form.CONFIGMAP: self.informers.policy}
        if self.informers.policy_resource is not None:
            out[Form.RESOURCE] = self.informers.policy_resource
        return out

    def _policy_handler(self, form: Form) -> Callable[[str, Obj, Obj | None], None]:
        def handle(event: str, obj: Obj, _old: Obj | None) -> None:
            self._enqueue(changes.PolicyChanged(None if event == DELETED else obj, form))

        return handle

    def _on_inventory(self, node: NodeName, inventory: NodeInventory | None) -> None:
        self._enqueue(changes.InventoryChanged(node, inventory))

    def _is_running(self, uid: str) -> bool:
        return self.pods.is_running(uid)

    def _servable(self, uid: str, slot: SlotKey) -> Status | None:
        return slot_status(uid, slot, self.maps.cluster(), self.binder.cache)

    def _on_bound(self, slot: SlotKey) -> None:
        self.statuses.add(slot.map)
        self.pods.drift_dirty.add(slot.map)

    def _on_trust_change(self, key: MapKey) -> None:
        self.statuses.add(key)
        with self._wake:
            self._wake.notify()

    def _wake_binder(self, keys: Iterable[WakeKey]) -> None:
        self.binder.wake(keys)

    def _on_published(self, changed: set[MapKey]) -> None:
        self.pods.drift_dirty.update(changed)
        self._templates_dirty = True

    def _on_template(self, event: str, _obj: Obj, _old: Obj | None) -> None:
        if event in (DELETED, "MODIFIED"):  # someone else changed one: put it back
            self._templates_dirty = True

    # -- reconcile loop (one thread) ------------------------------------------------------------
    def _apply_pending(self) -> None:
        """Feeds everything queued to the compiler (caller holds the lock)."""
        batch, self._pending = self._pending, []
        self.maps.apply_all(batch)

    def _publish(self) -> None:
        """Compiles and, on the leader, publishes (caller holds the lock)."""
        if self.maps.publish(self.informers.model.shards, first=not self.ready.is_set()):
            self.ready.set()

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
                if self._leads() and self.maps.uncompiled:
                    self._publish()
            if self._leads():
                self.pods.judge(self.maps.model)
                self._sync_templates()
            now = time.monotonic()
            if self._leads() and now - last_status > 0.5 and self.statuses:
                self._write_statuses()
                last_status = time.monotonic()
            if now - last_expiry >= 1.0:  # looks at every inventory: once a second is enough
                self.tracker.check_expiry()
                last_expiry = now

    def _write_statuses(self) -> None:
        if not self._holds_lease():
            return
        self.status_writer.write(
            self.maps.sources,
            self.maps.model,
            self.compiler,
            self.grants,
            self.pods,
            self.maps.forms,
        )

    def _sync_templates(self) -> None:
        """One ResourceClaimTemplate per map of the model (dra enforcement), after it changed."""
        if self.templates is None or self.informers.dra is None or not self._templates_dirty:
            return
        self._templates_dirty = False
        current = snapshot(self.informers.dra.templates)
        self.templates.sync(list(self.maps.model.maps), current)

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
        with self._term:
            if not self._term_over:
                self.binder.prepare()
        self._wait_for_sync()
        if not self._holds_lease():
            log.warning("lease lost during start-up: not leading")
            return
        self._compile_from_stored()
        self.nodes.sweep_inventories(self.informers.inventories, self.tracker)
        if not snapshot(self.informers.policy):
            self.grants.warn_if_open()
        # What a bound pod holds depends on what its signature proves: the ring before the rebuild.
        self.binder.trust = self.keys.load(self._stop, self.settings.retry_seconds)
        if not self._holds_lease():
            log.warning("lease lost during start-up: not leading")
            return
        bound = self._rebuild_from_pods()
        log.info(
            "leading: model generation %d, %d bound pods in the slot cache",
            self.maps.model.generation,
            bound,
        )
        with self._term:
            if self._term_over or not self._holds_lease():
                log.warning("lease lost during start-up: not leading")
                return
            # What was just listed and rebuilt lives as long as the leadership: out of the
            # collector's generations, never scanned again (controller/heap.py).
            heap.freeze()
            self.binder.start()
            self._leading.set()

    def _wait_for_sync(self) -> None:
        self.informers.wait_synced()
        if self.git is not None:
            self.git.synced.wait()
        if self.settings.startup_delay_seconds:
            # Test hook: a start-up slower than the lease (a large cluster's first sync).
            log.warning("start-up delayed by %.1f s", self.settings.startup_delay_seconds)
            self._stop.wait(self.settings.startup_delay_seconds)

    def _compile_from_stored(self) -> None:
        """The first compile of this leader, seeded with the stored model (earlier `count`
        picks stay, sources invalid now keep serving what the stored model served)."""
        stored = model_data(self.informers.model.objects())
        with self._lock:
            seeded = self.maps.seed(stored)
            # The informers have queued every object they listed: compile them all at once,
            # not a partial model that the next pass would correct with another generation.
            self._apply_pending()
            if seeded is not None:
                self.maps.restore_last_valid(seeded)
            self._publish()

    def _rebuild_from_pods(self) -> int:
        """The slot cache, renumbering and drift trackers from the pods the informers hold;
        returns how many bound pods hold a slot."""
        pods = self.informers.pods_held()
        self.binder.active.set()
        bound = self.binder.rebuild(pods, self.maps.shared)
        self.pods.rebuild(pods)
        inventories = {n: state.inventory for n, state in self.tracker.states.items()}
        self.statuses.update(self.renumber.check_all(inventories))
        return bound

    def _stop_leading(self) -> bool:
        """The leadership ended (the elector no longer counts it held): the binder stops and
        drains. Returns whether no Binding of this leadership is still unanswered, which the
        elector waits for before it releases the Lease."""
        self.metrics.leader.set(0)
        with self._term:
            # A start-up still running on its own thread must not start the binder after this.
            self._term_over = True
            if not self._stop.is_set():
                self.lost_leadership.set()
            self._leading.clear()
        drained = self.binder.stop()
        self.drift.stop()
        return drained

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Blocks until stop() or the loss of leadership."""
        self.informers.start()
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
        self.informers.stop()

    def health_problems(self) -> list[str]:
        """What makes this replica unhealthy: an informer failing to list or watch, a stuck
        reconcile loop, a leader-election loop that stopped trying, a dead binder."""
        grace = max(30.0, 4 * self.settings.lease_seconds)
        now = time.monotonic()
        problems = [
            f"informer {name} has been failing for over {grace:.0f}s"
            for name in self.informers.failing(grace)
        ]
        if now - self._loop_beat > grace:
            problems.append(f"reconcile loop stuck for {now - self._loop_beat:.0f}s")
        if now - self.elector.last_attempt > grace and not self._starting_to_lead():
            problems.append(
                f"leader election made no attempt for {now - self.elector.last_attempt:.0f}s"
            )
        if self._leading.is_set() and not self.binder.alive():
            problems.append("binder thread or its request loop is not running")
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
        return dict(self.maps.sources)
