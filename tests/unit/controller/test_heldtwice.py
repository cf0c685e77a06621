"""controller.heldtwice: a device named by two claims' allocations is reported once, on every pod
the claims are reserved for or made for and on the map of each gpuplace pod among them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from controller.heldtwice import HeldTwice
from controller.metrics import ControllerMetrics
from controller.slotcache import Holding, SlotCache
from kubeio.events import EventRecorder, ObjectRef
from placement.dra import ClaimState
from placement.draalloc import HeldTwice as ClaimsHeldTwice
from placement.reasons import EventReason
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

NODE = NodeName("gpu-node-03")
KEY = MapKey("prod", "llm")
DEVICE = ("gpu.nvidia.com", NODE, "gpu-0")


class Recorder(EventRecorder):
    def __init__(self) -> None:
        self.sent: list[tuple[ObjectRef, str, str, str]] = []

    def emit(self, ref: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.sent.append((ref, event_type, reason, message))


def claim(namespace: str, name: str, owner: str | None, reserved: tuple[str, ...]) -> ClaimState:
    return ClaimState(
        namespace=namespace,
        name=name,
        uid=f"c-{name}",
        resource_version="1",
        owner_uid=owner,
        finalizers=(),
        allocated=(DEVICE,),
        node=NODE,
        reserved_for=tuple(f"u-{p}" for p in reserved),
        deleting=False,
        reserved_names=reserved,
    )


def double(*claims: ClaimState) -> ClaimsHeldTwice:
    return ClaimsHeldTwice(NODE, GpuUuid("GPU-0"), DEVICE, claims)


def reporter() -> tuple[HeldTwice, Recorder, ControllerMetrics]:
    cache = SlotCache()
    holding = Holding(
        "u-llm-0", "prod/llm-0", SlotKey(KEY, 0), NODE, ("GPU-0",), Sharing.EXCLUSIVE, False
    )
    cache.add_bound(holding)
    events = Recorder()
    metrics = ControllerMetrics(CollectorRegistry())
    calls: list[Any] = []

    def inline(fn: Any, *args: Any) -> None:
        calls.append(fn)
        fn(*args)

    def map_ref(key: MapKey) -> ObjectRef:
        return ObjectRef("PlacementMap", key.namespace, key.name, "", "gpuplace.io/v1alpha1")

    return HeldTwice(cache, metrics, events, inline, map_ref), events, metrics


def held_gauge(metrics: ControllerMetrics) -> float:
    return float(metrics.gpus_held_twice._value.get())  # type: ignore[attr-defined]


def test_two_claims_of_one_device_are_reported_on_both_pods_and_the_map_once() -> None:
    held, events, metrics = reporter()
    ours = claim("prod", "llm-0-gpuplace-gpus-a", "u-llm-0", ("llm-0",))
    squat = claim("tenant-a", "squat", None, ("thief",))
    held.report_claims([double(ours, squat)])
    refs = sorted((r.kind, r.namespace, r.name) for r, *_ in events.sent)
    assert refs == [
        ("PlacementMap", "prod", "llm"),
        ("Pod", "prod", "llm-0"),
        ("Pod", "tenant-a", "thief"),
    ]
    assert {reason for _, _, reason, _ in events.sent} == {EventReason.GPU_HELD_TWICE}
    assert "prod/llm-0-gpuplace-gpus-a, tenant-a/squat" in events.sent[0][3]
    assert held_gauge(metrics) == 1
    # The same double again: nothing new to say.
    held.report_claims([double(ours, squat)])
    assert len(events.sent) == 3
    # Gone: the metric says so.
    held.report_claims([])
    assert held_gauge(metrics) == 0
