"""The gate on the DRA claim path: the binder judges the devices a pod's ResourceClaim would be
allocated (the driver's devices for the node, a MIG instance as its parent GPU) before it writes
the allocation, and an allocation the binder did not make, outside its namespace's grants, keeps
no GPU from anyone."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller.binder import Binder
from controller.dra import DraTracker
from controller.metrics import ControllerMetrics
from controller.settings import BinderSettings
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.annotations import BindingDecision
from placement.binding import Cluster, Code, FreeSlots, Placement, Status
from placement.devices import GpuId
from placement.dra import DELETE_PROTECTION, DraDevice, claim_devices, slice_for
from placement.draalloc import ClaimPlan
from placement.gate import Device
from placement.grants import Grant, GrantView, PlacementPolicy, resolve
from placement.inventory import GpuDevice, MigInstance, NodeInventory
from placement.keyring import TrustView, new_ring
from placement.maps import DeclaredSlot
from placement.model import CompiledMap
from placement.reasons import Reason
from placement.types import DeviceRef, GpuUuid, NodeName, Sharing, SlotKey
from placement.wake import WakeKey
from tests.unit.controller.test_dra import (
    KEY,
    NODE,
    SETTINGS,
    ClaimApi,
    claim,
    decide_once,
    dra_pod,
    inventory,
    ml_claim,
    ours,
    placement,
    pod,
    tracker,
)
from tests.unit.controller.test_dra import Slots as SharedGpus
from tests.unit.fakesender import InlineSender
from tests.unit.placement.test_binding_plan import build
from tests.unit.placement.test_binding_plan import inventory as plan_inventory
from tests.unit.webhook_builders import NS

TENANT = "tenant-a"
ELSEWHERE = NodeName("gpu-b-01")


class Slots(SharedGpus):
    """A slot cache (`SlotView`) in which given pods share given GPUs."""

    def free_slots(self, cmap: CompiledMap) -> FreeSlots:
        raise AssertionError("a claim check reads no free slots")


def grants(team: tuple[DeviceRef, ...] = (), tenant_here: bool = False) -> GrantView:
    """The team (the pods' namespace) granted `team` of NODE (empty: all of it); the tenant
    granted another node, and NODE too when `tenant_here`."""
    tenant_nodes = (ELSEWHERE, NODE) if tenant_here else (ELSEWHERE,)
    policy = PlacementPolicy((Grant((NS,), (NODE,), devices=team), Grant((TENANT,), tenant_nodes)))
    return resolve(policy, False, {NODE: {}, ELSEWHERE: {}})


def uuid(index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{NODE}-{index}")


# ------------------------------------------------------------------ the pod's own allocation


def test_an_allocation_outside_the_namespaces_grant_is_refused_before_it_is_written() -> None:
    t, _ = tracker(claim())
    refused = t.check(Pod.of(pod()), placement(1, 3), Slots(), (), grants((0, 1)), inventory())
    assert isinstance(refused, Status), refused
    assert refused.reason == Reason.NOT_GRANTED and refused.code is Code.UNRESOLVABLE
    assert f"may not use GPU(s) 3 ({uuid(3)}) of node {NODE}" in refused.message
    assert refused.message.startswith(f"map {KEY} index 0: ResourceClaim allocation refused")
    assert refused.waits_for == {WakeKey.model()}  # a new policy comes with a new model
    granted = t.check(Pod.of(pod()), placement(0, 1), Slots(), (), grants((0, 1)), inventory())
    assert isinstance(granted, ClaimPlan)


def test_a_grant_by_uuid_or_index_is_matched_through_the_nodes_inventory() -> None:
    t, _ = tracker(claim())
    view = grants((uuid(3), 1))  # GPU 3 by UUID, GPU 1 by index
    plan = t.check(Pod.of(pod()), placement(1, 3), Slots(), (), view, inventory())
    assert isinstance(plan, ClaimPlan)
    # Without the inventory the driver's device keeps only its UUID: index 1 is not proven.
    blind = t.check(Pod.of(pod()), placement(1, 3), Slots(), (), view, None)
    assert isinstance(blind, Status) and blind.reason == Reason.NOT_GRANTED


@pytest.mark.parametrize("view", [GrantView(), grants()], ids=["no-policy", "whole-node"])
def test_an_allocation_the_grants_allow_is_planned(view: GrantView) -> None:
    t, _ = tracker(claim())
    assert isinstance(t.check(Pod.of(pod()), placement(1, 3), Slots(), (), view), ClaimPlan)


def test_a_namespace_without_a_grant_under_deny_by_default_is_refused() -> None:
    t, _ = tracker(claim())
    view = dataclasses.replace(grants(), deny_by_default=True)
    elsewhere = pod()
    elsewhere["metadata"]["namespace"] = "elsewhere"
    found = claim()
    found["metadata"]["namespace"] = "elsewhere"
    t.on_claim("ADDED", found, None)
    refused = t.check(Pod.of(elsewhere), placement(0), Slots(), (), view, inventory())
    assert isinstance(refused, Status) and refused.reason == Reason.NOT_GRANTED
    assert "deny by default" in refused.message


def mig_inventory() -> NodeInventory:
    """NODE with GPUs 0-3, GPU 2 split into one MIG instance."""
    return NodeInventory(
        NODE,
        tuple(
            GpuDevice(
                i,
                uuid(i),
                "H100",
                81559,
                mig_mode=i == 2,
                mig_instances=(
                    (MigInstance(f"MIG-{NODE}-2", "3g.40gb", 0, 0, 4, 40960),) if i == 2 else ()
                ),
            )
            for i in range(4)
        ),
    )


def test_a_mig_instance_is_judged_as_its_parent_gpu() -> None:
    inv = mig_inventory()
    t = DraTracker(SETTINGS, lambda _keys: None)
    t.on_slice("ADDED", slice_for(inv, SETTINGS), None)
    t.on_claim("ADDED", claim(), None)
    mig = GpuUuid(f"MIG-{NODE}-2")
    decision = BindingDecision(KEY, 0, NODE, (mig,), mig, 1)
    on_mig = Placement(SlotKey(KEY, 0), decision, Sharing.EXCLUSIVE, (GpuId.of_uuid(mig),))
    refused = t.check(Pod.of(pod()), on_mig, Slots(), (), grants((0, 1)), inv)
    assert isinstance(refused, Status) and refused.reason == Reason.NOT_GRANTED
    assert f"GPU(s) 2 ({uuid(2)})" in refused.message
    assert isinstance(t.check(Pod.of(pod()), on_mig, Slots(), (), grants((2,)), inv), ClaimPlan)
    # The parent is read from the driver's attribute, and from the inventory without it.
    orphan = DraDevice(NODE, NODE, "gpu-2-mig", mig)
    assert claim_devices([orphan], inv) == (Device(uuid(2), 2),)


# ------------------------------------------------------------ others' allocations


def tenants_claim(*, templated: bool = True) -> dict[str, Any]:
    """A claim of the tenant's pod u9, allocated GPU 3 of NODE by someone other than the binder
    (no holding of the slot cache backs it)."""
    body = claim("squat-gpuplace-gpus-y", owner="u9", devices=(3,), reserved=("u9",))
    body["metadata"]["namespace"] = TENANT
    return ours(body) if templated else body


@pytest.mark.parametrize(
    "view", [grants(), grants(tenant_here=True), GrantView()], ids=["outside", "granted", "none"]
)
@pytest.mark.parametrize("templated", [True, False], ids=["labelled-as-gpuplaces", "plain"])
def test_an_allocation_the_binder_did_not_make_holds_its_device(
    view: GrantView, templated: bool
) -> None:
    """Whoever allocated it (kube-scheduler for a tenant's claim), the device is held: the
    binder never gives it to a second claim, whatever the claim's labels and the grants say."""
    t, _ = tracker(claim(), tenants_claim(templated=templated))
    outcome = t.check(Pod.of(pod()), placement(3), Slots(), (), view, inventory())
    assert isinstance(outcome, Status) and outcome.reason == Reason.DEVICE_BUSY, outcome
    assert f"ResourceClaim {TENANT}/squat-gpuplace-gpus-y" in outcome.message


def test_an_allocation_backed_by_the_slot_cache_is_not_judged_again() -> None:
    """A signed binding was judged when it was made: its pod's claim keeps its GPU shared as the
    cache says, whatever the grants say now."""
    t, _ = tracker(claim(), tenants_claim())
    shared = Slots({uuid(3): {"u9": Sharing.SHARED}}, {"u9": f"{TENANT}/squat"})
    assert isinstance(t.check(Pod.of(pod()), placement(3), shared, (), grants()), ClaimPlan)
    # The same claim naming a sharer of another namespace as its owner: busy.
    elsewhere = Slots({uuid(3): {"u9": Sharing.SHARED}}, {"u9": f"{NS}/web-9"})
    busy = t.check(Pod.of(pod()), placement(3), elsewhere, (), grants())
    assert isinstance(busy, Status) and busy.reason == Reason.DEVICE_BUSY


# ------------------------------------------------------------------- through the binder


def granted_cluster(view: GrantView) -> Cluster:
    cluster = build([DeclaredSlot(0, "gpu-1", (0, 1))])
    return dataclasses.replace(cluster, model=dataclasses.replace(cluster.model, grants=view))


def binder_for(api: ClaimApi, cluster: Cluster) -> Binder:
    t = DraTracker(SETTINGS, lambda _keys: None)
    t.on_slice("ADDED", slice_for(plan_inventory("gpu-1", 2), SETTINGS), None)
    binder = Binder(
        api,  # type: ignore[arg-type]
        BinderSettings(bind_workers=2),
        ControllerMetrics(),
        EventRecorder(api, "gpuplace"),  # type: ignore[arg-type]
        lambda: cluster,
        dra=t,
        sender=lambda: InlineSender(api),
    )
    binder.trust = TrustView.of(new_ring(b"k" * 32, "2026-01-01T00:00:00Z"))
    t._wake = binder.wake
    return binder


@pytest.mark.parametrize("granted", [(0,), (0, 1)], ids=["refused", "granted"])
def test_the_binder_writes_no_allocation_the_gate_refuses(granted: tuple[int, ...]) -> None:
    """The compiled slot does not know this policy (it came after): the claim's gate alone
    stands between the pod and GPU 1 of gpu-1."""
    policy = PlacementPolicy((Grant(("ml",), ("gpu-1",), devices=granted),))
    view = resolve(policy, False, {"gpu-1": {}, "gpu-2": {}})
    api = ClaimApi()
    binder = binder_for(api, granted_cluster(view))
    body = api.add(ml_claim())
    body["metadata"]["finalizers"] = [DELETE_PROTECTION]
    api.add(body)
    assert binder.dra is not None
    binder.dra.on_claim("ADDED", body, None)
    decide_once(binder, dra_pod(body["metadata"]["name"]))
    binder.side.shutdown(wait=True)
    if granted == (0, 1):
        assert api.kinds() == ["status", "binding"]
        return
    assert api.kinds() == ["pod status", "event"]  # no claim status, no Binding
    assert binder.cache.holding("u1") is None
    condition = api.writes[0][1]["status"]["conditions"][0]
    assert condition["reason"] == Reason.NOT_GRANTED
    event = api.writes[1][1]
    assert event["reason"] == Reason.NOT_GRANTED
    assert "may not use GPU(s) 1" in event["message"] and "gpu-1" in event["message"]
