"""DRA device taints in the compiler's view of a node: the device check, the map status, spares,
`count` and MIG picks, the binder's plan, and the controller's overlay of a node's taints."""

from __future__ import annotations

from typing import Any

from controller.dra import DraTracker
from controller.inventories import InventoryTracker
from controller.slotcache import SlotCache
from placement.binding import Cluster, InventoryState, NodeState, Placement, PodFacts, Status, plan
from placement.compile import Compiler
from placement.grants import parse_policy, resolve
from placement.inventory import (
    INVENTORY_KEY,
    GpuDevice,
    MigInstance,
    NodeInventory,
    SourcedTaint,
    device_problems,
)
from placement.maps import DeclaredSlot, MigRequest, PlacementMap
from placement.model import CompiledSlot, Model
from placement.reasons import Reason
from placement.spares import serves_from_fallback
from placement.status import Phase
from placement.taints import DeviceTaint, TaintEffect, Toleration, TolerationOperator
from placement.types import GpuUuid, MapKey, NodeName
from tests.unit.controller.test_dra import NODE as DRA_NODE
from tests.unit.controller.test_dra import SETTINGS, published
from tests.unit.controller.test_dra_taints import rule

NODE = NodeName("gpu-1")
KEY = MapKey("ml", "llm")
XID = SourcedTaint(DeviceTaint("gpu.nvidia.com/xid", "79", "NoSchedule"), "in its ResourceSlice")
SHOWN_XID = "gpu.nvidia.com/xid=79:NoSchedule (in its ResourceSlice)"
TOLERATE_XID = (Toleration("gpu.nvidia.com/xid", TolerationOperator.EXISTS),)
MIG_PROFILE = "3g.40gb"


def uuid(i: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{i:012x}")


def mig_uuid(i: int) -> str:
    return f"MIG-00000002-0000-4000-8000-{i:012x}"


def gpu(i: int, *, taints: tuple[SourcedTaint, ...] = (), mig: bool = False) -> GpuDevice:
    instances = (
        tuple(MigInstance(mig_uuid(j), MIG_PROFILE, j + 1, 4 * j, 4, 40192) for j in range(2))
        if mig
        else ()
    )
    return GpuDevice(
        i,
        uuid(i),
        "NVIDIA H100 80GB HBM3",
        81559,
        f"0000:{i + 16:02x}:00.0",
        mig_mode=mig,
        mig_instances=instances,
        taints=taints,
    )


def inventory(tainted: tuple[int, ...] = (), n: int = 4) -> NodeInventory:
    return NodeInventory(
        NODE, tuple(gpu(i, taints=(XID,) if i in tainted else ()) for i in range(n))
    )


def compile_map(
    inv: NodeInventory, *slots: DeclaredSlot, compiler: Compiler | None = None
) -> tuple[Compiler, Model]:
    c = compiler or Compiler()
    c.set_node(NODE, {})
    c.set_inventory(inv)
    c.set_map(PlacementMap(KEY, slots))
    model, _ = c.build()
    return c, model


def slot_of(model: Model, index: int = 0) -> CompiledSlot:
    found = model.slot(KEY, index)
    assert found is not None
    return found


# -- the device check ----------------------------------------------------------------------------
def test_an_untolerated_blocking_taint_is_a_device_problem_naming_the_taint() -> None:
    device = gpu(0, taints=(XID,))
    assert device_problems(device, None, "0") == [
        (
            Reason.DEVICE_TAINTED,
            f"device 0 is tainted {SHOWN_XID}; the slot's tolerations do not tolerate it",
        )
    ]
    assert device_problems(device, None, "0", tolerations=TOLERATE_XID) == []
    other = (Toleration("other", TolerationOperator.EXISTS),)
    assert [r for r, _ in device_problems(device, None, "0", tolerations=other)] == [
        Reason.DEVICE_TAINTED
    ]


def test_an_informing_taint_is_no_problem_and_a_mig_slot_ignores_its_parents_taints() -> None:
    informs = SourcedTaint(DeviceTaint("health", "degraded", TaintEffect.NONE), "in its slice")
    assert device_problems(gpu(0, taints=(informs,)), None, "0") == []
    assert device_problems(gpu(0, taints=(XID,), mig=True), None, "0", whole=False) == []


def test_taints_are_overlaid_by_uuid_and_never_written_to_the_inventory_json() -> None:
    bare = NodeInventory(NODE, (gpu(0), gpu(1, mig=True)))
    tainted = bare.with_taints({uuid(0): (XID,), mig_uuid(1): (XID,)})
    assert tainted.by_index[0].taints == (XID,) and tainted.by_index[1].taints == ()
    assert tainted.mig_by_uuid[mig_uuid(1)].taints == (XID,)
    assert tainted.mig_by_uuid[mig_uuid(0)].taints == ()
    assert tainted != bare and tainted.with_taints({}) == bare
    assert bare.with_taints({}) is bare
    assert NodeInventory.from_json(tainted.to_json()) == bare


# -- compile: the map status, spares, picks ------------------------------------------------------
def test_a_tainted_declared_device_makes_the_map_degraded_naming_the_taint() -> None:
    c, model = compile_map(inventory(tainted=(1,)), DeclaredSlot(0, NODE, (0, 1)))
    report = c.reports[KEY]
    assert report.phase is Phase.DEGRADED
    assert report.message == (
        f"index 0 on node {NODE}: device 1 is tainted {SHOWN_XID}; the slot's tolerations do "
        "not tolerate it"
    )
    # As an unhealthy device: the slot keeps its devices, the binder decides at bind time.
    assert slot_of(model).devices == (uuid(0), uuid(1))


def test_a_tolerated_taint_serves_and_the_map_is_valid() -> None:
    slot = DeclaredSlot(0, NODE, (0, 1), tolerations=TOLERATE_XID)
    c, model = compile_map(inventory(tainted=(1,)), slot)
    assert c.reports[KEY].phase is Phase.VALID
    assert model.maps[KEY].tolerations[0] == TOLERATE_XID


def test_a_spare_stands_in_for_a_tainted_device_and_a_tainted_spare_is_skipped() -> None:
    slot = DeclaredSlot(0, NODE, (0, 1), fallback=(2, 3))
    c, model = compile_map(inventory(tainted=(1, 2)), slot)
    served = slot_of(model)
    assert served.devices == (uuid(0), uuid(3)) and serves_from_fallback(served)
    assert served.message == (
        f"serving from fallback: device 1 tainted {SHOWN_XID}: fallback device 3 ({uuid(3)}) "
        "stands in"
    )
    assert c.reports[KEY].phase is Phase.DEGRADED
    assert "device 1 tainted gpu.nvidia.com/xid=79:NoSchedule" in c.reports[KEY].message


def test_the_declared_device_serves_again_once_its_taint_is_gone() -> None:
    slot = DeclaredSlot(0, NODE, (0, 1), fallback=(3,))
    c, model = compile_map(inventory(tainted=(1,)), slot)
    assert slot_of(model).devices == (uuid(0), uuid(3))
    c.set_inventory(inventory())
    model, reports = c.build()
    assert slot_of(model).devices == (uuid(0), uuid(1)) and not serves_from_fallback(slot_of(model))
    assert reports[KEY].phase is Phase.VALID


def test_a_count_pick_avoids_tainted_devices_and_moves_off_one_tainted_later() -> None:
    c, model = compile_map(inventory(tainted=(0,)), DeclaredSlot(0, NODE, count=1))
    assert slot_of(model).devices == (uuid(1),)
    c.set_inventory(inventory(tainted=(1,)))
    model, _ = c.build()
    assert slot_of(model).devices == (uuid(0),)


def test_a_mig_slot_prefers_an_untainted_instance_and_reports_a_tainted_one() -> None:
    bare = NodeInventory(NODE, (gpu(0, mig=True),))
    mig = DeclaredSlot(0, NODE, mig=MigRequest(0, MIG_PROFILE))
    c, model = compile_map(bare.with_taints({mig_uuid(0): (XID,)}), mig)
    assert slot_of(model).devices == (GpuUuid(mig_uuid(1)),)
    assert c.reports[KEY].phase is Phase.VALID
    both = {mig_uuid(0): (XID,), mig_uuid(1): (XID,)}
    c, model = compile_map(bare.with_taints(both), mig)
    assert slot_of(model).devices == (GpuUuid(mig_uuid(0)),)
    assert c.reports[KEY].phase is Phase.DEGRADED
    assert f"MIG {mig_uuid(0)} is tainted {SHOWN_XID}" in c.reports[KEY].message


# -- the binder's plan ---------------------------------------------------------------------------
def test_the_binders_plan_waits_on_an_untolerated_taint_and_serves_a_tolerated_one() -> None:
    clean = inventory()
    tainted = inventory(tainted=(1,))

    def plan_with(slot: DeclaredSlot) -> Placement | Status:
        # The model compiled while the device was clean; the taint arrived since.
        compiler = Compiler()
        compiler.set_node(NODE, {})
        compiler.set_inventory(clean)
        compiler.set_map(PlacementMap(KEY, (slot,)))
        model, _ = compiler.build()
        cluster = Cluster(model, {NODE: NodeState(NODE)}, {}, {NODE: InventoryState(tainted)}, True)
        pod = PodFacts("ml", "web-0", "uid-0", {}, "StatefulSet", "llm", None)
        return plan(pod, cluster, SlotCache())

    waits = plan_with(DeclaredSlot(0, NODE, (0, 1)))
    assert isinstance(waits, Status) and waits.reason is Reason.DEVICE_TAINTED
    assert SHOWN_XID in waits.message
    served = plan_with(DeclaredSlot(0, NODE, (0, 1), tolerations=TOLERATE_XID))
    assert isinstance(served, Placement)


# -- the controller's source of taints -----------------------------------------------------------
def test_the_tracker_reports_nodes_whose_taints_change_with_their_sources() -> None:
    told: list[NodeName] = []
    t = DraTracker(SETTINGS, lambda _keys: None, on_taints=told.append)
    body = published()
    t.on_slice("ADDED", body, None)
    assert told == [] and t.taints_on(DRA_NODE) == {}
    t.on_slice("MODIFIED", body, None)  # republished unchanged
    assert told == []
    tainted: dict[str, Any] = published()
    tainted["spec"]["devices"][1]["taints"] = [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    ]
    t.on_slice("MODIFIED", tainted, None)
    assert told == [DRA_NODE]
    gpu1 = f"GPU-{DRA_NODE}-1"
    assert t.taints_on(DRA_NODE) == {gpu1: (XID,)}
    t.on_taint_rule("ADDED", rule("drain-gpu-1", "gpu-1"), None)
    assert told == [DRA_NODE, DRA_NODE]
    maintenance = SourcedTaint(
        DeviceTaint("example.com/maintenance", "now", "NoExecute"), "by DeviceTaintRule drain-gpu-1"
    )
    assert t.taints_on(DRA_NODE) == {gpu1: (XID, maintenance)}
    t.on_taint_rule("ADDED", rule("elsewhere", "gpu-9"), None)  # selects no published device
    assert told == [DRA_NODE, DRA_NODE]


def agent_report(inv: NodeInventory) -> dict[str, Any]:
    return {
        "metadata": {"name": inv.node, "namespace": "gpuplace-inventory"},
        "data": {INVENTORY_KEY: inv.to_json()},
    }


def test_the_inventory_served_carries_its_nodes_taints_and_changes_with_them() -> None:
    served: list[NodeInventory | None] = []
    taints: dict[str, tuple[SourcedTaint, ...]] = {}
    tracker = InventoryTracker(lambda _node, inv: served.append(inv), lambda _node: taints)
    tracker.retaint(NODE)  # no agent inventory: nothing to serve, as before
    assert served == [] and NODE not in tracker.states
    tracker.on_configmap("ADDED", agent_report(inventory()), None)
    lease = {
        "metadata": {"name": NODE, "namespace": "gpuplace-inventory"},
        "spec": {"renewTime": "t1", "leaseDurationSeconds": 3600},
    }
    tracker.on_lease("ADDED", lease, None)
    assert served[-1] == inventory()
    taints[uuid(1)] = (XID,)
    tracker.retaint(NODE)
    # The compiler (on_change) and the binder (states) see the same tainted inventory.
    assert served[-1] == inventory(tainted=(1,)) == tracker.states[NODE].inventory
    count = len(served)
    tracker.retaint(NODE)  # nothing new
    tracker.check_expiry()
    assert len(served) == count
    tracker.on_configmap("MODIFIED", agent_report(inventory(n=3)), None)
    assert served[-1] == inventory(tainted=(1,), n=3)  # a new report keeps the taints
    assert tracker.inventories()[NODE] == inventory(n=3)  # the agent's own, untainted
    tracker.on_configmap("DELETED", agent_report(inventory(n=3)), None)
    assert served[-1] is None and NODE not in tracker.states


# -- tolerating is a grant -----------------------------------------------------------------------
#: Grants namespace ml node gpu-1, and no taint there.
NO_TAINTS = resolve(
    parse_policy(
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: p}\n"
        "spec:\n  grants:\n    - {namespaces: [ml], nodes: [gpu-1]}\n",
        "policy.yaml",
    ),
    False,
    {NODE: {}},
)
EVERY_TAINT = (Toleration("", TolerationOperator.EXISTS),)


def test_the_compiler_ignores_an_ungranted_toleration_in_every_device_choice() -> None:
    compiler = Compiler()
    compiler.set_grants(NO_TAINTS)
    declared = DeclaredSlot(0, NODE, (0, 1), tolerations=EVERY_TAINT)
    c, model = compile_map(inventory(tainted=(1,)), declared, compiler=compiler)
    assert c.reports[KEY].phase is Phase.DEGRADED
    assert "device 1 is tainted gpu.nvidia.com/xid" in c.reports[KEY].message
    assert model.maps[KEY].tolerations == {}
    spared = DeclaredSlot(0, NODE, (0, 1), fallback=(2,), tolerations=EVERY_TAINT)
    compiler = Compiler()
    compiler.set_grants(NO_TAINTS)
    _, model = compile_map(inventory(tainted=(1,)), spared, compiler=compiler)
    assert slot_of(model).devices == (uuid(0), uuid(2))  # the spare, not the tainted GPU
    picked = DeclaredSlot(0, NODE, count=1, tolerations=EVERY_TAINT)
    compiler = Compiler()
    compiler.set_grants(NO_TAINTS)
    _, model = compile_map(inventory(tainted=(0,)), picked, compiler=compiler)
    assert slot_of(model).devices == (uuid(1),)


def test_the_binders_plan_ignores_an_ungranted_toleration_in_the_model() -> None:
    """A model compiled before the policy granted nothing still carries the toleration: the plan
    reads it through the grants the model carries now."""
    compiler = Compiler()
    compiler.set_node(NODE, {})
    compiler.set_inventory(inventory())
    compiler.set_map(PlacementMap(KEY, (DeclaredSlot(0, NODE, (0, 1), tolerations=EVERY_TAINT),)))
    model, _ = compiler.build()
    assert model.maps[KEY].tolerations == {0: EVERY_TAINT}
    pod = PodFacts("ml", "web-0", "uid-0", {}, "StatefulSet", "llm", None)
    tainted = {NODE: InventoryState(inventory(tainted=(1,)))}
    governed = Model(model.generation, model.maps, NO_TAINTS)
    waits = plan(pod, Cluster(governed, {NODE: NodeState(NODE)}, {}, tainted, True), SlotCache())
    assert isinstance(waits, Status) and waits.reason is Reason.DEVICE_TAINTED
    served = plan(pod, Cluster(model, {NODE: NodeState(NODE)}, {}, tainted, True), SlotCache())
    assert isinstance(served, Placement)
