"""The binder's pure decision: every reason a pod waits, and the placement it gets otherwise."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from controller.slotcache import SlotCache
from placement.annotations import INDEX_LABEL, STATEFULSET_INDEX_LABEL
from placement.binding import (
    Cluster,
    Code,
    InventoryState,
    NodeState,
    Placement,
    PodFacts,
    Status,
    plan,
)
from placement.compile import Compiler
from placement.grants import Grant, PlacementPolicy, resolve
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import Model, Provenance
from placement.types import EnvMode, GpuUuid, Indexing, MapKey, NodeName, Sharing
from placement.wake import WakeKey

KEY = MapKey("ml", "llm")


def uuid_of(node: int, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{node:08x}-0000-0000-0000-{index:012x}")


def inventory(node: str, n: int, unhealthy: tuple[int, ...] = ()) -> NodeInventory:
    number = int(node.rsplit("-", 1)[-1])
    return NodeInventory(
        NodeName(node),
        tuple(
            GpuDevice(
                i,
                uuid_of(number, i),
                "H100",
                81559,
                f"0000:{i:02x}:00.0",
                healthy=i not in unhealthy,
                health_reason="XID 79" if i in unhealthy else "",
            )
            for i in range(n)
        ),
    )


def build(
    slots: list[DeclaredSlot],
    *,
    indexing: Indexing = Indexing.AUTO,
    env_mode: EnvMode = EnvMode.INDEX,
    sharing: Sharing = Sharing.EXCLUSIVE,
    nodes: Mapping[str, NodeState] | None = None,
    inventories: Mapping[str, InventoryState] | None = None,
    require_inventory: bool = True,
) -> Cluster:
    compiler = Compiler()
    node_states = (
        nodes
        if nodes is not None
        else {f"gpu-{i}": NodeState(NodeName(f"gpu-{i}")) for i in range(1, 3)}
    )
    invs = (
        inventories
        if inventories is not None
        else {name: InventoryState(inventory(name, 4)) for name in node_states}
    )
    for name in node_states:
        compiler.set_node(NodeName(name), {})
    for state in invs.values():
        compiler.set_inventory(state.inventory)
    compiler.set_map(PlacementMap(KEY, tuple(slots), sharing, indexing, env_mode))
    model, _ = compiler.build()
    return Cluster(
        model,
        {NodeName(k): v for k, v in node_states.items()},
        {},
        {NodeName(k): v for k, v in invs.items()},
        require_inventory,
    )


def pod(
    name: str,
    uid: str = "",
    labels: dict[str, str] | None = None,
    owner: str | None = "StatefulSet",
) -> PodFacts:
    return PodFacts("ml", name, uid or f"uid-{name}", labels or {}, owner, "llm", None)


def assumed(
    cluster: Cluster, cache: SlotCache, name: str, uid: str, owner: str = "StatefulSet"
) -> Placement:
    """Plans pod `name` and records its placement in `cache`, as the binder does before binding."""
    result = plan(pod(name, uid=uid, owner=owner), cluster, cache)
    assert isinstance(result, Placement), result
    cache.assume(uid, f"ml/{name}", result)
    return result


TWO_SLOTS = [DeclaredSlot(0, "gpu-1", (0, 1)), DeclaredSlot(1, "gpu-2", (2,))]


def test_statefulset_ordinal_gets_its_declared_node_and_devices() -> None:
    result = plan(pod("web-1"), build(TWO_SLOTS), SlotCache())
    assert isinstance(result, Placement)
    assert result.decision.node == "gpu-2"
    assert result.decision.index == 1
    assert result.decision.devices == (uuid_of(2, 2),)
    assert result.decision.cuda_visible_devices == "2"


def test_uuid_env_mode_exposes_uuids() -> None:
    result = plan(pod("web-0"), build(TWO_SLOTS, env_mode=EnvMode.UUID), SlotCache())
    assert isinstance(result, Placement)
    assert result.decision.cuda_visible_devices == f"{uuid_of(1, 0)},{uuid_of(1, 1)}"


def test_pod_index_label_wins_over_name() -> None:
    result = plan(
        pod("web-0", labels={STATEFULSET_INDEX_LABEL: "1"}), build(TWO_SLOTS), SlotCache()
    )
    assert isinstance(result, Placement) and result.decision.index == 1
    result = plan(pod("web-0", labels={INDEX_LABEL: "1"}), build(TWO_SLOTS), SlotCache())
    assert isinstance(result, Placement) and result.decision.index == 1


def wait_reason(result: Placement | Status) -> str:
    assert isinstance(result, Status), result
    return result.reason


def test_slot_taken_names_the_slot() -> None:
    cluster = build(TWO_SLOTS)
    cache = SlotCache()
    assumed(cluster, cache, "web-0", "a")
    second = plan(pod("web-0", uid="b"), cluster, cache)
    assert isinstance(second, Status)
    assert second.reason == "SlotTaken"
    assert f"slot:{KEY}[0]" in second.waits_for


def test_allocate_takes_lowest_free_and_reports_no_free_slot() -> None:
    cluster = build(TWO_SLOTS, indexing=Indexing.ALLOCATE)
    cache = SlotCache()
    taken = []
    for uid in ("a", "b"):
        taken.append(assumed(cluster, cache, f"dep-{uid}", uid, "ReplicaSet").decision.index)
    assert taken == [0, 1]
    third = plan(pod("dep-c", uid="c", owner="ReplicaSet"), cluster, cache)
    assert wait_reason(third) == "NoFreeSlot"
    cache.release("a")
    again = plan(pod("dep-c", uid="c", owner="ReplicaSet"), cluster, cache)
    assert isinstance(again, Placement) and again.decision.index == 0


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        ({"gpu-2": NodeState(NodeName("gpu-2"))}, "NodeNotFound"),
        ({"gpu-1": NodeState(NodeName("gpu-1"), ready=False)}, "NodeNotReady"),
        ({"gpu-1": NodeState(NodeName("gpu-1"), schedulable=False)}, "NodeCordoned"),
    ],
)
def test_node_problems(nodes: dict[str, NodeState], reason: str) -> None:
    cluster = build(TWO_SLOTS, nodes=nodes)
    result = plan(pod("web-0"), cluster, SlotCache())
    assert wait_reason(result) == reason
    assert isinstance(result, Status) and "node:gpu-1" in result.waits_for


def test_missing_device_and_unhealthy_device() -> None:
    slots = [DeclaredSlot(0, "gpu-1", (7,))]
    result = plan(pod("web-0"), build(slots), SlotCache())
    assert wait_reason(result) == "DeviceMissing"
    assert isinstance(result, Status) and "7" in result.message and "gpu-1" in result.message
    unhealthy = {"gpu-1": InventoryState(inventory("gpu-1", 4, unhealthy=(1,)))}
    result = plan(
        pod("web-0"),
        build(TWO_SLOTS, nodes={"gpu-1": NodeState(NodeName("gpu-1"))}, inventories=unhealthy),
        SlotCache(),
    )
    assert wait_reason(result) == "DeviceUnhealthy"
    assert isinstance(result, Status) and "XID 79" in result.message


def test_inventory_missing_or_stale_blocks_unless_not_required() -> None:
    nodes = {"gpu-1": NodeState(NodeName("gpu-1"))}
    result = plan(pod("web-0"), build(TWO_SLOTS, nodes=nodes, inventories={}), SlotCache())
    assert wait_reason(result) == "InventoryMissing"
    stale = {"gpu-1": InventoryState(inventory("gpu-1", 4), fresh=False)}
    result = plan(pod("web-0"), build(TWO_SLOTS, nodes=nodes, inventories=stale), SlotCache())
    assert wait_reason(result) == "InventoryStale"
    relaxed = build(TWO_SLOTS, nodes=nodes, inventories={}, require_inventory=False)
    placed = plan(pod("web-0"), relaxed, SlotCache())
    assert isinstance(placed, Placement)
    assert placed.decision.cuda_visible_devices == "0,1"
    assert placed.gpus == ("#0", "#1")


def test_unknown_map_and_index_outside_map() -> None:
    cluster = build(TWO_SLOTS)
    other = PodFacts("ml", "x-0", "u", {}, "StatefulSet", "nope", None)
    assert wait_reason(plan(other, cluster, SlotCache())) == "MapNotFound"
    assert wait_reason(plan(pod("web-5"), cluster, SlotCache())) == "IndexNotInMap"


def test_invalid_index_label_is_unresolvable() -> None:
    result = plan(pod("web-0", labels={INDEX_LABEL: "abc"}), build(TWO_SLOTS), SlotCache())
    assert isinstance(result, Status)
    assert result.code is Code.UNRESOLVABLE and result.reason == "IndexInvalid"


def test_gpu_held_by_an_old_pod_is_busy_until_released() -> None:
    cluster = build(TWO_SLOTS)
    cache = SlotCache()
    assumed(cluster, cache, "web-0", "a")
    moved = build([DeclaredSlot(0, "gpu-1", (2,)), DeclaredSlot(1, "gpu-1", (1,))])
    busy = plan(pod("web-1", uid="b"), moved, cache)
    assert wait_reason(busy) == "DeviceBusy"
    cache.release("a")
    assert isinstance(plan(pod("web-1", uid="b"), moved, cache), Placement)


def test_shared_maps_may_share_gpus() -> None:
    slots = [DeclaredSlot(0, "gpu-1", (0,)), DeclaredSlot(1, "gpu-1", (0,))]
    cluster = build(slots, sharing=Sharing.SHARED)
    cache = SlotCache()
    for uid, name in (("a", "web-0"), ("b", "web-1")):
        assumed(cluster, cache, name, uid)


def test_legacy_pod_resolves_logical_node_by_alias() -> None:
    nodes = {
        "gpu-1": NodeState(NodeName("gpu-1"), alias="node1"),
        "gpu-2": NodeState(NodeName("gpu-2"), alias="node2"),
    }
    cluster = build(TWO_SLOTS, nodes=nodes)
    cluster = Cluster(
        cluster.model,
        cluster.nodes,
        {"node1": frozenset({NodeName("gpu-1")}), "node2": frozenset({NodeName("gpu-2")})},
        cluster.inventories,
    )
    # (GPU 3 of gpu-2: no slot of the map declares it.)
    legacy = PodFacts("ml", "webhook-test-1", "u1", {}, None, None, "0=node1:0,1\n1=node2:3\n")
    result = plan(legacy, cluster, SlotCache())
    assert isinstance(result, Placement)
    assert result.decision.node == "gpu-2"
    assert result.decision.cuda_visible_devices == "3"
    broken = PodFacts("ml", "webhook-test-1", "u2", {}, None, None, "1=node2:x\n")
    status = plan(broken, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == "MapInvalid"
    assert ":1:" in status.message


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_bare_pods_take_the_index_their_name_says_in_any_order(order: tuple[int, ...]) -> None:
    slots = [*TWO_SLOTS, DeclaredSlot(2, "gpu-1", (2, 3))]
    cluster = build(slots)
    cache = SlotCache()
    for i in order:
        result = plan(pod(f"webhook-test-{i}", owner=None), cluster, cache)
        assert isinstance(result, Placement)
        assert result.decision.index == i
        cache.assume(f"uid-{i}", f"ml/webhook-test-{i}", result)
    # A Deployment's pod named like an index is still allocated: the lowest free slot.
    deployed = plan(pod("webhook-test-2", uid="rs", owner="ReplicaSet"), build(slots), SlotCache())
    assert isinstance(deployed, Placement) and deployed.decision.index == 0


THREE_SLOTS = [
    DeclaredSlot(0, "gpu-1", (0,)),
    DeclaredSlot(1, "gpu-2", (0,)),
    DeclaredSlot(2, "gpu-2", (1,)),
]


@pytest.mark.parametrize(
    ("node_1", "unhealthy_1", "reason"),
    [
        (NodeState(NodeName("gpu-1"), schedulable=False), (), "NodeCordoned"),
        (NodeState(NodeName("gpu-1"), ready=False), (), "NodeNotReady"),
        (NodeState(NodeName("gpu-1")), (0,), "DeviceUnhealthy"),
    ],
)
def test_allocate_falls_back_to_the_lowest_servable_slot(
    node_1: NodeState, unhealthy_1: tuple[int, ...], reason: str
) -> None:
    nodes = {"gpu-1": node_1, "gpu-2": NodeState(NodeName("gpu-2"))}
    inventories = {
        "gpu-1": InventoryState(inventory("gpu-1", 4, unhealthy_1)),
        "gpu-2": InventoryState(inventory("gpu-2", 4)),
    }
    cluster = build(THREE_SLOTS, indexing=Indexing.ALLOCATE, nodes=nodes, inventories=inventories)
    cache = SlotCache()
    first = assumed(cluster, cache, "w-a", "a", "ReplicaSet")
    assert (first.decision.index, first.decision.node) == (1, "gpu-2")
    second = assumed(cluster, cache, "w-b", "b", "ReplicaSet")
    assert second.decision.index == 2
    # Only the unservable slot is left: the pod waits for what blocks it, by name.
    third = plan(pod("w-c", uid="c", owner="ReplicaSet"), cluster, cache)
    assert wait_reason(third) == reason
    assert "node:gpu-1" in third.waits_for or "inventory:gpu-1" in third.waits_for


def test_allocate_with_no_servable_slot_lists_why_and_waits_for_each() -> None:
    nodes = {
        "gpu-1": NodeState(NodeName("gpu-1"), schedulable=False),
        "gpu-2": NodeState(NodeName("gpu-2"), ready=False),
    }
    cluster = build(THREE_SLOTS, indexing=Indexing.ALLOCATE, nodes=nodes)
    result = plan(pod("w-a", owner="ReplicaSet"), cluster, SlotCache())
    assert isinstance(result, Status)
    assert result.reason == "NoServableSlot"
    assert "NodeCordoned" in result.message and "NodeNotReady" in result.message
    assert {"node:gpu-1", "node:gpu-2", f"map:{KEY}"} <= result.waits_for


def test_bindings_carry_the_provenance_of_the_map() -> None:
    compiler = Compiler()
    for name in ("gpu-1", "gpu-2"):
        compiler.set_node(NodeName(name), {})
        compiler.set_inventory(inventory(name, 4))
    compiler.set_map(
        PlacementMap(KEY, tuple(TWO_SLOTS)), "v1", Provenance("abc1234", "maps/x.yaml")
    )
    model, _ = compiler.build()
    cluster = Cluster(
        model,
        {NodeName(n): NodeState(NodeName(n)) for n in ("gpu-1", "gpu-2")},
        {},
        {NodeName(n): InventoryState(inventory(n, 4)) for n in ("gpu-1", "gpu-2")},
    )
    result = plan(pod("web-0"), cluster, SlotCache())
    assert isinstance(result, Placement)
    assert (result.decision.revision, result.decision.source_file) == ("abc1234", "maps/x.yaml")


def test_legacy_pod_outside_its_grants_is_not_granted() -> None:
    cluster = build(TWO_SLOTS)
    policy = PlacementPolicy((Grant(("ml",), ("gpu-1",)),))
    granted = Cluster(
        Model(cluster.model.generation, cluster.model.maps, resolve(policy, False, {})),
        cluster.nodes,
        cluster.aliases,
        cluster.inventories,
    )
    legacy = PodFacts("ml", "old-1", "u1", {}, None, None, "0=gpu-1:0\n1=gpu-2:2\n")
    status = plan(legacy, granted, SlotCache())
    assert isinstance(status, Status) and status.reason == "NotGranted"
    assert status.code is Code.UNRESOLVABLE and status.waits_for == {"model"}
    assert "namespace ml may not place on node gpu-2" in status.message
    first = PodFacts("ml", "old-0", "u0", {}, None, None, "0=gpu-1:3\n1=gpu-2:2\n")
    assert isinstance(plan(first, granted, SlotCache()), Placement)


def test_legacy_pod_on_an_ambiguous_logical_node_waits_and_says_where() -> None:
    """The binder reads an alias as compile does: on two nodes, it is no node, and says why."""
    twins = frozenset({NodeName("gpu-1"), NodeName("gpu-2")})
    base = build(TWO_SLOTS)
    cluster = Cluster(base.model, base.nodes, {"node1": twins}, base.inventories)
    legacy = PodFacts("ml", "webhook-test-0", "u1", {}, None, None, "0=node1:0\n")
    status = plan(legacy, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == "NodeNotFound"
    assert (
        "node 'node1' is ambiguous: label gpu-node-name=node1 is on gpu-1, gpu-2" in status.message
    )
    assert WakeKey.node("node1") in status.waits_for
