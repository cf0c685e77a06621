"""MIG slots: a slot resolves to one MIG instance of its parent GPU (lowest placement start that no
other slot holds, kept while it exists), a whole-GPU slot and a MIG slot of one GPU conflict, the
instance's UUID reaches the container in both envModes, and the model keeps it all."""

from __future__ import annotations

from dataclasses import replace

from controller.renumber import bound_indices, renumbering
from controller.slotcache import SlotCache
from gpuplace.inspect import PodRow, mig_shown, pod_table
from kubeio.events import ObjectRef
from placement.annotations import BindingDecision, decode_binding, encode_binding
from placement.binding import Cluster, InventoryState, NodeState, Placement, PodFacts, Status, plan
from placement.compile import Compiler
from placement.grants import parse_policy, resolve, slot_refusal
from placement.inventory import GpuDevice, MigInstance, NodeInventory
from placement.maps import DeclaredSlot, MigRequest, PlacementMap
from placement.model import CompiledSlot, Model, decode_model, encode_model
from placement.reasons import Reason
from placement.status import Phase
from placement.types import DeviceRef, EnvMode, GpuUuid, MapKey, NodeName, Sharing
from tests.unit.placement.test_grants import NODES, POLICY

NODE = NodeName("gpu-1")
H100 = "NVIDIA H100 80GB HBM3"


def gpu_uuid(index: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{index:012x}")


def mig_uuid(gpu: int, start: int) -> str:
    return f"MIG-00000001-{gpu:04x}-4000-8000-{start:012x}"


def gpu(index: int, *profiles: tuple[str, int, int], mig_mode: bool = True) -> GpuDevice:
    """GPU `index` holding one instance per (profile, start, size)."""
    return GpuDevice(
        index,
        gpu_uuid(index),
        H100,
        81559,
        f"00000000:{0x18 + index * 0x10:02X}:00.0",
        mig_mode=mig_mode,
        mig_instances=tuple(
            MigInstance(mig_uuid(index, start), profile, n, start, size, size * 10240)
            for n, (profile, start, size) in enumerate(profiles)
        ),
    )


#: GPU 0: two 3g.40gb (start 4 listed first, so the order is by start, not by listing);
#: GPU 1: whole; GPU 2: one 1g.10gb.
def node_inventory(*devices: GpuDevice) -> NodeInventory:
    return NodeInventory(
        NODE,
        devices
        or (
            gpu(0, ("3g.40gb", 4, 4), ("3g.40gb", 0, 4)),
            gpu(1, mig_mode=False),
            gpu(2, ("1g.10gb", 0, 1)),
        ),
    )


def mig(index: int, parent: DeviceRef, profile: str = "3g.40gb") -> DeclaredSlot:
    return DeclaredSlot(index, "gpu-1", mig=MigRequest(parent, profile))


def whole(index: int, *refs: DeviceRef) -> DeclaredSlot:
    return DeclaredSlot(index, "gpu-1", tuple(refs))


def pmap(name: str, *slots: DeclaredSlot, env_mode: EnvMode = EnvMode.INDEX) -> PlacementMap:
    return PlacementMap(MapKey("ml", name), tuple(slots), Sharing.EXCLUSIVE, env_mode=env_mode)


def build(*maps: PlacementMap, inventory: NodeInventory | None = None) -> Compiler:
    compiler = Compiler()
    compiler.set_node(NODE, {})
    compiler.set_inventory(inventory or node_inventory())
    for m in maps:
        compiler.set_map(m)
    compiler.build()
    return compiler


def slot(model: Model, name: str, index: int = 0) -> CompiledSlot:
    found = model.slot(MapKey("ml", name), index)
    assert found is not None
    return found


def test_a_mig_slot_gets_the_instance_with_the_lowest_start_by_index_or_uuid() -> None:
    model = build(pmap("a", mig(0, 0), mig(1, gpu_uuid(2), "1g.10gb"))).model
    first = slot(model, "a")
    assert (first.devices, first.device_indices, first.blocked) == ((mig_uuid(0, 0),), (0,), "")
    assert first.mig is not None and first.mig.parent == gpu_uuid(0)
    assert slot(model, "a", 1).devices == (mig_uuid(2, 0),)


def test_two_slots_of_one_profile_on_one_gpu_get_different_instances() -> None:
    compiler = build(pmap("a", mig(0, 0)), pmap("b", mig(0, 0)))
    model, reports = compiler.model, compiler.reports
    assert slot(model, "a").devices == (mig_uuid(0, 0),)
    assert slot(model, "b").devices == (mig_uuid(0, 4),)
    assert {r.phase for r in reports.values()} == {Phase.VALID}


def test_a_third_slot_finds_every_instance_taken() -> None:
    model = build(pmap("a", mig(0, 0), mig(1, 0), mig(2, 0))).model
    third = slot(model, "a", 2)
    assert third.blocked is Reason.DEVICE_MISSING
    assert "no free 3g.40gb instance on GPU 0 (all 2 taken by other slots)" in third.message


def test_a_missing_instance_or_a_gpu_without_mig_mode_blocks_the_slot() -> None:
    model = build(pmap("a", mig(0, 0, "1g.10gb"), mig(1, 1), mig(2, 7))).model
    assert slot(model, "a").blocked is Reason.DEVICE_MISSING
    assert "no free 1g.10gb instance on GPU 0 (none exist)" in slot(model, "a").message
    assert "GPU 1 is not in MIG mode" in slot(model, "a", 1).message
    assert "GPU 7 not found" in slot(model, "a", 2).message


def test_a_profile_the_parent_product_does_not_offer_is_a_requirement_mismatch() -> None:
    blocked = slot(build(pmap("a", mig(0, 0, "3g.71gb"))).model, "a")
    assert blocked.blocked is Reason.REQUIREMENT_MISMATCH
    assert "NVIDIA H100 80GB HBM3 has no MIG profile 3g.71gb" in blocked.message


def test_a_kept_instance_stays_when_a_newcomer_would_sort_first() -> None:
    compiler = build(pmap("b", mig(0, 0)))
    assert slot(compiler.model, "b").devices == (mig_uuid(0, 0),)
    compiler.set_map(pmap("a", mig(0, 0)))  # sorts before b, compiled in the same build
    compiler.set_map(pmap("b", mig(0, 0), whole(1, 1)))
    model, _ = compiler.build()
    assert slot(model, "b").devices == (mig_uuid(0, 0),)
    assert slot(model, "a").devices == (mig_uuid(0, 4),)


def test_a_whole_gpu_slot_and_a_mig_slot_of_one_gpu_conflict_and_the_incumbent_keeps_it() -> None:
    compiler = build(pmap("a", mig(0, 0)), pmap("c", mig(0, 0)))
    compiler.set_map(pmap("b", whole(0, 0)))
    model, reports = compiler.build()
    loser = slot(model, "b")
    assert loser.blocked is Reason.SLOT_CONFLICT
    assert "ml/a[0]" in loser.message and "ml/c[0]" in loser.message
    # Both MIG slots hold the parent together: neither loses it to the other.
    assert (slot(model, "a").blocked, slot(model, "c").blocked) == ("", "")
    assert reports[MapKey("ml", "b")].phase is Phase.CONFLICT


def test_a_count_pick_never_takes_a_gpu_in_mig_mode() -> None:
    compiler = Compiler()
    compiler.set_node(NODE, {})
    compiler.set_inventory(node_inventory())
    compiler.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=1),)))
    model, _ = compiler.build()
    assert slot(model, "a").devices == (gpu_uuid(1),)


def test_the_instance_uuid_reaches_the_container_in_both_env_modes() -> None:
    for env_mode in EnvMode:
        model = build(pmap("a", mig(0, 0), env_mode=env_mode)).model
        compiled = slot(model, "a")
        assert compiled.cuda_visible_devices(env_mode) == mig_uuid(0, 0)


def test_the_model_round_trips_a_mig_slot() -> None:
    model = build(pmap("a", mig(0, gpu_uuid(0)), whole(1, 1), mig(2, 0, "1g.10gb"))).model
    back = decode_model(encode_model(model))
    assert back.maps[MapKey("ml", "a")].slots == model.maps[MapKey("ml", "a")].slots
    assert slot(back, "a").mig == slot(model, "a").mig
    assert slot(back, "a", 1).mig is None
    assert slot(back, "a", 2).blocked is Reason.DEVICE_MISSING


def test_an_index_slot_keeps_the_uuid_it_resolved_to_and_renumbering_is_seen() -> None:
    model = build(pmap("a", whole(0, 1)), inventory=node_inventory(gpu(0), gpu(1))).model
    compiled = slot(decode_model(encode_model(model)), "a")
    assert (compiled.devices, compiled.device_indices) == ((gpu_uuid(1),), (1,))
    decision = BindingDecision(
        MapKey("ml", "a"),
        0,
        NODE,
        compiled.devices,
        compiled.cuda_visible_devices(EnvMode.INDEX),
        1,
    )
    back = decode_binding("ml", encode_binding(decision))
    assert back is not None and back.devices == (gpu_uuid(1),)
    bound = bound_indices(ObjectRef("Pod", "ml", "a-0", "u1"), NODE, back)
    assert bound is not None
    # After a reboot the GPU the pod holds is index 0: the binding's UUID says so.
    swapped = NodeInventory(NODE, (replace(gpu(1), index=0), replace(gpu(0), index=1)))
    found = renumbering(bound, swapped)
    assert found is not None and f"index 1 was {gpu_uuid(1)} (now index 0)" in found


def test_a_mig_binding_is_not_watched_for_renumbering() -> None:
    compiled = slot(build(pmap("a", mig(0, 0))).model, "a")
    decision = BindingDecision(
        MapKey("ml", "a"),
        0,
        NODE,
        compiled.devices,
        compiled.cuda_visible_devices(EnvMode.INDEX),
        1,
    )
    assert bound_indices(ObjectRef("Pod", "ml", "a-0", "u1"), NODE, decision) is None


# -- the binder's decision ----------------------------------------------------------------------
def plan_pod(
    model: Model, inventory: NodeInventory, cache: SlotCache | None = None, name: str = "a"
) -> Placement | Status:
    cluster = Cluster(model, {NODE: NodeState(NODE)}, {}, {NODE: InventoryState(inventory)}, True)
    facts = PodFacts("ml", f"{name}-0", f"uid-{name}-0", {}, "StatefulSet", name, None)
    return plan(facts, cluster, cache or SlotCache())


def test_a_whole_gpu_slot_on_a_gpu_in_mig_mode_is_refused_everywhere() -> None:
    compiler = build(pmap("w", whole(0, 0)))
    (problem,) = compiler.reports[MapKey("ml", "w")].problems
    assert "device 0 is in MIG mode: a slot of whole GPUs cannot use it" in problem
    # Compiled while the GPU was whole; MIG was enabled on it since.
    model = build(pmap("w", whole(0, 1))).model
    enabled = node_inventory(gpu(0), gpu(1, ("3g.40gb", 0, 4)))
    result = plan_pod(model, enabled, name="w")
    assert isinstance(result, Status) and result.reason == "RequirementMismatch"
    assert "is in MIG mode" in result.message


def test_a_mig_slot_waits_while_a_pod_still_uses_its_parent_gpu_whole() -> None:
    inventory = node_inventory(gpu(0, mig_mode=False), gpu(1, mig_mode=False))
    before = plan_pod(build(pmap("w", whole(0, 0)), inventory=inventory).model, inventory, name="w")
    assert isinstance(before, Placement)
    cache = SlotCache()
    cache.assume("uid-w-0", "ml/w-0", before)
    # The GPU is split into MIG devices and the map now names one; the whole-GPU pod still runs.
    model = build(pmap("a", mig(0, 0))).model
    result = plan_pod(model, node_inventory(), cache)
    assert isinstance(result, Status) and result.reason == "DeviceBusy"
    assert "still used whole by" in result.message and "ml/w-0" in result.message
    cache.forget("uid-w-0")
    assert isinstance(plan_pod(model, node_inventory(), cache), Placement)


def test_the_binder_binds_a_mig_slot_to_the_instance_uuid() -> None:
    model = build(pmap("a", mig(0, 0))).model
    result = plan_pod(model, node_inventory())
    assert isinstance(result, Placement), result
    assert result.decision.devices == (GpuUuid(mig_uuid(0, 0)),)
    assert result.decision.cuda_visible_devices == mig_uuid(0, 0)


def test_the_binder_refuses_a_vanished_instance_or_an_unhealthy_parent() -> None:
    model = build(pmap("a", mig(0, 0))).model
    # The instance was destroyed after the model was written.
    gone = node_inventory(gpu(0, ("3g.40gb", 4, 4)), gpu(1, mig_mode=False))
    result = plan_pod(model, gone)
    assert isinstance(result, Status) and result.reason == "DeviceMissing"
    assert mig_uuid(0, 0) in result.message
    sick = node_inventory(
        replace(gpu(0, ("3g.40gb", 0, 4)), healthy=False, health_reason="XID 79"),
    )
    result = plan_pod(model, sick)
    assert isinstance(result, Status) and result.reason == "DeviceUnhealthy"
    assert "XID 79" in result.message


def test_explain_shows_an_instance_by_parent_and_profile() -> None:
    inventory = node_inventory()
    assert mig_shown(inventory, mig_uuid(0, 4)) == f"gpu 0 / 3g.40gb ({mig_uuid(0, 4)})"
    assert mig_shown(inventory, mig_uuid(5, 0)) == mig_uuid(5, 0)  # not in the inventory
    assert mig_shown(None, mig_uuid(0, 4)) == mig_uuid(0, 4)


def test_the_pod_table_shows_an_instance_where_it_has_the_node_inventory() -> None:
    row = PodRow("ml", "a-0", "a", "0", NODE, mig_uuid(0, 4), mig_uuid(0, 4), "Running", "")
    assert f"gpu 0 / 3g.40gb ({mig_uuid(0, 4)})" in pod_table([row], {NODE: node_inventory()})
    assert "gpu 0 /" not in pod_table([row])


def test_a_mig_slot_is_granted_through_its_parent_gpu() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), False, NODES)  # research: GPUs 6, 7
    granted = DeclaredSlot(0, "gpu-a-01", mig=MigRequest(6, "3g.40gb"))
    outside = DeclaredSlot(0, "gpu-a-01", mig=MigRequest(5, "3g.40gb"))
    assert slot_refusal(view, "research", granted) is None
    assert "GPU(s) 5 of node gpu-a-01" in str(slot_refusal(view, "research", outside))
