"""dra enforcement without a cluster: slices and claims read, the binder's claim check, and the
webhook's claim wiring (pure admission answers)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from controller.binder import Binder
from controller.claimfinalizers import ClaimFinalizers, When
from controller.dra import ClaimWriter, DraTracker
from controller.metrics import ControllerMetrics
from controller.settings import BinderSettings
from kubeio.errors import APIConflictError
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.annotations import MAP_LABEL, BindingDecision
from placement.binding import Placement, Status
from placement.dra import (
    BINDER_ONLY,
    CLAIM_MAP_LABEL,
    DELETE_PROTECTION,
    POD_CLAIM_ANNOTATION,
    POD_CLAIM_NAME,
    DraDevice,
    DraSettings,
    Enforcement,
    allocation_status,
    claim_template,
    read_claim,
    slice_devices,
    slice_for,
    template_name,
)
from placement.draalloc import ClaimPlan
from placement.inventory import GpuDevice, NodeInventory
from placement.keyring import TrustView, new_ring
from placement.maps import DeclaredSlot
from placement.reasons import Reason
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey
from placement.wake import WakeKey
from tests.unit.fakesender import InlineSender
from tests.unit.placement.test_binding_plan import build
from tests.unit.placement.test_binding_plan import inventory as plan_inventory
from tests.unit.webhook_builders import (
    MAP,
    NS,
    admitted_container,
    env_of,
    make_model,
    make_pod,
    patched,
    review,
)
from webhook.admission import build_response
from webhook.settings import AdmissionSettings

SETTINGS = DraSettings()
NODE = NodeName("gpu-a-01")
KEY = MapKey(NS, "llm")


def inventory(node: str = NODE, gpus: int = 4) -> NodeInventory:
    return NodeInventory(
        NodeName(node),
        tuple(GpuDevice(i, GpuUuid(f"GPU-{node}-{i}"), "H100", 81559) for i in range(gpus)),
    )


def published(node: str = NODE, gpus: int = 4, generation: int = 1) -> dict[str, Any]:
    return slice_for(inventory(node, gpus), SETTINGS, generation)


def test_slices_name_devices_by_uuid_newest_generation_only() -> None:
    old = published(gpus=4, generation=1)
    new = published(gpus=2, generation=2)
    new["metadata"]["name"] = "second"
    other = copy.deepcopy(published())
    other["spec"]["driver"] = "other.example.com"
    devices = slice_devices([old, new, other], SETTINGS)
    assert [(d.pool, d.name, d.uuid) for d in devices] == [
        (NODE, "gpu-0", f"GPU-{NODE}-0"),
        (NODE, "gpu-1", f"GPU-{NODE}-1"),
    ]


def test_qualified_attribute_names_match_too() -> None:
    body = published(gpus=1)
    device = body["spec"]["devices"][0]
    device["attributes"] = {"gpu.nvidia.com/uuid": device["attributes"]["uuid"]}
    assert [d.uuid for d in slice_devices([body], SETTINGS)] == [f"GPU-{NODE}-0"]
    device["attributes"] = {"serial": {"string": "x"}}
    assert slice_devices([body], SETTINGS) == []


def test_template_names_are_valid_object_names() -> None:
    assert template_name("llm") == "gpuplace-llm"
    long = template_name("m" * 253)
    assert len(long) == 253 and long != template_name("m" * 252 + "n")
    body = claim_template(KEY, SETTINGS)
    request = body["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "All",
        # No device matches: kube-scheduler can never allocate a claim of the template.
        "selectors": [{"cel": {"expression": BINDER_ONLY}}],
    }


@dataclass(frozen=True)
class Holds:
    pod: str  # namespace/name
    slot: SlotKey


class Slots:
    """A SlotView in which given pods share given GPUs; `pods` says which pod (namespace/name)
    holds a slot for a uid (a sharer of namespace NS when not given)."""

    def __init__(
        self,
        holders: Mapping[str, Mapping[str, Sharing]] | None = None,
        pods: Mapping[str, str] | None = None,
    ) -> None:
        self.holders = holders or {}
        self.pods = pods or {}

    def slot_holder(self, slot: SlotKey) -> str | None:
        return None

    def holding(self, uid: str) -> Holds | None:
        if uid in self.pods:
            return Holds(self.pods[uid], SlotKey(KEY, 0))
        if any(uid in users for users in self.holders.values()):
            return Holds(f"{NS}/pod-{uid}", SlotKey(KEY, 0))
        return None

    def gpu_holders(self, node: NodeName, gpu: str) -> Mapping[str, Sharing]:
        return self.holders.get(gpu, {})

    def taken_indices(self, key: MapKey) -> Mapping[int, str]:
        return {}


def pod(uid: str = "u1", claim: str | None = "web-0-gpuplace-gpus-x") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "web-0", "namespace": NS, "uid": uid},
        "spec": {"resourceClaims": [{"name": POD_CLAIM_NAME, "resourceClaimTemplateName": "t"}]},
        "status": {},
    }
    if claim:
        obj["status"]["resourceClaimStatuses"] = [
            {"name": POD_CLAIM_NAME, "resourceClaimName": claim}
        ]
    return obj


def claim(
    name: str = "web-0-gpuplace-gpus-x",
    owner: str = "u1",
    devices: tuple[int, ...] = (),
    reserved: tuple[str, ...] = (),
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"claim-{name}",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "Pod", "uid": owner, "controller": True, "name": "x"}],
        },
        "status": {},
    }
    if devices:
        status = allocation_status(
            [DraDevice(NODE, NODE, f"gpu-{i}", GpuUuid(f"GPU-{NODE}-{i}")) for i in devices],
            NODE,
            "web-0",
            reserved[0] if reserved else owner,
            SETTINGS.driver,
        )
        if not reserved:
            del status["reservedFor"]
        obj["status"] = status
    return obj


def placement(*gpus: int) -> Placement:
    uuids = tuple(GpuUuid(f"GPU-{NODE}-{i}") for i in gpus)
    decision = BindingDecision(KEY, 0, NODE, uuids, ",".join(map(str, gpus)), 1)
    return Placement(SlotKey(KEY, 0), decision, Sharing.EXCLUSIVE, uuids)


def tracker(*claims: dict[str, Any], gpus: int = 4) -> tuple[DraTracker, list[set[str]]]:
    woken: list[set[str]] = []
    t = DraTracker(SETTINGS, lambda keys: woken.append(set(keys)))
    t.on_slice("ADDED", published(gpus=gpus), None)
    for c in claims:
        t.on_claim("ADDED", c, None)
    return t, woken


def test_check_plans_the_declared_devices_of_the_pods_claim() -> None:
    t, _ = tracker(claim())
    plan = t.check(Pod.of(pod()), placement(1, 3), Slots())
    assert isinstance(plan, ClaimPlan)
    assert [d.name for d in plan.devices] == ["gpu-1", "gpu-3"]
    assert plan.node == NODE and not plan.done
    assert plan.claim.name == "web-0-gpuplace-gpus-x"


@pytest.mark.parametrize(
    ("the_pod", "claims", "gpus", "reason"),
    [
        (pod(), [claim()], 1, "DeviceMissing"),  # gpu-1 not in the slices
        (pod(claim=None), [], 4, "ClaimPending"),  # kube-controller-manager has not made it yet
        (pod(), [], 4, "ClaimPending"),  # made, not yet in the cache
        (pod(), [claim(owner="someone-else")], 4, "ClaimConflict"),
        (
            pod(),
            [claim(), claim("other", owner="u2", devices=(3,), reserved=("u2",))],
            4,
            "DeviceBusy",
        ),
    ],
    ids=["missing-device", "no-claim-yet", "claim-not-cached", "foreign-owner", "busy"],
)
def test_check_says_why_it_waits(
    the_pod: dict[str, Any], claims: list[dict[str, Any]], gpus: int, reason: str
) -> None:
    t, _ = tracker(*claims, gpus=gpus)
    status = t.check(Pod.of(the_pod), placement(1, 3), Slots())
    assert isinstance(status, Status), status
    assert status.reason == reason, status.message


def test_pod_without_the_claim_entry_is_unresolvable() -> None:
    t, _ = tracker(claim())
    bare = pod()
    bare["spec"] = {}
    status = t.check(Pod.of(bare), placement(1), Slots())
    assert isinstance(status, Status) and status.reason == "ClaimMissing"


def test_a_gpu_shared_with_a_pod_the_slot_cache_allows_is_not_busy() -> None:
    t, _ = tracker(claim(), claim("other", owner="u2", devices=(1,), reserved=("u2",)))
    plan = t.check(Pod.of(pod()), placement(1), Slots({f"GPU-{NODE}-1": {"u2": Sharing.SHARED}}))
    assert isinstance(plan, ClaimPlan)


def test_a_claim_already_allocated_so_is_reused_and_freed_gpus_wake_waiters() -> None:
    t, woken = tracker(claim(devices=(1, 3), reserved=("u1",)))
    plan = t.check(Pod.of(pod()), placement(1, 3), Slots())
    assert isinstance(plan, ClaimPlan) and plan.done
    other = t.check(Pod.of(pod()), placement(1, 2), Slots())
    assert isinstance(other, ClaimPlan) and not other.done  # reallocated after a map change
    t.on_claim("DELETED", claim(devices=(1, 3), reserved=("u1",)), None)
    assert {f"gpu:{NODE}/GPU-{NODE}-1", f"gpu:{NODE}/GPU-{NODE}-3", "claim:u1"} <= woken[-1]


def test_read_claim() -> None:
    body = claim(devices=(2,), reserved=("u1",))
    body["metadata"]["finalizers"] = [DELETE_PROTECTION]
    state = read_claim(body)
    assert state.owner_uid == "u1" and state.node == NODE
    assert state.allocated == ((SETTINGS.driver, NODE, "gpu-2"),)
    assert state.reserved_for == ("u1",) and state.finalizers == (DELETE_PROTECTION,)


# -- admission ----------------------------------------------------------------------------------

DRA = AdmissionSettings(enforcement=Enforcement.DRA)
MODEL = make_model().map("llm", range(4)).obj()


def test_dra_pods_get_the_maps_claim_in_every_container_and_uuid_env() -> None:
    obj = (
        make_pod("web-1")
        .label(MAP, "llm")
        .container("init", init=True)
        .container("main", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
        .obj()
    )
    obj["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    out = patched(obj, build_response(review(obj), MODEL, DRA))
    assert out["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": "gpuplace-llm"}
    ]
    for kind in ("initContainers", "containers"):
        assert out["spec"][kind][0]["resources"]["claims"] == [{"name": POD_CLAIM_NAME}]
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    names = [e["name"] for e in env_of(out)]
    assert names == ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"]  # the driver sets NVIDIA_*
    # Admitting what came out again (a pod re-created from `kubectl get -o yaml`) changes nothing.
    again = build_response(review(out), MODEL, DRA)
    assert patched(out, again) == out


def test_env_enforcement_adds_no_claim() -> None:
    obj = make_pod("web-1").label(MAP, "llm").obj()
    out = patched(obj, build_response(review(obj), MODEL, AdmissionSettings()))
    assert "resourceClaims" not in out["spec"]
    assert "resources" not in out["spec"]["containers"][0]


def test_dra_pods_with_claims_of_their_own_are_refused_with_where() -> None:
    obj = make_pod("web-1").label(MAP, "llm").obj()
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    response = build_response(review(obj), MODEL, DRA)["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "spec.resourceClaims[0] 'gpu'" in message
    assert "spec.containers[0].resources.claims[0] 'gpu'" in message
    assert f"placement map {NS}/llm is enforced through DRA" in message


def test_a_claim_named_directly_under_our_name_is_replaced_by_the_maps_template() -> None:
    obj = make_pod("web-1").label(MAP, "llm").obj()
    obj["spec"]["resourceClaims"] = [{"name": POD_CLAIM_NAME, "resourceClaimName": "gpuplace-llm"}]
    out = patched(obj, build_response(review(obj), MODEL, DRA))
    assert out["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": "gpuplace-llm"}
    ]


# -- the claim's finalizer off the Binding path, Reserve's writes ------------------------------


class ClaimApi:
    """ResourceClaims, pods and Events at gpuplace's boundary (`Kube`): a claim's PATCH checks
    and bumps its resourceVersion as the apiserver does; every write is recorded in order."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, Any]] = []  # (what, body): finalizer, status, binding, ...
        self.lock = threading.Lock()

    def add(self, body: dict[str, Any]) -> dict[str, Any]:
        self.claims[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def get(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.claims[name])

    def bump(self, name: str) -> dict[str, Any]:
        """Someone else changed the claim (a label, an annotation): a new resourceVersion."""
        with self.lock:
            meta = self.claims[name]["metadata"]
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return copy.deepcopy(self.claims[name])

    def patch(self, path: str, body: Any, content_type: str = "", **_q: Any) -> dict[str, Any]:
        with self.lock:
            if "/resourceclaims/" not in path:
                self.writes.append(("pod status", body))
                return {}
            name = path.split("/resourceclaims/")[1].split("/", maxsplit=1)[0]
            obj = self.claims[name]
            meta = obj["metadata"]
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != meta["resourceVersion"]:
                raise APIConflictError(409, "Conflict", f"{name}: {wanted} is not current")
            if path.endswith("/status"):
                self.writes.append(("status", body))
                obj["status"] = {k: v for k, v in body["status"].items() if v is not None}
            else:
                self.writes.append(("finalizer", body))
                meta["finalizers"] = body["metadata"]["finalizers"]
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return copy.deepcopy(obj)

    def create(self, path: str, body: dict[str, Any], guard: Any = None) -> dict[str, Any]:
        with self.lock:
            self.writes.append(("binding" if path.endswith("/binding") else "event", body))
        return body

    def kinds(self) -> list[str]:
        with self.lock:
            return [what for what, _ in self.writes]


def ours(body: dict[str, Any], finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The claim as kube-controller-manager generates it from the map's template."""
    meta = body["metadata"]
    meta["labels"] = {CLAIM_MAP_LABEL: "llm"}
    meta["annotations"] = {POD_CLAIM_ANNOTATION: POD_CLAIM_NAME}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    return body


class Calls:
    """A `submit` that keeps the calls until `run` (the finalizer writer's workers)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        self.calls.append((fn, args))

    def run(self) -> None:
        while self.calls:
            fn, args = self.calls.pop(0)
            fn(*args)


def protection(
    api: ClaimApi, t: DraTracker, serves: set[str] | None = None
) -> tuple[ClaimFinalizers, Calls, list[When]]:
    calls, counted = Calls(), []
    finalizers = ClaimFinalizers(
        api,  # type: ignore[arg-type]
        fence=lambda: True,
        serves=lambda uid: uid in (serves if serves is not None else {"u1"}),
        latest=t.claim,
        count=counted.append,
        submit=calls.submit,
    )
    t.attach(finalizers)
    return finalizers, calls, counted


def test_the_finalizer_is_written_when_the_claim_is_first_seen_and_not_again() -> None:
    api = ClaimApi()
    t, _ = tracker()
    finalizers, calls, counted = protection(api, t)
    first = api.add(ours(claim()))
    t.on_claim("ADDED", first, None)  # not leading yet: a standby writes nothing
    calls.run()
    assert api.writes == []
    finalizers.start(t.unprotected())  # leading: the claims seen before come first
    t.on_claim("MODIFIED", first, None)  # the same version again (a relist): queued once
    calls.run()
    assert api.writes == [
        ("finalizer", {"metadata": {"resourceVersion": "7", "finalizers": [DELETE_PROTECTION]}})
    ]
    assert counted == [When.SEEN]
    t.on_claim("MODIFIED", first, None)  # the version before, once more (a resync)
    t.on_claim("MODIFIED", api.get(first["metadata"]["name"]), None)  # the write's echo
    calls.run()
    assert len(api.writes) == 1 and t.unprotected() == []


def test_only_claims_of_gpuplaces_templates_for_pods_it_serves_are_protected() -> None:
    api = ClaimApi()
    t, _ = tracker()
    finalizers, calls, counted = protection(api, t, serves={"u1"})
    finalizers.start([])
    foreign = api.add(claim("foreign"))  # no template label: a user's own claim
    other = api.add(ours(claim("other", owner="u2")))  # a pod of another scheduler
    deleting = api.add(ours(claim("going")))
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for body in (foreign, other, deleting):
        t.on_claim("ADDED", body, None)
    calls.run()
    assert api.writes == [] and counted == []


def reserve(writer: ClaimWriter, plan: ClaimPlan, pod: Pod) -> None:
    """Reserve as the binder sends it: the writes before the status, then the status write."""
    request = writer.status_request(plan, pod, writer.prepare(plan))
    assert request.body is not None
    writer.kube.patch(request.path, orjson.loads(request.body), request.content_type or "")


def plan_for(t: DraTracker) -> ClaimPlan:
    plan = t.check(Pod.of(pod()), placement(1), Slots())
    assert isinstance(plan, ClaimPlan)
    return plan


def test_reserve_writes_only_the_status_when_the_finalizer_is_there() -> None:
    api = ClaimApi()
    body = api.add(ours(claim(), finalizers=(DELETE_PROTECTION,)))
    t, _ = tracker(body)
    finalizers, _, counted = protection(api, t)
    reserve(ClaimWriter(api, SETTINGS, finalizers), plan_for(t), Pod.of(pod()))  # type: ignore[arg-type]
    [(what, written)] = api.writes
    assert what == "status" and written["metadata"]["resourceVersion"] == "7"
    assert written["status"]["reservedFor"][0]["uid"] == "u1"
    assert counted == []


def test_reserve_writes_the_finalizer_first_for_a_claim_seen_only_at_bind_time() -> None:
    api = ClaimApi()
    body = api.add(ours(claim()))
    t, _ = tracker(body)  # seen while not leading: no early write
    finalizers, _, counted = protection(api, t)
    reserve(ClaimWriter(api, SETTINGS, finalizers), plan_for(t), Pod.of(pod()))  # type: ignore[arg-type]
    assert api.kinds() == ["finalizer", "status"]
    versions = [w["metadata"]["resourceVersion"] for _, w in api.writes]
    assert versions == ["7", "8"]
    assert counted == [When.BIND]
    # Without the early writer (as before it existed) it is the same two writes.
    api2 = ClaimApi()
    t2, _ = tracker(api2.add(ours(claim())))
    reserve(ClaimWriter(api2, SETTINGS), plan_for(t2), Pod.of(pod()))  # type: ignore[arg-type]
    assert api2.kinds() == ["finalizer", "status"]


def test_reserve_planned_before_the_early_write_uses_the_version_it_made() -> None:
    api = ClaimApi()
    body = api.add(ours(claim()))
    t, _ = tracker()
    finalizers, calls, counted = protection(api, t)
    finalizers.start([])
    t.on_claim("ADDED", body, None)
    plan = plan_for(t)  # decided from version 7, before the finalizer's echo arrived
    calls.run()
    reserve(ClaimWriter(api, SETTINGS, finalizers), plan, Pod.of(pod()))  # type: ignore[arg-type]
    assert api.kinds() == ["finalizer", "status"]
    assert api.writes[1][1]["metadata"]["resourceVersion"] == "8"  # the finalizer's, not a guess
    assert counted == [When.SEEN]


def test_a_queued_early_write_is_taken_over_by_reserve_and_written_once() -> None:
    api = ClaimApi()
    body = api.add(ours(claim()))
    t, _ = tracker()
    finalizers, calls, counted = protection(api, t)
    finalizers.start([])
    t.on_claim("ADDED", body, None)  # queued, not started
    reserve(ClaimWriter(api, SETTINGS, finalizers), plan_for(t), Pod.of(pod()))  # type: ignore[arg-type]
    calls.run()  # the worker finds it taken
    assert api.kinds() == ["finalizer", "status"]
    assert counted == [When.BIND]


def test_a_claim_changed_after_the_early_write_still_refuses_the_status() -> None:
    api = ClaimApi()
    body = api.add(ours(claim()))
    t, _ = tracker()
    finalizers, calls, _ = protection(api, t)
    finalizers.start([])
    t.on_claim("ADDED", body, None)
    plan = plan_for(t)
    calls.run()  # 7 -> 8: the finalizer
    api.bump(body["metadata"]["name"])  # 8 -> 9: someone else's change
    with pytest.raises(APIConflictError):
        reserve(ClaimWriter(api, SETTINGS, finalizers), plan, Pod.of(pod()))  # type: ignore[arg-type]
    assert api.kinds() == ["finalizer"]


def test_an_early_write_that_lost_a_race_is_retried_from_the_newer_version() -> None:
    api = ClaimApi()
    body = api.add(ours(claim()))
    t, _ = tracker()
    finalizers, calls, counted = protection(api, t)
    finalizers.start([])
    t.on_claim("ADDED", body, None)
    newer = api.bump(body["metadata"]["name"])  # changed before the write left: a conflict
    real_latest = t.claim
    t.on_claim("MODIFIED", newer, None)  # ...whose event arrives while the write runs
    seen = iter([read_claim(body), read_claim(newer)])
    finalizers._latest = lambda key: next(seen, None) or real_latest(key)
    calls.run()
    assert [w["metadata"]["resourceVersion"] for _, w in api.writes] == ["8"]
    assert counted == [When.SEEN]


def test_early_writes_racing_reserves_write_each_finalizer_once() -> None:
    api = ClaimApi()
    t, _ = tracker()
    counted: list[When] = []
    finalizers = ClaimFinalizers(
        api,  # type: ignore[arg-type]
        fence=lambda: True,
        serves=lambda uid: True,
        latest=t.claim,
        count=counted.append,
        workers=4,
    )
    t.attach(finalizers)
    finalizers.start([])
    writer = ClaimWriter(api, SETTINGS, finalizers)  # type: ignore[arg-type]
    device = DraDevice(NODE, NODE, "gpu-0", GpuUuid(f"GPU-{NODE}-0"))
    bodies = [api.add(ours(claim(f"c{i}", owner=f"u{i}"))) for i in range(200)]
    errors: list[BaseException] = []

    def bind(start: int) -> None:
        for body in bodies[start::8]:
            plan = ClaimPlan(read_claim(body), NODE, (device,), False)
            uid = body["metadata"]["ownerReferences"][0]["uid"]
            owner = Pod.of({"metadata": {"namespace": NS, "name": uid, "uid": uid}})
            try:
                reserve(writer, plan, owner)
            except BaseException as exc:
                errors.append(exc)

    for body in bodies:
        t.on_claim("ADDED", body, None)
    threads = [threading.Thread(target=bind, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    finalizers.stop()
    assert errors == []
    assert api.kinds().count("finalizer") == 200 == api.kinds().count("status")
    assert len(counted) == 200
    for body in bodies:
        stored = api.get(body["metadata"]["name"])
        assert stored["metadata"]["finalizers"] == [DELETE_PROTECTION]
        assert (
            stored["status"]["reservedFor"][0]["uid"]
            == stored["metadata"]["ownerReferences"][0]["uid"]
        )


# -- ClaimPending only once the claim is late ----------------------------------------------------


def dra_pod(claim_name: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "namespace": "ml",
            "name": "web-0",
            "uid": "u1",
            "labels": {MAP_LABEL: "llm"},
            "ownerReferences": [{"kind": "StatefulSet", "controller": True, "name": "web"}],
        },
        "spec": {
            "schedulerName": "gpuplace",
            "containers": [admitted_container()],
            "resourceClaims": [{"name": POD_CLAIM_NAME, "resourceClaimTemplateName": "t"}],
        },
        "status": {"phase": "Pending"},
    }
    if claim_name:
        obj["status"]["resourceClaimStatuses"] = [
            {"name": POD_CLAIM_NAME, "resourceClaimName": claim_name}
        ]
    return obj


def dra_binder(api: ClaimApi, delay: float) -> Binder:
    t = DraTracker(SETTINGS, lambda keys: None)
    t.on_slice("ADDED", slice_for(plan_inventory("gpu-1", 2), SETTINGS), None)
    binder = Binder(
        api,  # type: ignore[arg-type]
        BinderSettings(bind_workers=2, claim_pending_report_seconds=delay),
        ControllerMetrics(),
        EventRecorder(api, "gpuplace"),  # type: ignore[arg-type]
        lambda: CLUSTER,
        dra=t,
        sender=lambda: InlineSender(api),
    )
    binder.trust = TrustView.of(new_ring(b"k" * 32, "2026-01-01T00:00:00Z"))
    t._wake = binder.wake
    return binder


CLUSTER = build([DeclaredSlot(0, "gpu-1", (0, 1))])


def ml_claim() -> dict[str, Any]:
    body = ours(claim())
    body["metadata"]["namespace"] = "ml"
    return body


def decide_once(binder: Binder, obj: dict[str, Any]) -> None:
    binder.on_pod("MODIFIED", Pod.of(obj))
    uid = binder.queue.pop(timeout=0)
    assert uid == "u1"
    binder._decide(uid, Pod.of(obj))


def test_claim_pending_is_reported_only_once_the_claim_is_late() -> None:
    api = ClaimApi()
    binder = dra_binder(api, delay=0.3)
    decide_once(binder, dra_pod())  # kube-controller-manager has not generated it yet
    assert binder.pending.flush_due() == 0
    decide_once(binder, dra_pod())  # decided again meanwhile: still the first sighting's clock
    time.sleep(0.15)
    assert binder.pending.flush_due() == 0
    time.sleep(0.2)
    assert binder.pending.flush_due() == 1
    binder.side.shutdown(wait=True)
    assert api.kinds() == ["pod status", "event"]
    condition = api.writes[0][1]["status"]["conditions"][0]
    assert condition["reason"] == Reason.CLAIM_PENDING and condition["status"] == "False"
    assert api.writes[1][1]["reason"] == Reason.CLAIM_PENDING


def test_a_pod_bound_before_its_claim_is_late_gets_no_report() -> None:
    api = ClaimApi()
    binder = dra_binder(api, delay=0.2)
    decide_once(binder, dra_pod())
    body = api.add(ml_claim())
    body["metadata"]["finalizers"] = [DELETE_PROTECTION]
    api.add(body)
    assert binder.dra is not None
    binder.dra.on_claim("ADDED", body, None)
    decide_once(binder, dra_pod(body["metadata"]["name"]))  # placed: its report is dropped
    binder.side.shutdown(wait=True)  # the status write and the Binding
    time.sleep(0.25)
    assert binder.pending.flush_due() == 0
    assert api.kinds() == ["status", "binding"]


def test_the_binders_pipeline_writes_one_finalizer_and_no_claim_pending() -> None:
    api = ClaimApi()
    binder = dra_binder(api, delay=2.0)
    binder.on_pod("ADDED", Pod.of(dra_pod()))
    binder.start()
    try:
        body = api.add(ml_claim())
        assert binder.dra is not None
        binder.dra.on_claim("ADDED", body, None)
        binder.on_pod("MODIFIED", Pod.of(dra_pod(body["metadata"]["name"])))
        deadline = time.monotonic() + 10
        while "binding" not in api.kinds() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        binder.stop()
    assert api.kinds() == ["finalizer", "status", "binding"]
    finalizer_writes = binder.metrics.claim_finalizers
    seen = finalizer_writes.labels("seen")._value.get()
    bind = finalizer_writes.labels("bind")._value.get()
    assert seen + bind == 1


def test_a_pod_whose_claim_stays_missing_is_reported_by_the_binders_own_loop() -> None:
    api = ClaimApi()
    binder = dra_binder(api, delay=0.2)
    binder.on_pod("ADDED", Pod.of(dra_pod()))
    started = time.monotonic()
    binder.start()
    try:
        deadline = started + 10
        while "event" not in api.kinds() and time.monotonic() < deadline:
            time.sleep(0.01)
        waited = time.monotonic() - started
    finally:
        binder.stop()
    assert api.kinds() == ["pod status", "event"]  # with no other event to wake the binder
    assert 0.2 <= waited < 1.5


def test_a_claim_that_doubles_a_device_wakes_its_gpu_and_is_found() -> None:
    """A claim allocated a device another claim holds (written by hand, owner or not) wakes that
    GPU, which is where the binder reports it: a wake with no key would reach nobody."""
    first = claim("a", devices=(2,))
    t, woken = tracker(first)
    second = claim("b", devices=(2,))
    del second["metadata"]["ownerReferences"]
    t.on_claim("ADDED", second, None)
    assert WakeKey.gpu(NODE, f"GPU-{NODE}-2") in woken[-1]
    [found] = t.held_twice(Slots())
    assert [c.name for c in found.claims] == ["a", "b"]
    t.on_claim("DELETED", second, None)
    assert t.held_twice(Slots()) == []
