"""Wiring in one place: the controller's queues, informers, reconcilers, binder, writers, elector and
ports, each constructed with its dependencies (as controller-runtime's builder does); nothing is
assigned into an object after it is constructed, and no part is handed a lambda over one built
further down.

What two parts would otherwise call each other through, they share as data built first: each
concern's work queue (controller/workqueue.py: whoever learns of a change adds a key, the concern's
workers, built with its reconciler, drain it), the published snapshot (controller/snapshot.py: the
model keeper swaps it, the others read it) and the lease hold (kubeio/leader.py `LeaseHold`: the
elector writes it, every leader write's fence reads it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller import changes
from controller.binder import Binder
from controller.bindingkey import KeySecret
from controller.changequeue import ChangeQueue
from controller.counts import MapCounts
from controller.dra import DraTracker, TemplateKeeper
from controller.drift import DriftTracker
from controller.driftjudge import DriftJudge
from controller.gpumetrics import GpuCollector, MapSlotsCollector
from controller.grantkeeper import GrantKeeper
from controller.health import Health
from controller.informers import SharedInformers, snapshot
from controller.inventories import InventoryTracker
from controller.keywatch import KeyWatch
from controller.legacyscope import LegacyScope
from controller.manager import Controller, Leadership
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import BOUND_SETTLE_SECONDS, PodWatch
from controller.renumber import RenumberTracker
from controller.rollout import Rollouts
from controller.settings import ControllerSettings
from controller.snapshot import ClusterView, Published
from controller.sources import Form
from controller.statuswriter import StatusKey, StatusWriter
from controller.templatesync import TemplateSync
from controller.trim import same_node
from controller.webview import Authorizer, ViewSources, WebServer
from controller.workqueue import QueueCollector, Workers, WorkQueue
from controller.writer import ModelWriter
from kubeio.client import Kube, Obj
from kubeio.events import EventRecorder, ObjectRef
from kubeio.httpserver import OpsServer, ServerMetrics
from kubeio.informer import DELETED, MODIFIED, Informer
from kubeio.leader import LeaderElector, LeaderSettings, LeaseHold
from placement.binding import slot_status
from placement.compile import Compiler
from placement.dra import Enforcement
from placement.types import API_VERSION, KIND, MapKey, NodeName, SlotKey
from placement.wake import WakeKey

log = logging.getLogger(__name__)

Handler = Callable[[str, Obj, Obj | None], None]

#: The status queue's pace: a fleet's maps all marked at a leadership's start are written at this
#: rate at most (most are unchanged and cost no write), each worker batch taking one token a map.
STATUS_QPS = 100.0
STATUS_BURST = 500
#: Keys a worker takes at once where its reconciler reads a whole cache per batch (drift: every
#: holding of its maps; the DRA wakes: the binder's held-twice report).
DRIFT_BATCH = 256
STATUS_BATCH = 64
WAKE_BATCH = 1024
#: The status and drift queues hand out the maps due within this long of each other in one batch
#: (`WorkQueue` tick): a drain's maps, each settled 0.5 s after its binds, and rollouts polled every
#: 0.5 s, wake their worker a few times a second, not once a map.
SETTLE_TICK = 0.1


@dataclass(frozen=True, slots=True)
class Queues:
    """One queue per concern. Every replica drains the model's, the expiry's and (dra
    enforcement) the taints' and the binder's wakes; the leader the others."""

    models: WorkQueue[str]
    expiry: WorkQueue[str]
    taints: WorkQueue[NodeName]
    wakes: WorkQueue[WakeKey]
    statuses: WorkQueue[StatusKey]
    drifts: WorkQueue[MapKey]
    rings: WorkQueue[str]
    templates: WorkQueue[str] | None

    @classmethod
    def create(cls, retry_seconds: float, dra: bool) -> Queues:
        return cls(
            WorkQueue("model"),
            WorkQueue("expiry"),
            WorkQueue("taints"),
            WorkQueue("dra-wakes"),
            WorkQueue("status", qps=STATUS_QPS, burst=STATUS_BURST, tick=SETTLE_TICK),
            WorkQueue("drift", tick=SETTLE_TICK),
            WorkQueue("key-ring", base_delay=retry_seconds),
            WorkQueue("templates") if dra else None,
        )


def build(
    kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None
) -> Controller:
    """The controller of this replica, wired and not started (`Controller.start`, `run`)."""
    metrics = metrics or ControllerMetrics()
    events = EventRecorder(kube, "gpuplace-controller")
    informers = SharedInformers.create(kube, settings)
    hold = LeaseHold()  # the elector's verdict, every leader write's fence
    leading = threading.Event()  # this replica leads (its start-up finished)
    published = Published()
    dra_on = settings.enforcement is Enforcement.DRA

    q = Queues.create(settings.retry_seconds, dra=dra_on)
    inbox = ChangeQueue(q.models)
    compiler = Compiler(settings.alias_label)
    grants = GrantKeeper(settings, compiler, events)
    nodes = NodeKeeper(kube, settings.inventory_namespace, settings.alias_label, compiler, grants)
    dra = DraTracker(settings.dra, q.wakes.add_all, on_taints=q.taints.add) if dra_on else None
    tracker = InventoryTracker(
        lambda node, inventory: inbox.put(changes.InventoryChanged(node, inventory)),
        dra.taints_on if dra is not None else lambda _node: {},
    )
    cluster = ClusterView(
        published, nodes, tracker, settings.binder.require_inventory, settings.alias_label
    )

    def on_bound(slot: SlotKey) -> None:  # a slot was bound or freed
        q.statuses.add_after(slot.map, BOUND_SETTLE_SECONDS)
        q.drifts.add_after(slot.map, BOUND_SETTLE_SECONDS)

    def map_ref(key: MapKey) -> ObjectRef | None:
        """Where a map's Events go: its PlacementMap, else its source ConfigMap."""
        for informer, kind, api in (
            (informers.resources, KIND, API_VERSION),
            (informers.sources, "ConfigMap", "v1"),
        ):
            obj = informer.get(key.namespace, key.name) if informer is not None else None
            if obj is not None:
                return ObjectRef.of({**obj, "kind": kind, "apiVersion": api})
        return None

    binder = Binder(
        kube,
        settings.binder,
        metrics,
        events,
        cluster,
        on_bound,
        dra=dra,
        fence=hold.holds,
        on_trust_change=q.statuses.add,  # a map's trust report or gang moved: its status
        map_ref=map_ref,
        legacy_scope=LegacyScope(settings.binder.legacy_namespace_selector, informers.namespaces),
    )
    renumber = RenumberTracker(kube, events, metrics.renumbered.set)
    maps = ModelKeeper(
        compiler,
        grants,
        nodes,
        renumber,
        ModelWriter(kube, settings.system_namespace),
        metrics,
        inbox,
        published,
        statuses=q.statuses,
        drift=q.drifts,
        templates=q.templates,
        stored=informers.model.shards,
        wake=binder.wake,
        leading=leading.is_set,
        holds_lease=hold.holds,
    )
    pods = PodWatch(binder, renumber, published, q.statuses, q.drifts)
    drift = DriftTracker(kube, events, metrics.drifted.set)
    rollouts = Rollouts(
        kube,
        events,
        pods.is_running,
        lambda uid, slot: slot_status(uid, slot, cluster(), binder.cache),
    )
    judge = DriftJudge(drift, rollouts, binder.cache, published, q.statuses, hold.holds)
    counts = MapCounts(
        bound=binder.cache.bound_count,
        drifted=drift.count,
        rollout=rollouts.state,
        renumbered=renumber.count,
        unverifiable=binder.report.count,
        gang=binder.gangs.state,
        bound_total=binder.cache.__len__,
        drifted_total=drift.total,
    )
    status_writer = StatusWriter(
        kube,
        events,
        metrics,
        published,
        counts,
        sources=informers.sources,
        resources=informers.resources,
        bound_seconds=settings.status_bound_seconds,
        policies=policy_informers(informers),
        system_namespace=settings.system_namespace,
        holds_lease=hold.holds,
    )
    keys = KeyWatch(
        kube,
        KeySecret(settings.system_namespace, settings.binder.key_secret_name),
        binder,
        metrics,
        informers.pods_paused,
        published,
        informers.binding_key,
        q.rings,
    )
    templates: TemplateSync | None = None
    every_replica: list[Workers[Any]] = [
        Workers(q.models, maps.reconcile),
        Workers(q.expiry, tracker.expire),
    ]
    leader: list[Workers[Any]] = [
        Workers(q.statuses, status_writer.reconcile, batch=STATUS_BATCH),
        Workers(q.drifts, judge.reconcile, batch=DRIFT_BATCH),
        Workers(q.rings, keys.reconcile),
    ]
    if dra is not None and informers.dra is not None and q.templates is not None:
        templates = TemplateSync(
            TemplateKeeper(kube, settings.dra),
            informers.dra.templates,
            published,
            q.templates,
            hold.holds,
        )
        every_replica += [
            Workers(q.taints, tracker.retaint_all, batch=WAKE_BATCH),
            Workers(q.wakes, binder.wake, batch=WAKE_BATCH),
        ]
        leader.append(Workers(q.templates, templates.reconcile))

    leadership = Leadership(
        settings,
        metrics,
        informers,
        maps,
        grants,
        nodes,
        tracker,
        binder,
        renumber,
        drift,
        pods,
        keys,
        hold,
        q.models,
        q.statuses,
        leader,
        leading,
    )
    elector = LeaderElector(
        kube,
        LeaderSettings(
            settings.system_namespace,
            settings.lease_name,
            settings.identity,
            settings.lease_seconds,
            settings.renew_deadline_seconds,
            settings.retry_seconds,
        ),
        leadership.start,
        leadership.stop,
        hold=hold,
    )
    health = Health(
        settings, informers, elector, binder, leading, maps.ready, [*every_replica, *leader]
    )
    ops = OpsServer(
        settings.metrics_host,
        settings.metrics_port,
        metrics.registry,
        ready=health.ready,
        healthy=health.healthy,
    )
    register_series(metrics, tracker, binder, published, status_writer)
    metrics.registry.register(QueueCollector([*every_replica, *leader]))
    controller = Controller(
        settings,
        metrics,
        informers,
        elector,
        leadership,
        health,
        every_replica,
        q.expiry,
        ops,
        web_view(kube, settings, informers, elector, tracker, ops.metrics),
    )

    watch(informers, inbox, tracker, pods, keys, dra, templates)
    return controller


def watch(
    informers: SharedInformers,
    inbox: ChangeQueue,
    tracker: InventoryTracker,
    pods: PodWatch,
    keys: KeyWatch,
    dra: DraTracker | None,
    templates: TemplateSync | None,
) -> None:
    """What each informer's events go to (informer threads: put a change or add a key only)."""
    if informers.sources is not None:
        informers.sources.add_handler(source_handler(inbox, Form.CONFIGMAP))
    if informers.resources is not None:
        informers.resources.add_handler(source_handler(inbox, Form.RESOURCE))
    informers.nodes.add_handler(node_handler(inbox))
    informers.inventories.add_handler(tracker.on_configmap)
    informers.leases.add_handler(tracker.on_lease)
    for informer in informers.pods:
        informer.add_handler(pods.on_pod)
    if informers.dra is not None and dra is not None:
        informers.dra.slices.add_handler(dra.on_slice)
        informers.dra.claims.add_handler(dra.on_claim)
        informers.dra.taint_rules.add_handler(dra.on_taint_rule)
        if templates is not None:
            informers.dra.templates.add_handler(templates.on_template)
    for form, informer in policy_informers(informers).items():
        informer.add_handler(policy_handler(inbox, form))
    informers.binding_key.add_handler(keys.on_secret)


def register_series(
    metrics: ControllerMetrics,
    tracker: InventoryTracker,
    binder: Binder,
    published: Published,
    status_writer: StatusWriter,
) -> None:
    """The per-GPU and per-map series on the controller's registry, built from its caches at each
    scrape (controller/gpumetrics.py)."""
    metrics.registry.register(
        GpuCollector(tracker.inventories, binder.cache.holdings, lambda: published.current.model)
    )
    metrics.registry.register(MapSlotsCollector(lambda: dict(status_writer.latest)))


def web_view(
    kube: Kube,
    settings: ControllerSettings,
    informers: SharedInformers,
    elector: LeaderElector,
    tracker: InventoryTracker,
    metrics: ServerMetrics,
) -> WebServer | None:
    """The read-only web view on `--web-address`, from this replica's caches; None when off."""
    if not settings.web_address:
        return None
    host, _, port = settings.web_address.rpartition(":")

    def maps() -> list[Obj]:
        return list(snapshot(informers.sources).values()) if informers.sources is not None else []

    sources = ViewSources(
        settings.identity, elector.is_leader.is_set, tracker.inventories, informers.pods_held, maps
    )
    authorizer = (
        Authorizer(kube, settings.system_namespace, settings.web_service)
        if settings.web_authenticate
        else None
    )
    return WebServer(
        host or "0.0.0.0",  # noqa: S104 - refused by the command unless authenticated
        int(port),
        sources,
        authorizer,
        metrics,
    )


def policy_informers(informers: SharedInformers) -> dict[Form, Informer]:
    out = {Form.CONFIGMAP: informers.policy}
    if informers.policy_resource is not None:
        out[Form.RESOURCE] = informers.policy_resource
    return out


def source_handler(inbox: ChangeQueue, form: Form) -> Handler:
    def handle(event: str, obj: Obj, _old: Obj | None) -> None:
        inbox.put(
            changes.SourceDeleted(obj, form)
            if event == DELETED
            else changes.SourceChanged(obj, form)
        )

    return handle


def node_handler(inbox: ChangeQueue) -> Handler:
    """A node's change for the model keeper, unless it is a heartbeat (`trim.same_node`): each
    heartbeat would wake the model's worker for a pass that changes nothing."""

    def handle(event: str, obj: Obj, old: Obj | None) -> None:
        if event == MODIFIED and old is not None and same_node(old, obj):
            return
        inbox.put(changes.NodeChanged(obj, deleted=event == DELETED))

    return handle


def policy_handler(inbox: ChangeQueue, form: Form) -> Handler:
    def handle(event: str, obj: Obj, _old: Obj | None) -> None:
        inbox.put(changes.PolicyChanged(None if event == DELETED else obj, form))

    return handle
