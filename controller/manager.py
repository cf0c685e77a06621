"""The controller process: shared informers on every replica; compile, write and bind on the leader.

The manager owns the lifecycle and nothing else: the shared informers (`controller.informers`),
leader election, the reconcile loop's thread and lock, and health. Each concern is a reconciler of
its own, constructed with its dependencies by `controller.builder`:

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
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller import heap
from controller.binder import Binder
from controller.changequeue import ChangeQueue
from controller.dirty import DirtyMaps
from controller.drift import DriftTracker
from controller.grantkeeper import GrantKeeper
from controller.informers import SharedInformers, snapshot
from controller.inventories import InventoryTracker
from controller.keywatch import KeyWatch
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import PodWatch
from controller.renumber import RenumberTracker
from controller.settings import ControllerSettings
from controller.sources import SourceState
from controller.statuswriter import StatusWriter
from controller.templatesync import TemplateSync
from kubeio.leader import LeaderElector
from placement.compile import Compiler
from placement.model import model_data
from placement.types import MapKey

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Controller:
    """The reconcilers and the lifecycle that runs them (built by `controller.builder.build`).

    Threads: informer threads only `put` into `changes` or mark dirty sets; the reconcile loop
    applies, compiles, judges and writes statuses holding `changes.lock`; the elector's thread
    runs `start_leading` and `stop_leading`, which `_term` orders against each other.
    """

    settings: ControllerSettings
    metrics: ControllerMetrics
    informers: SharedInformers
    changes: ChangeQueue
    statuses: DirtyMaps
    compiler: Compiler
    grants: GrantKeeper
    nodes: NodeKeeper
    tracker: InventoryTracker
    binder: Binder
    renumber: RenumberTracker
    maps: ModelKeeper
    drift: DriftTracker
    pods: PodWatch
    status_writer: StatusWriter
    keys: KeyWatch
    elector: LeaderElector
    #: Set while this replica leads (between a finished start-up and the end of leadership).
    leading: threading.Event
    templates: TemplateSync | None = None
    lost_leadership: threading.Event = field(default_factory=threading.Event, init=False)
    ready: threading.Event = field(default_factory=threading.Event, init=False)
    _loop_beat: float = field(default_factory=time.monotonic, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    #: orders the end of a start-up against its abort
    _term: threading.Lock = field(default_factory=threading.Lock, init=False)
    _term_over: bool = field(default=False, init=False)

    # -- reconcile loop (one thread) ------------------------------------------------------------
    def _apply_pending(self) -> None:
        """Feeds everything queued to the compiler (caller holds the lock)."""
        self.maps.apply_all(self.changes.take())

    def _publish(self) -> None:
        """Compiles and, on the leader, publishes (caller holds the lock)."""
        if self.maps.publish(self.informers.model.shards, first=not self.ready.is_set()):
            self.ready.set()

    def _reconcile_loop(self) -> None:
        last_status = last_expiry = 0.0
        while not self._stop.is_set():
            self._loop_beat = time.monotonic()
            with self.changes.lock:
                self.changes.wait(0.5)
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
                if self.templates is not None:
                    self.templates.sync(list(self.maps.model.maps))
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

    # -- leadership -----------------------------------------------------------------------------
    def _holds_lease(self) -> bool:
        """Whether the lease is held and unexpired by the local clock: checked before every
        write only the leader may make (Bindings, the model, statuses, evictions)."""
        return self.elector.holds()

    def _leads(self) -> bool:
        return self.leading.is_set() and self._holds_lease()

    def start_leading(self) -> None:
        """Runs on its own thread while the elector keeps renewing; gives up at any step once
        the lease is no longer held (the elector then calls stop_leading)."""
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
            self.leading.set()

    def _wait_for_sync(self) -> None:
        self.informers.wait_synced()
        if self.settings.startup_delay_seconds:
            # Test hook: a start-up slower than the lease (a large cluster's first sync).
            log.warning("start-up delayed by %.1f s", self.settings.startup_delay_seconds)
            self._stop.wait(self.settings.startup_delay_seconds)

    def _compile_from_stored(self) -> None:
        """The first compile of this leader, seeded with the stored model (earlier `count`
        picks stay, sources invalid now keep serving what the stored model served)."""
        stored = model_data(self.informers.model.objects())
        with self.changes.lock:
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

    def stop_leading(self) -> bool:
        """The leadership ended (the elector no longer counts it held): the binder stops and
        drains. Returns whether no Binding of this leadership is still unanswered, which the
        elector waits for before it releases the Lease."""
        self.metrics.leader.set(0)
        with self._term:
            # A start-up still running on its own thread must not start the binder after this.
            self._term_over = True
            if not self._stop.is_set():
                self.lost_leadership.set()
            self.leading.clear()
        drained = self.binder.stop()
        self.drift.stop()
        return drained

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Blocks until stop() or the loss of leadership."""
        self.informers.start()
        loop = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        loop.start()
        self.elector.run()

    def stop(self) -> None:
        self._stop.set()
        self.elector.stop()
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
        if self.leading.is_set() and not self.binder.alive():
            problems.append("binder thread or its request loop is not running")
        return problems

    def _starting_to_lead(self) -> bool:
        # Between winning the lease and leading, the elector waits for the informers to sync;
        # those have their own check.
        return self.elector.is_leader.is_set() and not self.leading.is_set()

    def healthy(self) -> bool:
        problems = self.health_problems()
        for problem in problems:
            log.error("unhealthy: %s", problem)
        return not problems

    def snapshot(self) -> Mapping[MapKey, SourceState]:
        return dict(self.maps.sources)
