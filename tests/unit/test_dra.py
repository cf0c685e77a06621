"""dra enforcement without a cluster: slices and claims read, the binder's claim check, and the
webhook's claim wiring (pure admission answers)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from controller.dra import ClaimPlan, DraTracker
from kubeio.pod import Pod
from placement.annotations import BindingDecision
from placement.binding import Placement, Status
from placement.dra import (
    DELETE_PROTECTION,
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
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey
from tests.unit.webhook_builders import MAP, NS, env_of, make_model, make_pod, patched, review
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
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}


class Slots:
    """A SlotView in which given pods share given GPUs."""

    def __init__(self, holders: Mapping[str, Mapping[str, Sharing]] | None = None) -> None:
        self.holders = holders or {}

    def slot_holder(self, slot: SlotKey) -> str | None:
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
