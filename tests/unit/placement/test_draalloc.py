"""placement.draalloc: the allocation decision of dra enforcement, a pure function of the pod, its
placement, the slot cache and what the watches hold (no tracker, no informer)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

import pytest

from placement.annotations import BindingDecision
from placement.binding import Code, Placement, Status
from placement.devices import GpuId
from placement.dra import ClaimState, DraDevice
from placement.draalloc import (
    ClaimKey,
    ClaimPlan,
    DeviceId,
    DraView,
    device_taints,
    held_twice,
    plan_claim,
)
from placement.grants import Grant, GrantView, PlacementPolicy, resolve
from placement.reasons import Reason
from placement.taints import DeviceTaint, TaintRule, Toleration, TolerationOperator
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey
from placement.wake import WakeKey

DRIVER = "gpu.nvidia.com"
NODE = NodeName("gpu-a-01")
KEY = MapKey("ml", "llm")
CLAIM = "web-0-gpuplace-gpus-x"
TAINT = DeviceTaint("maintenance", "true", "NoSchedule")


@dataclass(frozen=True)
class FakePod:
    uid: str = "u1"
    namespace: str = "ml"
    entry: bool = True  # spec.resourceClaims has gpuplace's entry
    claim_name: str | None = CLAIM

    def has_claim(self, name: str) -> bool:
        return self.entry and name == "gpuplace-gpus"

    def generated_claim(self, name: str) -> str | None:
        return self.claim_name if name == "gpuplace-gpus" else None


@dataclass(frozen=True)
class Holds:
    pod: str
    slot: SlotKey = field(default_factory=lambda: SlotKey(KEY, 1))


class Slots:
    """A SlotView in which given pods share given GPUs; each holder is a pod of namespace ml
    unless `namespaces` says otherwise."""

    def __init__(
        self,
        holders: Mapping[str, Mapping[str, Sharing]] | None = None,
        namespaces: Mapping[str, str] | None = None,
    ) -> None:
        self.holders = holders or {}
        self.namespaces = namespaces or {}

    def gpu_holders(self, node: NodeName, gpu: str) -> Mapping[str, Sharing]:
        return self.holders.get(gpu, {})

    def holding(self, uid: str) -> Holds | None:
        if not any(uid in users for users in self.holders.values()):
            return None
        return Holds(f"{self.namespaces.get(uid, 'ml')}/pod-{uid}")


def device(i: int, *taints: DeviceTaint) -> DraDevice:
    return DraDevice(NODE, NODE, f"gpu-{i}", GpuUuid(f"GPU-{i}"), taints)


def claim(
    name: str = CLAIM, owner: str | None = "u1", devices: tuple[int, ...] = (), **kw: object
) -> ClaimState:
    state = ClaimState(
        namespace="ml",
        name=name,
        uid=f"claim-{name}",
        resource_version="7",
        owner_uid=owner,
        finalizers=(),
        allocated=tuple((DRIVER, NODE, f"gpu-{i}") for i in devices),
        node=NODE if devices else None,
        reserved_for=(),
        deleting=False,
    )
    return replace(state, **kw)  # type: ignore[arg-type]


@dataclass
class State:
    devices: list[DraDevice] = field(default_factory=lambda: [device(i) for i in range(4)])
    claims: list[ClaimState] = field(default_factory=lambda: [claim()])
    rules: dict[str, TaintRule] = field(default_factory=dict)

    def view(self) -> DraView:
        allocated: dict[DeviceId, Collection[ClaimKey]] = {}
        for c in self.claims:
            for device_id in c.allocated:
                allocated[device_id] = {*allocated.get(device_id, ()), c.key}
        return DraView(
            DRIVER,
            {NODE: {d.uuid: d for d in self.devices}},
            {c.key: c for c in self.claims},
            allocated,
            self.rules,
        )


def placement(*gpus: int) -> Placement:
    uuids = tuple(GpuUuid(f"GPU-{i}") for i in gpus)
    decision = BindingDecision(KEY, 0, NODE, uuids, ",".join(map(str, gpus)), 1)
    return Placement(SlotKey(KEY, 0), decision, Sharing.EXCLUSIVE, tuple(map(GpuId.of_uuid, uuids)))


def test_the_pods_claim_gets_the_declared_devices() -> None:
    plan = plan_claim(FakePod(), placement(1, 3), Slots(), State().view())
    assert isinstance(plan, ClaimPlan)
    assert [d.name for d in plan.devices] == ["gpu-1", "gpu-3"]
    assert (plan.node, plan.claim.name, plan.done, plan.tolerations) == (NODE, CLAIM, False, ())


def test_a_claim_allocated_so_and_reserved_for_the_pod_is_done() -> None:
    done = claim(devices=(1, 3), reserved_for=("u1",))
    plan = plan_claim(FakePod(), placement(1, 3), Slots(), State(claims=[done]).view())
    assert isinstance(plan, ClaimPlan) and plan.done
    # The same claim for other devices (the map changed): reallocated, not done.
    other = plan_claim(FakePod(), placement(1, 2), Slots(), State(claims=[done]).view())
    assert isinstance(other, ClaimPlan) and not other.done
    unreserved = claim(devices=(1, 3))
    plan = plan_claim(FakePod(), placement(1, 3), Slots(), State(claims=[unreserved]).view())
    assert isinstance(plan, ClaimPlan) and not plan.done


BUSY = claim("other", owner="u2", devices=(3,))


@pytest.mark.parametrize(
    ("pod", "state", "code", "reason", "wakes"),
    [
        (FakePod(), State(devices=[device(1)]), Code.UNSCHEDULABLE, Reason.DEVICE_MISSING,
         {WakeKey.inventory(NODE), WakeKey.model()}),
        (FakePod(), State(devices=[device(1), device(3, TAINT)]), Code.UNSCHEDULABLE,
         Reason.DEVICE_TAINTED, {WakeKey.inventory(NODE), WakeKey.model()}),
        (FakePod(entry=False), State(), Code.UNRESOLVABLE, Reason.CLAIM_MISSING,
         {WakeKey.pod("u1")}),
        (FakePod(claim_name=None), State(), Code.UNSCHEDULABLE, Reason.CLAIM_PENDING,
         {WakeKey.claim("u1"), WakeKey.pod("u1")}),
        (FakePod(), State(claims=[]), Code.UNSCHEDULABLE, Reason.CLAIM_PENDING,
         {WakeKey.claim("u1"), WakeKey.pod("u1")}),
        (FakePod(), State(claims=[claim(owner="u9")]), Code.UNRESOLVABLE, Reason.CLAIM_CONFLICT,
         {WakeKey.pod("u1")}),
        (FakePod(), State(claims=[claim(deleting=True)]), Code.UNSCHEDULABLE,
         Reason.CLAIM_PENDING, {WakeKey.claim("u1")}),
        (FakePod(), State(claims=[claim(), BUSY]), Code.UNSCHEDULABLE, Reason.DEVICE_BUSY,
         {WakeKey.gpu(NODE, "GPU-3")}),
    ],
    ids=["not-published", "tainted", "no-entry", "not-generated", "not-cached", "foreign",
         "deleting", "busy"],
)  # fmt: skip
def test_why_the_claim_waits_or_cannot_be_allocated(
    pod: FakePod, state: State, code: Code, reason: Reason, wakes: set[WakeKey]
) -> None:
    status = plan_claim(pod, placement(1, 3), Slots(), state.view())
    assert isinstance(status, Status), status
    assert (status.code, status.reason, set(status.waits_for)) == (code, reason, wakes)
    assert status.message.startswith(f"map {KEY} index 0: ")


def test_a_placement_without_device_uuids_waits_for_the_inventory() -> None:
    status = plan_claim(FakePod(), placement(), Slots(), State().view())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_MISSING
    assert "UUIDs of its devices" in status.message


def test_a_gpu_shared_with_a_pod_the_slot_cache_allows_is_not_busy() -> None:
    state = State(claims=[claim(), BUSY])
    shared = Slots({"GPU-3": {"u2": Sharing.SHARED}})
    assert isinstance(plan_claim(FakePod(), placement(1, 3), shared, state.view()), ClaimPlan)
    # The pod's own earlier allocation does not make its devices busy.
    own = State(claims=[claim(devices=(3,))])
    assert isinstance(plan_claim(FakePod(), placement(1, 3), Slots(), own.view()), ClaimPlan)


def test_a_tolerated_taint_serves_and_the_tolerations_go_into_the_plan() -> None:
    state = State(devices=[device(1), device(3, TAINT)])
    tolerations = (Toleration("maintenance", TolerationOperator.EXISTS),)
    plan = plan_claim(FakePod(), placement(1, 3), Slots(), state.view(), tolerations)
    assert isinstance(plan, ClaimPlan) and plan.tolerations == tolerations
    informs = DeviceTaint("note", "", "None")
    quiet = State(devices=[device(1), device(3, informs)])
    assert isinstance(plan_claim(FakePod(), placement(1, 3), Slots(), quiet.view()), ClaimPlan)


def test_device_taint_rules_taint_the_devices_they_select_naming_themselves_in_order() -> None:
    cordon = DeviceTaint("cordon", "", "NoSchedule")
    rules = {
        "b-drain": TaintRule("b-drain", TAINT, driver=DRIVER, device="gpu-3"),
        "c-other-driver": TaintRule("c-other-driver", TAINT, driver="other.example.com"),
        "a-pool": TaintRule("a-pool", cordon, pool=NODE, device="gpu-3"),
    }
    tainted = device(3, DeviceTaint("xid", "79", "NoExecute"))
    assert device_taints(tainted, rules, DRIVER) == [
        (DeviceTaint("xid", "79", "NoExecute"), "in its ResourceSlice"),
        (cordon, "by DeviceTaintRule a-pool"),
        (TAINT, "by DeviceTaintRule b-drain"),
    ]
    assert device_taints(device(1), rules, DRIVER) == []
    status = plan_claim(FakePod(), placement(1, 3), Slots(), State(rules=rules).view())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_TAINTED
    assert status.message.endswith(
        "tainted cordon:NoSchedule (by DeviceTaintRule a-pool), maintenance=true:NoSchedule "
        "(by DeviceTaintRule b-drain); the slot's tolerations do not tolerate it"
    )


def gate(*tenant_nodes: NodeName) -> GrantView:
    """The pods' namespace granted NODE whole; a tenant granted `tenant_nodes` (or another node)."""
    elsewhere = NodeName("gpu-b-01")
    tenant = Grant(("tenant",), tenant_nodes or (elsewhere,))
    policy = PlacementPolicy((Grant(("ml",), (NODE,)), tenant))
    return resolve(policy, False, {NODE: {}, elsewhere: {}})


def test_the_gate_refuses_an_allocation_outside_the_namespaces_grants() -> None:
    tenant = FakePod(namespace="tenant")
    status = plan_claim(tenant, placement(1, 3), Slots(), State().view(), (), gate())
    assert isinstance(status, Status), status
    assert (status.code, status.reason) == (Code.UNRESOLVABLE, Reason.NOT_GRANTED)
    assert status.message.startswith(f"map {KEY} index 0: ResourceClaim allocation refused: ")
    assert status.waits_for == {WakeKey.model()}
    granted = plan_claim(FakePod(), placement(1, 3), Slots(), State().view(), (), gate())
    assert isinstance(granted, ClaimPlan)


@pytest.mark.parametrize("templated", [True, False], ids=["labelled-as-gpuplaces", "plain"])
@pytest.mark.parametrize("tenant_nodes", [(), (NODE,)], ids=["outside-grants", "granted"])
def test_every_allocation_holds_its_device_whoever_wrote_it(
    templated: bool, tenant_nodes: tuple[NodeName, ...]
) -> None:
    """One owner per GPU: a claim that kube-scheduler (or anyone) allocated keeps the device from
    the binder's claims, whatever its labels say and whatever the grants say of it."""
    squat = claim("squat", owner="u9", devices=(3,), namespace="tenant", templated=templated)
    state = State(claims=[claim(), squat])
    outcome = plan_claim(FakePod(), placement(1, 3), Slots(), state.view(), (), gate(*tenant_nodes))
    assert isinstance(outcome, Status) and outcome.reason == Reason.DEVICE_BUSY, outcome
    assert "ResourceClaim tenant/squat" in outcome.message


def test_a_sharer_of_another_namespace_does_not_share_by_naming_its_owner() -> None:
    """A claim whose owner reference names a pod that shares the GPU by a shared slot shares it
    only in that pod's namespace: an owner reference is written by whoever creates the claim."""
    forged = claim("forged", owner="u2", devices=(3,), namespace="tenant")
    state = State(claims=[claim(), forged])
    shared = Slots({"GPU-3": {"u2": Sharing.SHARED}})
    outcome = plan_claim(FakePod(), placement(1, 3), shared, state.view())
    assert isinstance(outcome, Status) and outcome.reason == Reason.DEVICE_BUSY, outcome
    exclusive = Slots({"GPU-3": {"u2": Sharing.EXCLUSIVE}})
    outcome = plan_claim(
        FakePod(), placement(1, 3), exclusive, State(claims=[claim(), BUSY]).view()
    )
    assert isinstance(outcome, Status) and outcome.reason == Reason.DEVICE_BUSY, outcome


def test_a_device_in_two_claims_is_found_and_sharers_count_as_one_holder() -> None:
    mine = claim(devices=(3,), reserved_for=("u1",), reserved_names=("web-0",))
    squat = claim("squat", owner=None, devices=(3, 2), namespace="tenant")
    view = State(claims=[mine, squat, BUSY]).view()
    by_id = {(DRIVER, NODE, d.name): d for d in State().devices}
    devices = list(view.allocated)
    [found] = held_twice(devices, by_id, view, Slots())
    assert (found.node, found.uuid) == (NODE, "GPU-3")
    assert [c.name for c in found.claims] == ["other", CLAIM, "squat"]
    assert found.describe().startswith(
        f"GPU GPU-3 on node {NODE} ({NODE}/gpu-3) is allocated to 3 ResourceClaims: ml/other, "
        f"ml/{CLAIM}, tenant/squat; one device, one owner"
    )
    # Two pods sharing GPU 3 by a shared slot hold it once; a third claim still makes two.
    sharing = Slots({"GPU-3": {"u1": Sharing.SHARED, "u2": Sharing.SHARED}})
    two = State(claims=[mine, BUSY]).view()
    assert held_twice(list(two.allocated), by_id, two, sharing) == []
    assert len(held_twice(devices, by_id, view, sharing)) == 1
    # One claim alone, or none, holds nothing twice.
    one = State(claims=[mine]).view()
    assert held_twice(list(one.allocated), by_id, one, Slots()) == []
