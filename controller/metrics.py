"""The controller's Prometheus metrics (prefix gpuplace_), on a registry owned by the process."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from placement.reasons import Reason

#: Why pods wait (placement.binding statuses, compile-time slot blocks): each has a series from
#: the start.
UNSCHEDULABLE_REASONS = (
    Reason.SLOT_TAKEN,
    Reason.NO_FREE_SLOT,
    Reason.NO_SERVABLE_SLOT,
    Reason.NODE_NOT_READY,
    Reason.NODE_CORDONED,
    Reason.NODE_NOT_FOUND,
    Reason.DEVICE_MISSING,
    Reason.DEVICE_UNHEALTHY,
    Reason.DEVICE_TAINTED,
    Reason.DEVICE_BUSY,
    Reason.INVENTORY_MISSING,
    Reason.INVENTORY_STALE,
    Reason.SLOT_CONFLICT,
    Reason.INSUFFICIENT_DEVICES,
    Reason.NO_NVLINK_SET,
    Reason.CLIQUE_MISMATCH,
    Reason.MAP_NOT_FOUND,
    Reason.MAP_INVALID,
    Reason.INDEX_NOT_IN_MAP,
    Reason.INDEX_INVALID,
    Reason.NO_PLACEMENT,
)


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.binds = Counter("gpuplace_binds", "Bind attempts by result", ["result"], registry=r)
        self.bind_latency = Histogram(
            "gpuplace_bind_duration_seconds",
            "From the pod entering the queue to its Binding being accepted",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.pending = Gauge("gpuplace_pending_pods", "Pods waiting to be bound", registry=r)
        self.gangs_stuck = Gauge(
            "gpuplace_gangs_stuck",
            "Gang maps whose pods have waited past the gang's timeoutSeconds (none bound)",
            registry=r,
        )
        self.claim_finalizers = Counter(
            "gpuplace_claim_finalizer_writes",
            "Delete-protection finalizers written to ResourceClaims (dra enforcement): when the "
            "claim was first seen (seen), or on the Binding path for a claim seen only then (bind)",
            ["when"],
            registry=r,
        )
        self.unschedulable = Counter(
            "gpuplace_unschedulable", "Pods found unschedulable by reason", ["reason"], registry=r
        )
        self.renumbered = Gauge(
            "gpuplace_renumbered_pods",
            "Bound pods whose CUDA_VISIBLE_DEVICES indices now name other GPUs (node renumbered)",
            registry=r,
        )
        self.prebound = Counter(
            "gpuplace_prebound_legacy_pods",
            "Pods bound by the earlier tools, counted as holding their gpu-scheduling-map GPUs",
            registry=r,
        )
        self.unverified = Counter(
            "gpuplace_unverified_bindings",
            "Bound pods whose gpuplace.io/* annotations the binder did not sign (forged: they hold "
            "nothing)",
            registry=r,
        )
        self.unverifiable = Gauge(
            "gpuplace_unverifiable_bindings",
            "Bound pods signed with a key the binding key ring no longer holds: their GPUs stay "
            "blocked until `gpuplace key adopt` or the pod is deleted",
            registry=r,
        )
        self.gpus_held_twice = Gauge(
            "gpuplace_gpus_held_twice",
            "GPUs that more than one bound pod holds where one of them holds it exclusively "
            "(a second holder the slot cache found, reported, never chosen by the binder)",
            registry=r,
        )
        self.key_ring_errors = Counter(
            "gpuplace_binding_key_ring_errors",
            "Times the binding key ring's Secret held something unreadable (the last good ring "
            "kept serving)",
            registry=r,
        )
        self.maps = Gauge("gpuplace_maps", "Placement maps by phase", ["phase"], registry=r)
        self.slots = Gauge("gpuplace_slots", "Slots by state", ["state"], registry=r)
        self.compile_seconds = Histogram(
            "gpuplace_compile_duration_seconds",
            "Time to compile the model after a change",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
        self.model_generation = Gauge("gpuplace_model_generation", "Model generation", registry=r)
        self.leader = Gauge("gpuplace_leader", "1 while this replica leads", registry=r)
        self.drifted = Gauge(
            "gpuplace_drifted_pods",
            "Bound pods whose slot their map has moved or removed since they were bound",
            registry=r,
        )
        self.build_info = Gauge(
            "gpuplace_build_info",
            "The running gpuplace (1): its version and Python's",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(_version(), platform.python_version()).set(1)
        # Every labelled series exists from the start (at 0), so dashboards and alerts see a
        # value, not an absent series, until the first event of its kind.
        for result in ("bound", "conflict", "error"):
            self.binds.labels(result)
        for when in ("seen", "bind"):
            self.claim_finalizers.labels(when)
        for reason in UNSCHEDULABLE_REASONS:
            self.unschedulable.labels(reason)
        for phase in ("Valid", "Invalid", "Conflict", "Degraded"):
            self.maps.labels(phase).set(0)
        for state in ("total", "served", "blocked", "bound", "drifted"):
            self.slots.labels(state).set(0)


def _version() -> str:
    try:
        return metadata.version("gpuplace")
    except metadata.PackageNotFoundError:
        return "unknown"
