"""The controller process: shared informers on every replica; compile, write and bind on the leader.

The manager owns the lifecycle and nothing else: the ops port and the web view, the shared informers
(`controller.informers`), the work queues' workers, leader election and health; it starts them in
one order and stops them in the reverse. Each concern is a reconciler of its own with its own keyed
work queue (`controller.workqueue`), constructed with its dependencies by `controller.builder`:

- `ModelKeeper` (modelkeeper.py): sources -> compile -> model, the model's one writer and the
  publisher of the snapshot the others read (snapshot.py); with `GrantKeeper` (grants) and
  `NodeKeeper` (nodes, aliases, inventories of deleted nodes);
- `StatusWriter` (statuswriter.py): the maps' status, their Events and gauges, the policy's verdicts;
- `DriftJudge` (driftjudge.py): drift and rollouts;
- `TemplateSync` (templatesync.py): claim templates (dra enforcement);
- `KeyWatch` (keywatch.py): the binding key ring;
- `InventoryTracker` (inventories.py): the inventories' expiry, and their DRA taints;
- `PodWatch` (podwatch.py): bound pods after binding, fed to the others' queues;
- `Binder` (binder.py): the hot path, with its own scheduling queue, slot cache and request loop.

Informer threads only put typed changes in the model keeper's inbox or add keys to a queue. Standbys
keep their caches and model warm so that a failover costs one lease expiry plus a slot-cache rebuild
from the pods already in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller import heap
from controller.binder import Binder
from controller.changequeue import MODEL
from controller.drift import DriftTracker
from controller.grantkeeper import GrantKeeper
from controller.health import Health
from controller.informers import SharedInformers, snapshot
from controller.inventories import EXPIRY, InventoryTracker
from controller.keywatch import KeyWatch
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import PodWatch
from controller.renumber import RenumberTracker
from controller.settings import ControllerSettings
from controller.statuswriter import StatusKey
from controller.webview import WebServer
from controller.workqueue import Workers, WorkQueue
from kubeio.httpserver import OpsServer
from kubeio.leader import LeaderElector, LeaseHold
from placement.model import model_data

log = logging.getLogger(__name__)

#: The longest the collector stays paused at the start waiting for the informers to list.
SETTLE_SECONDS = 60.0


@dataclass(eq=False)
class Leadership:
    """A leadership's start and end: the elector's callbacks, built before the elector.

    Threads: `start` runs on a thread of its own while the elector keeps renewing, `stop` on the
    elector's; `_term` orders the end of a start-up against its abort. The leader's queues' workers
    start once the start-up is done (their keys wait in their queues until then)."""

    settings: ControllerSettings
    metrics: ControllerMetrics
    informers: SharedInformers
    maps: ModelKeeper
    grants: GrantKeeper
    nodes: NodeKeeper
    tracker: InventoryTracker
    binder: Binder
    renumber: RenumberTracker
    drift: DriftTracker
    pods: PodWatch
    keys: KeyWatch
    hold: LeaseHold
    models: WorkQueue[str]
    statuses: WorkQueue[StatusKey]
    #: The workers of the queues only the leader drains (status, drift, key ring, templates).
    workers: Sequence[Workers[Any]]
    #: Set while this replica leads (between a finished start-up and the end of leadership).
    leading: threading.Event
    lost: threading.Event = field(default_factory=threading.Event, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _term: threading.Lock = field(default_factory=threading.Lock, init=False)
    _term_over: bool = field(default=False, init=False)

    def start(self) -> None:
        """Gives up at any step once the lease is no longer held (the elector then calls
        `stop`)."""
        self.metrics.leader.set(1)
        with self._term:
            if not self._term_over:
                self.binder.prepare()
        self._wait_for_sync()
        if not self.hold.holds():
            log.warning("lease lost during start-up: not leading")
            return
        synced = time.monotonic()
        with heap.paused():
            self.maps.lead(model_data(self.informers.model.objects()))
        compiled = time.monotonic()
        self.nodes.sweep_inventories(self.informers.inventories, self.tracker)
        if not snapshot(self.informers.policy):
            self.grants.warn_if_open()
        # What a bound pod holds depends on what its signature proves: the ring before the rebuild.
        self.binder.trust = self.keys.load(self._stop, self.settings.retry_seconds)
        if not self.hold.holds():
            log.warning("lease lost during start-up: not leading")
            return
        rebuilding = time.monotonic()
        with heap.paused():
            # What is rebuilt lives as long as the leadership: out of the collector's
            # generations once built, never scanned again (controller/heap.py).
            bound = self._rebuild_from_pods()
        log.info(
            "leading: model generation %d (%.2f s after the caches synced), %d bound pods in the "
            "slot cache (%.2f s)",
            self.maps.model.generation,
            compiled - synced,
            bound,
            time.monotonic() - rebuilding,
        )
        with self._term:
            if self._term_over or not self.hold.holds():
                log.warning("lease lost during start-up: not leading")
                return
            self.binder.start()
            self.leading.set()
            for workers in self.workers:
                workers.start()
        # What was applied between the first compile and this moment.
        self.models.add(MODEL)

    def _wait_for_sync(self) -> None:
        self.informers.wait_synced()
        if self.settings.startup_delay_seconds:
            # Test hook: a start-up slower than the lease (a large cluster's first sync).
            log.warning("start-up delayed by %.1f s", self.settings.startup_delay_seconds)
            self._stop.wait(self.settings.startup_delay_seconds)

    def _rebuild_from_pods(self) -> int:
        """The slot cache, renumbering and drift trackers from the pods the informers hold;
        returns how many bound pods hold a slot."""
        with self.informers.pods_paused() as pods:
            # One step: a pod event from before it is in the snapshot, one after it reaches the
            # active binder (controller/podwatch.py drops them while it is not).
            self.binder.active.set()
            bound = self.binder.rebuild(pods, self.maps.shared)
            self.pods.rebuild(bound)
        inventories = {n: state.inventory for n, state in self.tracker.states.items()}
        self.statuses.add_all(self.renumber.check_all(inventories))
        return len(bound)

    def stop(self) -> bool:
        """The leadership ended (the elector no longer counts it held): the binder stops and
        drains. Returns whether no Binding of this leadership is still unanswered, which the
        elector waits for before it releases the Lease."""
        self.metrics.leader.set(0)
        with self._term:
            # A start-up still running on its own thread must not start the binder after this.
            self._term_over = True
            if not self._stop.is_set():
                self.lost.set()
            self.leading.clear()
        drained = self.binder.stop()
        self.drift.stop()
        return drained

    def cancel(self) -> None:
        """The process stops: a start-up waiting for the key ring gives up."""
        self._stop.set()


@dataclass(eq=False)
class Controller:
    """What runs, in the order it starts (`start`, then `run`) and the reverse it stops (`close`)."""

    settings: ControllerSettings
    metrics: ControllerMetrics
    informers: SharedInformers
    elector: LeaderElector
    leadership: Leadership
    health: Health
    #: The workers of the queues every replica drains (model, expiry; DRA taints and wakes).
    workers: Sequence[Workers[Any]]
    expiry: WorkQueue[str]
    ops: OpsServer
    web: WebServer | None = None

    @property
    def lost_leadership(self) -> threading.Event:
        return self.leadership.lost

    def start(self) -> None:
        """The ports (a port in use raises OSError here), the informers, every replica's
        workers. The leader's workers start with a leadership."""
        self.ops.start()
        log.info(
            "controller %s starting; metrics on port %d; %d Bindings in flight from its request "
            "loop",
            self.settings.identity,
            self.ops.port,
            self.settings.binder.bind_workers,
        )
        if self.web is not None:
            self.web.start()
            log.info(
                "web view on port %d%s",
                self.web.port,
                " (bearer tokens checked)" if self.web.authorizer is not None else "",
            )
        self.informers.start()
        threading.Thread(target=self._settle, name="heap", daemon=True).start()
        for workers in self.workers:
            workers.start()
        self.expiry.add(EXPIRY)

    def _settle(self) -> None:
        """Ends the start-up's pause of the collector (`heap.tune`) once every informer has
        listed, or after `SETTLE_SECONDS` if one cannot (an apiserver down at the start: the
        retries' garbage is collected again)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        for informer in self.informers.all():
            informer.wait_synced(max(0.0, deadline - time.monotonic()))
        heap.resume()

    def run(self) -> None:
        """Campaigns and leads; blocks until `stop` or the loss of leadership."""
        self.elector.run()

    def stop(self) -> None:
        """Ends `run` (any thread; a signal handler)."""
        self.leadership.cancel()
        self.elector.stop()

    def close(self) -> None:
        """After `run` returned: everything `start` and the leadership started, in reverse."""
        for workers in (*self.leadership.workers, *reversed(self.workers)):
            workers.stop(timeout=1.0)
        self.informers.stop()
        if self.web is not None:
            self.web.stop()
        self.ops.stop()
