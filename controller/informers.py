"""The controller's shared informers: one per resource, each a named field (no string keys). Every
replica runs them, leading or not, so that a standby takes over with warm caches; the reconcilers
register their handlers on them and read their stores. Pods and nodes are trimmed to what
gpuplace reads before they are stored (controller/trim.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial

from controller import heap
from controller.settings import ControllerSettings
from controller.trim import NODE_SHAPE, POD_SHAPE, trim_namespace, trim_node, trim_pod
from kubeio.client import Kube, Obj
from kubeio.configmapwatch import ConfigMapWatch
from kubeio.informer import Informer
from kubeio.paths import (
    CONFIGMAPS,
    DEVICE_TAINT_RULES,
    LEASES,
    NAMESPACES,
    NODES,
    PLACEMENT_MAPS,
    PLACEMENT_POLICIES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
)
from kubeio.pod import Pod
from placement.annotations import PLACEMENT_MAP_LABEL
from placement.dra import TEMPLATE_SELECTOR, Enforcement
from placement.grants import POLICY_CONFIGMAP
from placement.model import MODEL_CONFIGMAPS, Model


@dataclass(frozen=True)
class DraInformers:
    """dra enforcement: the driver's ResourceSlices, the claims, gpuplace's claim templates, and
    DeviceTaintRules (optional: an apiserver without the alpha API answers 404, read as none)."""

    slices: Informer
    claims: Informer
    templates: Informer
    taint_rules: Informer


@dataclass(frozen=True)
class SharedInformers:
    #: Source ConfigMaps (placement maps); None when maps come from git or that form is off.
    sources: Informer | None
    #: PlacementMap custom resources; None when maps come from git or that form is off.
    resources: Informer | None
    nodes: Informer
    inventories: Informer
    leases: Informer
    model: ConfigMapWatch[Model]
    policy: Informer
    #: The PlacementPolicy custom resource (a singleton); None when custom resources are off.
    policy_resource: Informer | None
    binding_key: Informer
    #: One per schedulerName the binder serves (gpuplace's, and the legacy ones).
    pods: tuple[Informer, ...]
    dra: DraInformers | None
    #: Namespaces, trimmed to their labels, while the legacy namespace selector narrows legacy
    #: pods (controller/legacyscope.py); None otherwise.
    namespaces: Informer | None = None

    @classmethod
    def create(cls, kube: Kube, settings: ControllerSettings) -> SharedInformers:
        s = settings
        resync = s.resync_seconds
        sources = resources = policy_resource = None
        if s.resource_maps:
            policy_resource = Informer(
                kube,
                PLACEMENT_POLICIES.collection(),
                name="placementpolicies",
                field_selector=f"metadata.name={POLICY_CONFIGMAP}",
                resync_seconds=resync,
                optional=True,
            )
        if s.resource_maps:
            resources = Informer(
                kube,
                PLACEMENT_MAPS.collection(),
                name="placementmaps",
                resync_seconds=resync,
                optional=True,
            )
        if s.configmap_maps:
            sources = Informer(
                kube,
                CONFIGMAPS.collection(),
                name="sources",
                label_selector=f"{PLACEMENT_MAP_LABEL}=true",
                resync_seconds=resync,
            )
        names = [s.binder.scheduler_name]
        if s.binder.legacy:
            names += [n for n in s.binder.legacy_scheduler_names if n not in names]
        pods = tuple(
            Informer(
                kube,
                PODS.collection(),
                name=f"pods:{name}",
                field_selector=f"spec.schedulerName={name}",
                resync_seconds=resync,
                transform=partial(trim_pod, legacy=name != s.binder.scheduler_name),
                after_page=heap.trim,
                shape=POD_SHAPE,
            )
            for name in names
        )
        namespaces = None
        if s.binder.legacy and s.binder.legacy_namespace_selector is not None:
            namespaces = Informer(
                kube, NAMESPACES.collection(), name="namespaces", transform=trim_namespace
            )
        dra = None
        if s.enforcement is Enforcement.DRA:
            dra = DraInformers(
                Informer(
                    kube,
                    RESOURCE_SLICES.collection(),
                    name="resourceslices",
                    field_selector=f"spec.driver={s.dra.driver}",
                ),
                Informer(kube, RESOURCE_CLAIMS.collection(), name="resourceclaims"),
                Informer(
                    kube,
                    RESOURCE_CLAIM_TEMPLATES.collection(),
                    name="claimtemplates",
                    label_selector=TEMPLATE_SELECTOR,
                ),
                Informer(
                    kube, DEVICE_TAINT_RULES.collection(), name="devicetaintrules", optional=True
                ),
            )
        return cls(
            sources=sources,
            resources=resources,
            policy_resource=policy_resource,
            nodes=Informer(
                kube,
                NODES.collection(),
                name="nodes",
                transform=trim_node,
                after_page=heap.trim,
                shape=NODE_SHAPE,
            ),
            inventories=Informer(
                kube, CONFIGMAPS.collection(s.inventory_namespace), name="inventories"
            ),
            leases=Informer(kube, LEASES.collection(s.inventory_namespace), name="leases"),
            model=ConfigMapWatch(kube, s.system_namespace, MODEL_CONFIGMAPS),
            policy=Informer(
                kube,
                CONFIGMAPS.collection(s.system_namespace),
                name="policy",
                field_selector=f"metadata.name={POLICY_CONFIGMAP}",
            ),
            binding_key=Informer(
                kube,
                SECRETS.collection(s.system_namespace),
                name="bindingkey",
                field_selector=f"metadata.name={s.binder.key_secret_name}",
            ),
            pods=pods,
            dra=dra,
            namespaces=namespaces,
        )

    def all(self) -> Iterator[Informer]:
        for own in (self.sources, self.resources, self.policy_resource, self.namespaces):
            if own is not None:
                yield own
        yield from (self.nodes, self.inventories, self.leases, self.model.informer)
        yield from self.pods
        if self.dra is not None:
            yield from (self.dra.slices, self.dra.claims, self.dra.templates)
            yield self.dra.taint_rules
        yield from (self.policy, self.binding_key)

    def start(self) -> None:
        for informer in self.all():
            informer.start()

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()

    def wait_synced(self) -> None:
        for informer in self.all():
            informer.wait_synced()

    def failing(self, grace_seconds: float) -> list[str]:
        """Names of the informers that have failed to list or watch for over `grace_seconds`."""
        return [i.name for i in self.all() if not i.healthy(grace_seconds)]

    def pods_held(self) -> list[Pod]:
        """Every pod the pod informers hold (a snapshot), each read into its view."""
        with self.pods_paused() as pods:
            return pods

    @contextmanager
    def pods_paused(self) -> Iterator[list[Pod]]:
        """Every pod the pod informers hold, with their events held back until the block ends
        (their handlers run under the informers' locks). What the block switches on from the
        snapshot then sees every event after it and none from before: a pod created between a
        snapshot and the switch is neither missed nor read twice out of order."""
        with ExitStack() as held:
            for informer in self.pods:
                held.enter_context(informer.lock)
            yield [Pod.of(obj) for informer in self.pods for obj in informer.store.values()]


def snapshot(informer: Informer) -> dict[tuple[str, str], Obj]:
    """A copy of an informer's store, taken under its lock."""
    with informer.lock:
        return dict(informer.store)
