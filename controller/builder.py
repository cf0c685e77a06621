"""Wiring in one place: the controller's informers, reconcilers, binder, writers and elector, each
constructed with its dependencies (as controller-runtime's builder does); nothing is assigned into
an object after it is constructed.

Most dependencies are passed as they are built, in order. A few pairs call each other, and there
one side gets a lambda over a name bound further down this function (called only once `build`
has returned): the elector and the controller's leadership steps, the DRA tracker and the binder
(wakes) and inventories (taints), the binder and the model (its cluster), the rollouts and the
pod watch (whether a pod runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from controller import changes
from controller.binder import Binder
from controller.bindingkey import KeySecret
from controller.changequeue import ChangeQueue
from controller.dirty import DirtyMaps
from controller.dra import DraTracker, TemplateKeeper
from controller.drift import DriftTracker
from controller.grantkeeper import GrantKeeper
from controller.informers import SharedInformers
from controller.inventories import InventoryTracker
from controller.keywatch import KeyWatch
from controller.legacyscope import LegacyScope
from controller.manager import Controller
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import PodWatch
from controller.renumber import RenumberTracker
from controller.rollout import Rollouts
from controller.settings import ControllerSettings
from controller.sources import Form
from controller.statuswriter import StatusWriter
from controller.templatesync import TemplateSync
from controller.writer import ModelWriter
from kubeio.client import Kube, Obj
from kubeio.events import EventRecorder, ObjectRef
from kubeio.informer import DELETED, Informer
from kubeio.leader import LeaderElector, LeaderSettings
from placement.binding import slot_status
from placement.compile import Compiler
from placement.dra import Enforcement
from placement.types import API_VERSION, KIND, MapKey, SlotKey

Handler = Callable[[str, Obj, Obj | None], None]


def build(
    kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None
) -> Controller:
    """The controller of this replica, wired and not started (`Controller.run` starts it)."""
    metrics = metrics or ControllerMetrics()
    events = EventRecorder(kube, "gpuplace-controller")
    informers = SharedInformers.create(kube, settings)
    inbox = ChangeQueue()
    statuses = DirtyMaps()  # maps whose status to write again
    drift_dirty = DirtyMaps()  # maps whose bound pods to judge for drift again
    leading = threading.Event()  # this replica leads (the model keeper and the controller)
    compiler = Compiler(settings.alias_label)
    grants = GrantKeeper(settings, compiler, events)
    nodes = NodeKeeper(kube, settings.inventory_namespace, settings.alias_label, compiler, grants)
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
        lambda: controller.start_leading(),  # noqa: PLW0108 - bound below
        lambda: controller.stop_leading(),  # noqa: PLW0108 - bound below
    )
    dra: DraTracker | None = None
    if settings.enforcement is Enforcement.DRA:
        dra = DraTracker(
            settings.dra,
            lambda keys: binder.wake(keys),  # noqa: PLW0108 - bound below
            on_taints=lambda node: tracker.retaint(node),  # noqa: PLW0108 - bound below
        )
    tracker = InventoryTracker(
        lambda node, inventory: inbox.put(changes.InventoryChanged(node, inventory)),
        dra.taints_on if dra is not None else lambda _node: {},
    )

    def on_bound(slot: SlotKey) -> None:  # a slot was bound or freed
        statuses.add(slot.map)
        drift_dirty.add(slot.map)

    def on_trust_change(key: MapKey) -> None:
        statuses.add(key)
        inbox.notify()

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
        lambda: maps.cluster(),  # noqa: PLW0108 - bound below
        on_bound,
        dra=dra,
        fence=elector.holds,
        on_trust_change=on_trust_change,
        map_ref=map_ref,
        legacy_scope=LegacyScope(settings.binder.legacy_namespace_selector, informers.namespaces),
    )
    renumber = RenumberTracker(kube, events, metrics.renumbered.set)
    policies = policy_informers(informers)
    status_writer = StatusWriter(
        kube,
        events,
        metrics,
        statuses,
        sources=informers.sources,
        resources=informers.resources,
        bound_seconds=settings.status_bound_seconds,
        policies=policies,
        system_namespace=settings.system_namespace,
    )
    templates: TemplateSync | None = None
    if dra is not None and informers.dra is not None:
        templates = TemplateSync(TemplateKeeper(kube, settings.dra), informers.dra.templates)

    def on_published(changed: set[MapKey]) -> None:
        drift_dirty.update(changed)
        if templates is not None:
            templates.mark()

    maps = ModelKeeper(
        compiler,
        grants,
        nodes,
        tracker,
        renumber,
        ModelWriter(kube, settings.system_namespace),
        metrics,
        statuses,
        require_inventory=settings.binder.require_inventory,
        alias_label=settings.alias_label,
        on_published=on_published,
        on_deleted=status_writer.forget,
        wake=binder.wake,
        leading=leading.is_set,
        holds_lease=elector.holds,
    )
    drift = DriftTracker(kube, events, metrics.drifted.set)
    rollouts = Rollouts(
        kube,
        events,
        lambda uid: pods.is_running(uid),  # noqa: PLW0108 - bound below
        lambda uid, slot: slot_status(uid, slot, maps.cluster(), binder.cache),
    )
    pods = PodWatch(binder, drift, rollouts, renumber, statuses, drift_dirty)
    keys = KeyWatch(
        kube,
        KeySecret(settings.system_namespace, settings.binder.key_secret_name),
        binder,
        metrics,
        informers.pods_held,
        lambda: maps.shared,
    )
    controller = Controller(
        settings,
        metrics,
        informers,
        inbox,
        statuses,
        compiler,
        grants,
        nodes,
        tracker,
        binder,
        renumber,
        maps,
        drift,
        pods,
        status_writer,
        keys,
        elector,
        leading,
        templates=templates,
    )
    watch(controller, inbox, dra)
    return controller


def watch(controller: Controller, inbox: ChangeQueue, dra: DraTracker | None) -> None:
    """What each informer's events go to (informer threads: enqueue or mark only)."""
    informers, tracker, pods, maps = (
        controller.informers,
        controller.tracker,
        controller.pods,
        controller.maps,
    )
    templates = controller.templates
    if informers.sources is not None:
        informers.sources.add_handler(source_handler(inbox, Form.CONFIGMAP))
    if informers.resources is not None:
        informers.resources.add_handler(source_handler(inbox, Form.RESOURCE))
    informers.nodes.add_handler(
        lambda event, obj, _old: inbox.put(changes.NodeChanged(obj, deleted=event == DELETED))
    )
    informers.inventories.add_handler(tracker.on_configmap)
    informers.leases.add_handler(tracker.on_lease)
    for informer in informers.pods:
        informer.add_handler(lambda event, obj, _old: pods.on_pod(event, obj, maps.shared))
    if informers.dra is not None and dra is not None:
        informers.dra.slices.add_handler(dra.on_slice)
        informers.dra.claims.add_handler(dra.on_claim)
        informers.dra.taint_rules.add_handler(dra.on_taint_rule)
        if templates is not None:
            informers.dra.templates.add_handler(templates.on_template)
    for form, informer in policy_informers(informers).items():
        informer.add_handler(policy_handler(inbox, form))
    informers.binding_key.add_handler(controller.keys.on_secret)


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


def policy_handler(inbox: ChangeQueue, form: Form) -> Handler:
    def handle(event: str, obj: Obj, _old: Obj | None) -> None:
        inbox.put(changes.PolicyChanged(None if event == DELETED else obj, form))

    return handle
