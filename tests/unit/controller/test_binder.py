"""The Binder against a fake apiserver at gpuplace's own boundary (`Kube`): what it writes for a
placeable pod, how it undoes an assumption when the Binding fails, and how an unplaceable pod waits."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controller import podfacts
from controller.binder import Binder
from controller.metrics import ControllerMetrics
from controller.settings import BinderSettings
from kubeio.client import Kube
from kubeio.errors import APIConflictError, APIError, APINotFoundError, FencedError
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.annotations import (
    CUDA_ANNOTATION,
    MAP_LABEL,
    NODE_ANNOTATION,
    SIGNATURE_ANNOTATION,
    BindingDecision,
    signed_binding,
    verify_binding,
)
from placement.binding import Cluster, Placement, plan
from placement.keyring import TrustView, adoption, key_id, new_ring
from placement.maps import DeclaredSlot
from placement.types import Indexing, MapKey, NodeName, SlotKey
from placement.wake import WakeKey
from tests.unit.fakesender import InlineSender
from tests.unit.kubeio.test_kubeio_client import Server
from tests.unit.placement.test_binding_plan import TWO_SLOTS, build, uuid_of
from tests.unit.webhook_builders import admitted_container

KEY = b"k" * 32
SLOT0 = SlotKey(MapKey("ml", "llm"), 0)


class PodBuilder:
    """`make_pod("web-0").label(MAP_LABEL, "llm").obj()`, as kube-scheduler's tests build pods."""

    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "metadata": {
                "namespace": "ml",
                "name": name,
                "uid": f"uid-{name}",
                "labels": {},
                "ownerReferences": [{"kind": "StatefulSet", "controller": True, "name": "web"}],
            },
            "spec": {"schedulerName": "gpuplace", "containers": [admitted_container()]},
            "status": {"phase": "Pending"},
        }

    def label(self, key: str, value: str) -> PodBuilder:
        self._obj["metadata"]["labels"][key] = value
        return self

    def obj(self) -> dict[str, Any]:
        """A fresh copy each call: a test that edits its pod (binds it) leaves the others' alone."""
        return copy.deepcopy(self._obj)


def make_pod(name: str) -> PodBuilder:
    return PodBuilder(name)


class Apiserver:
    """Records every write; a Binding answers with the next scripted error, else succeeds."""

    def __init__(self, binding_errors: list[APIError] | None = None) -> None:
        self.binding_errors = list(binding_errors or [])
        self.bindings: list[tuple[str, dict[str, Any]]] = []
        self.patches: list[tuple[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def create(self, path: str, body: dict[str, Any], guard: Any = None) -> dict[str, Any]:
        with self.lock:
            if path.endswith("/binding"):
                if guard is not None and not guard():
                    raise FencedError(0, "Fenced", "lease not held")
                if self.binding_errors:
                    raise self.binding_errors.pop(0)
                self.bindings.append((path, body))
            else:
                self.events.append(body)
        return body

    def patch(self, path: str, body: Any, content_type: str = "", **_q: Any) -> dict[str, Any]:
        with self.lock:
            self.patches.append((path, body))
        return {}


def binder_for(api: Apiserver, cluster: Cluster, fence: list[bool] | None = None) -> Binder:
    held = fence if fence is not None else [True]
    binder = Binder(
        api,  # type: ignore[arg-type]
        BinderSettings(bind_workers=2),
        ControllerMetrics(),
        EventRecorder(api, "gpuplace"),  # type: ignore[arg-type]
        lambda: cluster,
        fence=lambda: held[0],
        sender=lambda: InlineSender(api),
    )
    binder.trust = TrustView.of(new_ring(KEY, "2026-01-01T00:00:00Z"))
    return binder


def decide(binder: Binder, *pods: dict[str, Any]) -> None:
    """Feeds the pods, makes each decision the binder's thread would, and waits for the writes."""
    for pod in pods:
        binder.on_pod("ADDED", Pod.of(pod))
    for pod in pods:
        uid = binder.queue.pop(timeout=0)
        assert uid == pod["metadata"]["uid"]
        binder._decide(uid, Pod.of(pod))
    settle(binder)


def settle(binder: Binder) -> None:
    """Waits for the writes that stay off the request loop (Events, reports)."""
    binder.side.shutdown(wait=True)


WEB0 = make_pod("web-0").label(MAP_LABEL, "llm").obj


def test_a_placeable_pod_gets_one_signed_binding_and_holds_its_slot() -> None:
    api = Apiserver()
    binder = binder_for(api, build(TWO_SLOTS))
    decide(binder, WEB0())
    [(path, body)] = api.bindings
    assert path == "/api/v1/namespaces/ml/pods/web-0/binding"
    assert body["metadata"]["uid"] == "uid-web-0"
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
    annotations = body["metadata"]["annotations"]
    assert annotations[NODE_ANNOTATION] == "gpu-1" and annotations[CUDA_ANNOTATION] == "0,1"
    assert annotations[SIGNATURE_ANNOTATION].startswith(f"v2:{key_id(KEY)}:")
    assert verify_binding(KEY, "uid-web-0", "ml", annotations)
    holding = binder.cache.holding("uid-web-0")
    assert holding is not None and holding.slot == SLOT0 and not holding.assumed
    assert len(binder.queue) == 0 and not api.patches


@pytest.mark.parametrize(
    ("error", "requeued"),
    [
        (APIConflictError(409, "Conflict", "already bound"), False),
        (APINotFoundError(404, "NotFound", "pod gone"), False),
        (APIError(500, "InternalError", "etcd timeout"), True),
        (APIError(422, "Invalid", "refused"), True),
    ],
)
def test_a_failed_binding_forgets_the_assumption(error: APIError, requeued: bool) -> None:
    api = Apiserver([error])
    binder = binder_for(api, build(TWO_SLOTS))
    decide(binder, WEB0())
    assert not api.bindings
    assert binder.cache.holding("uid-web-0") is None  # every assume has a forget on failure
    assert binder.cache.slot_holder(SLOT0) is None
    assert len(binder.queue) == (1 if requeued else 0)


def test_a_binder_that_lost_its_lease_sends_nothing_and_decides_again_later() -> None:
    api, fence = Apiserver(), [True]
    binder = binder_for(api, build(TWO_SLOTS), fence)
    binder.on_pod("ADDED", Pod.of(WEB0()))
    uid = binder.queue.pop(timeout=0)
    assert uid is not None
    fence[0] = False  # the lease is lost between the decision and the write
    placement = _placement_of(binder, WEB0())
    binder.cache.assume(uid, "ml/web-0", placement)
    loop = binder.dispatcher.open_loop()
    assert loop is not None
    binder.dispatcher._send(loop, uid, Pod.of(WEB0()), placement)
    assert not api.bindings
    assert binder.cache.holding(uid) is None
    assert len(binder.queue) == 1
    # It waits for the lease, not for a backoff: nothing to pop while the lease is not held...
    binder.dispatcher.lease_returned()
    assert binder.queue.pop(timeout=0.3) is None
    # ...and it is decided again as soon as it is.
    fence[0] = True
    binder.dispatcher.lease_returned()
    assert binder.queue.pop(timeout=0) == uid
    binder._decide(uid, Pod.of(WEB0()))
    settle(binder)
    [(path, _body)] = api.bindings
    assert path == "/api/v1/namespaces/ml/pods/web-0/binding"


def test_a_decision_without_the_lease_parks_every_pod_until_it_is_held_again() -> None:
    api, fence = Apiserver(), [False]
    binder = binder_for(api, build(TWO_SLOTS), fence)
    pods = [WEB0(), make_pod("web-1").label(MAP_LABEL, "llm").obj()]
    decide(binder, *pods)
    assert binder.queue.pop(timeout=0.3) is None  # parked, not backing off
    fence[0] = True
    binder.dispatcher.lease_returned()
    woken = {binder.queue.pop(timeout=0), binder.queue.pop(timeout=0)}
    assert woken == {p["metadata"]["uid"] for p in pods}
    assert not api.bindings


def _placement_of(binder: Binder, pod: dict[str, Any]) -> Placement:
    outcome = plan(podfacts.facts(Pod.of(pod), True), binder.cluster(), binder.cache)
    assert isinstance(outcome, Placement)
    return outcome


def test_an_unplaceable_pod_gets_its_condition_and_event_and_waits_for_its_node() -> None:
    api = Apiserver()
    cluster = build([DeclaredSlot(0, "gpu-9", (0,))])  # a node that does not exist
    binder = binder_for(api, cluster)
    decide(binder, WEB0())
    assert not api.bindings
    [(path, body)] = api.patches
    assert path == "/api/v1/namespaces/ml/pods/web-0/status"
    [condition] = body["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "NodeNotFound",
    )
    assert "gpu-9" in condition["message"]
    assert [e["reason"] for e in api.events] == ["NodeNotFound"]
    assert binder.queue.pop(timeout=0) is None
    assert binder.queue.wake([WakeKey.node("gpu-9")]) == 1


def test_two_pods_for_one_slot_get_one_binding_and_the_second_waits_for_the_slot() -> None:
    api = Apiserver()
    cluster = build(TWO_SLOTS)
    binder = binder_for(api, cluster)
    twin = make_pod("web-0").label(MAP_LABEL, "llm").obj()
    twin["metadata"]["uid"] = "uid-twin"
    decide(binder, WEB0(), twin)
    assert len(api.bindings) == 1
    assert [e["reason"] for e in api.events] == ["SlotTaken"]
    assert binder.queue.wake([WakeKey.slot(SLOT0)]) == 1


# -- bound pods under the binding key ring -------------------------------------------------------

LOST = b"l" * 32
MOVED = [DeclaredSlot(0, "gpu-2", (0,)), DeclaredSlot(1, "gpu-1", (0, 1))]  # slot 0 left gpu-1


def bound_web0(secret: bytes, uid: str = "uid-web-0") -> dict[str, Any]:
    """web-0 bound to slot 0 on gpu-1, GPUs 0 and 1, its Binding signed with `secret`."""
    pod = WEB0()
    decision = BindingDecision(
        MapKey("ml", "llm"), 0, NodeName("gpu-1"), (uuid_of(1, 0), uuid_of(1, 1)), "0,1", 1
    )
    pod["metadata"]["annotations"] = signed_binding(secret, key_id(secret), uid, "ml", decision)
    pod["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    pod["spec"]["nodeName"] = "gpu-1"
    pod["status"]["phase"] = "Running"
    return pod


def conditions(api: Apiserver) -> list[tuple[str, str, str]]:
    return [
        (c["type"], c["status"], c["reason"])
        for _path, body in api.patches
        for c in body["status"]["conditions"]
    ]


def test_a_pod_bound_under_a_lost_key_keeps_its_gpus_and_is_reported() -> None:
    api = Apiserver()
    binder = binder_for(api, build(MOVED))
    binder.rebuild([Pod.of(bound_web0(LOST))], set())
    held = binder.cache.holding("uid-web-0")
    assert held is not None and held.gpus == (uuid_of(1, 0), uuid_of(1, 1))
    assert binder.report.total() == 1
    assert binder.report.count(MapKey("ml", "llm")) == 1
    # Slot 1 now names the GPUs web-0 still has: web-1 waits, nothing is given twice.
    decide(binder, make_pod("web-1").label(MAP_LABEL, "llm").obj())
    binder.report.stop(drain=True)
    assert not api.bindings
    assert ("gpuplace.io/BindingUnverifiable", "True", "BindingUnverifiable") in conditions(api)
    reasons = [e["reason"] for e in api.events]
    assert "BindingUnverifiable" in reasons and "DeviceBusy" in reasons


def test_a_forged_binding_holds_nothing() -> None:
    api = Apiserver()
    binder = binder_for(api, build(MOVED))
    binder.rebuild([Pod.of(bound_web0(KEY, uid="uid-other"))], set())  # copied from another pod
    assert binder.cache.holding("uid-web-0") is None
    decide(binder, make_pod("web-1").label(MAP_LABEL, "llm").obj())
    binder.report.stop(drain=True)
    assert len(api.bindings) == 1
    assert "BindingUnverified" in [e["reason"] for e in api.events]
    assert binder.report.total() == 0


def test_re_adoption_and_key_loss_change_the_report_never_the_holding() -> None:
    api = Apiserver()
    binder = binder_for(api, build(MOVED))
    lost_pod = bound_web0(LOST)
    binder.rebuild([Pod.of(lost_pod)], set())
    assert binder.report.total() == 1
    ring = binder.trust.ring if binder.trust is not None else None
    assert ring is not None
    record = adoption(ring, "uid-web-0", "ml/web-0", lost_pod["metadata"]["annotations"], "t")
    binder.retrust(TrustView.of(ring, [record], "2"), [Pod.of(lost_pod)], set())
    assert binder.report.total() == 0
    assert binder.cache.holding("uid-web-0") is not None
    # A ring that no longer holds the key of a verified pod: it keeps its GPUs, reported.
    binder.retrust(TrustView.of(new_ring(LOST, "t"), (), "3"), [Pod.of(bound_web0(KEY))], set())
    binder.report.stop(drain=True)
    assert binder.cache.holding("uid-web-0") is not None
    assert binder.report.total() == 1
    assert conditions(api)[:2] == [
        ("gpuplace.io/BindingUnverifiable", "True", "BindingUnverifiable"),
        ("gpuplace.io/BindingUnverifiable", "False", "BindingAdopted"),
    ]


def test_prepare_opens_the_binding_connections_before_the_first_bind(
    keeps: tuple[Server, Kube],
) -> None:
    """A new leader opens its Binding connections while its informers sync: the backlog's first
    Bindings find them open instead of each waiting for TCP and TLS."""
    server, kube = keeps
    binder = Binder(
        kube,
        BinderSettings(bind_workers=3),
        ControllerMetrics(),
        EventRecorder(kube, "gpuplace"),
        lambda: build(TWO_SLOTS),
        fence=lambda: True,
    )
    try:
        binder.prepare()
        deadline = time.monotonic() + 10
        while server.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.connections == 3
        assert server.requests == []
    finally:
        binder.stop()


def test_a_freed_slot_is_offered_to_a_maps_waiting_pods_one_decision_at_a_time() -> None:
    api = Apiserver()
    binder = binder_for(api, build(TWO_SLOTS, indexing=Indexing.ALLOCATE))
    pods = []
    for i in range(6):
        obj = make_pod(f"dep-{i}").label(MAP_LABEL, "llm").obj()
        obj["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
        pods.append(obj)
    decide(binder, *pods)
    assert len(api.bindings) == 2
    decisions = 0

    def drain() -> None:
        nonlocal decisions
        binder.side._pool = ThreadPoolExecutor(2, thread_name_prefix="bind-side")
        while (uid := binder.queue.pop(timeout=0)) is not None:
            decisions += 1
            binder._decide(uid, Pod.of(next(p for p in pods if p["metadata"]["uid"] == uid)))
        settle(binder)

    binder.wake([WakeKey.model()])  # a change that cannot help: one of the four is decided
    drain()
    assert (decisions, len(api.bindings)) == (1, 2)
    binder.on_pod("DELETED", Pod.of(pods[0]))  # a slot is freed: one placed, the next told no
    drain()
    assert (decisions, len(api.bindings)) == (3, 3)
    binder.queue.wake_all()  # the periodic retry: one decision for the map's waiting pods
    drain()
    assert (decisions, len(api.bindings)) == (4, 3)


def bound_as(name: str, index: int) -> dict[str, Any]:
    """Pod `name` bound as slot `index` on gpu-1, GPUs 0 and 1, signed with the ring's key."""
    pod = make_pod(name).label(MAP_LABEL, "llm").obj()
    uid = pod["metadata"]["uid"]
    decision = BindingDecision(
        MapKey("ml", "llm"), index, NodeName("gpu-1"), (uuid_of(1, 0), uuid_of(1, 1)), "0,1", 1
    )
    pod["metadata"]["annotations"] = signed_binding(KEY, key_id(KEY), uid, "ml", decision)
    pod["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    pod["spec"]["nodeName"] = "gpu-1"
    pod["status"]["phase"] = "Running"
    return pod


def test_two_bound_pods_on_one_exclusive_gpu_are_reported_not_recorded_silently() -> None:
    api = Apiserver()
    binder = binder_for(api, build(MOVED))
    binder.rebuild([Pod.of(bound_as("web-0", 0)), Pod.of(bound_as("web-1", 1))], set())
    settle(binder)
    conflicts = binder.cache.conflicts()
    assert {c.gpu for c in conflicts} == {uuid_of(1, 0), uuid_of(1, 1)}
    assert all(c.holders == ("uid-web-0", "uid-web-1") for c in conflicts)
    assert binder.metrics.gpus_held_twice._value.get() == 2
    [event, _] = [e for e in api.events if e["reason"] == "GPUHeldTwice"]
    assert event["involvedObject"]["name"] == "web-1"
    assert "pod ml/web-0 (uid uid-web-0)" in event["message"]
    binder.on_pod("DELETED", Pod.of(bound_as("web-0", 0)))
    assert binder.cache.conflicts() == []
    assert binder.metrics.gpus_held_twice._value.get() == 0
