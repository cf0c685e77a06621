"""The slot cache's index of each allocate map's free slots (controller/freeslots.py): it agrees
with the holdings and the model as both change, an allocation from it picks the slot a scan of
every slot would, and a decision's work does not grow with the map's free slots."""

from __future__ import annotations

import random

from controller.slotcache import Holding, SlotCache
from placement.binding import (
    Cluster,
    InventoryState,
    NodeState,
    Placement,
    PodFacts,
    Status,
    plan,
    slot_status,
)
from placement.maps import DeclaredSlot
from placement.model import CompiledMap
from placement.types import Indexing, NodeName, Sharing, SlotKey
from placement.wake import WakeKey
from tests.unit.placement.test_binding_plan import KEY, build, inventory

NODES = 6
GPUS = 4


def node(n: int) -> str:
    return f"gpu-{n + 1}"


def allocate_map(slots: int, nodes: int = NODES, blocked: int | None = None) -> Cluster:
    """`slots` slots over `nodes` nodes of GPUS GPUs each, slot i on GPU i % GPUS; with `blocked`,
    that slot names a GPU its node lacks (it waits for the model: DeviceMissing)."""
    declared = [
        DeclaredSlot(i, node((i // GPUS) % nodes), (i % GPUS if i != blocked else 9,))
        for i in range(slots)
    ]
    states = {node(n): NodeState(NodeName(node(n))) for n in range(nodes)}
    return build(declared, indexing=Indexing.ALLOCATE, nodes=states)


def with_nodes(cluster: Cluster, states: dict[str, NodeState]) -> Cluster:
    return Cluster(
        cluster.model,
        {NodeName(k): v for k, v in states.items()},
        cluster.aliases,
        cluster.inventories,
    )


def hold(cache: SlotCache, cmap: CompiledMap, uid: str, index: int) -> None:
    slot = cmap.slots[index]
    cache.add_bound(
        Holding(
            uid, f"ml/{uid}", SlotKey(KEY, index), slot.node, slot.gpus, Sharing.EXCLUSIVE, False
        )
    )


def pending(uid: str = "pending") -> PodFacts:
    return PodFacts("ml", f"dep-{uid}", uid, {}, "ReplicaSet", KEY.name, None)


def decide(cluster: Cluster, cache: SlotCache) -> Placement | Status:
    """A decision as the binder's thread makes it: plan, then park what it found unservable."""
    outcome = plan(pending(), cluster, cache)
    cmap = cluster.model.maps[KEY]
    cache.park(cmap, outcome.unservable)
    return outcome


def lowest_servable(cluster: Cluster, cache: SlotCache) -> int | None:
    """The reference: every slot in order, the first free, unblocked and servable one."""
    cmap = cluster.model.maps[KEY]
    taken = cache.taken_indices(KEY)
    for index in cmap.sorted_indices:
        if index in taken or cmap.slots[index].blocked:
            continue
        if slot_status("pending", SlotKey(KEY, index), cluster, cache) is None:
            return index
    return None


def indexed_free(cache: SlotCache, cmap: CompiledMap) -> list[int]:
    return list(cache.next_free(cmap, -1, 10**6))


def test_the_index_follows_holdings_and_the_model() -> None:
    rng = random.Random(7)
    cluster = allocate_map(40)
    cache = SlotCache()
    held: dict[str, int] = {}
    for step in range(400):
        if step % 50 == 0:  # the model changes: slots added, removed, one blocked
            cluster = allocate_map(rng.randrange(20, 60), blocked=rng.randrange(20))
            for uid, index in list(held.items()):
                if index not in cluster.model.maps[KEY].slots:
                    cache.release(uid)
                    del held[uid]
        cmap = cluster.model.maps[KEY]
        if held and rng.random() < 0.45:
            uid = rng.choice(sorted(held))
            cache.release(uid)
            del held[uid]
        else:
            free = sorted(set(cmap.slots) - set(held.values()))
            if free:
                uid = f"p{step}"
                hold(cache, cmap, uid, rng.choice(free))
                held[uid] = cache.holding(uid).slot.index  # type: ignore[union-attr]
        expected = [
            i for i in cmap.sorted_indices if i not in held.values() and not cmap.slots[i].blocked
        ]
        assert indexed_free(cache, cmap) == expected


def test_an_allocation_picks_the_lowest_servable_slot_as_a_scan_of_every_slot_would() -> None:
    rng = random.Random(11)
    base = allocate_map(NODES * GPUS)
    cache = SlotCache()
    states = {node(n): NodeState(NodeName(node(n))) for n in range(NODES)}
    cluster = base
    placed = 0
    for step in range(300):
        roll = rng.random()
        if roll < 0.25:  # a node changes: the binder wakes its key
            n = node(rng.randrange(NODES))
            states[n] = NodeState(
                NodeName(n), ready=rng.random() < 0.8, schedulable=rng.random() < 0.7
            )
            cluster = with_nodes(base, states)
            cache.unpark([WakeKey.node(n)])
        elif roll < 0.45 and cache.holdings():
            gone = rng.choice(cache.holdings())
            cache.release(gone.uid)
            cache.unpark([WakeKey.gpu(gone.node, gpu) for gpu in gone.gpus])
        else:
            expected = lowest_servable(cluster, cache)
            outcome = decide(cluster, cache)
            if expected is None:
                assert isinstance(outcome, Status)
            else:
                assert isinstance(outcome, Placement), outcome
                assert outcome.decision.index == expected
                cache.assume(f"p{step}", f"ml/p{step}", outcome)
                placed += 1
    assert placed > 20


def test_a_decision_reads_one_slot_of_a_healthy_map_however_full() -> None:
    cluster = allocate_map(2_000, nodes=500)
    cmap = cluster.model.maps[KEY]
    cache = SlotCache()
    for i in range(1_999):
        hold(cache, cmap, f"h{i}", i)
    cache.free_slots(cmap)  # the index is built once per compiled map
    before = cache.examined
    outcome = decide(cluster, cache)
    assert isinstance(outcome, Placement) and outcome.decision.index == 1_999
    assert cache.examined - before == 1
    cache.release("h5")
    before = cache.examined
    outcome = decide(cluster, cache)
    assert isinstance(outcome, Placement) and outcome.decision.index == 5
    assert cache.examined - before == 1


def test_unservable_slots_are_checked_once_per_change_that_may_unblock_them() -> None:
    nodes = 50
    base = allocate_map(200, nodes=nodes)
    cordoned = {node(n): NodeState(NodeName(node(n)), schedulable=False) for n in range(nodes)}
    cordoned[node(nodes - 1)] = NodeState(NodeName(node(nodes - 1)))
    cluster = with_nodes(base, cordoned)
    cache = SlotCache()
    cache.free_slots(cluster.model.maps[KEY])
    before = cache.examined
    first = decide(cluster, cache)
    assert isinstance(first, Placement) and first.decision.index == 196
    assert cache.examined - before >= 197  # the first decision checks every free slot below
    before = cache.examined
    again = decide(cluster, cache)
    assert isinstance(again, Placement) and again.decision.index == 196
    assert cache.examined - before == 1  # later ones start at the lowest that may be servable
    # The node under slots 0-3 is uncordoned: its key wakes those slots, and only those.
    cordoned[node(0)] = NodeState(NodeName(node(0)))
    assert cache.unpark([WakeKey.node(node(0))]) == {KEY}
    before = cache.examined
    woken = decide(with_nodes(base, cordoned), cache)
    assert isinstance(woken, Placement) and woken.decision.index == 0
    assert cache.examined - before == 1


def test_parked_slots_still_name_why_the_map_cannot_serve_a_pod() -> None:
    base = allocate_map(8, nodes=2)
    states = {node(n): NodeState(NodeName(node(n)), ready=False) for n in range(2)}
    cluster = with_nodes(base, states)
    cache = SlotCache()
    first = decide(cluster, cache)
    again = decide(cluster, cache)
    for outcome in (first, again):
        assert isinstance(outcome, Status) and outcome.reason == "NoServableSlot"
        assert "none of its 8 free slots" in outcome.message and "NodeNotReady" in outcome.message
        assert WakeKey.map(KEY) in outcome.waits_for
        assert outcome.cohort == f"allocate:{KEY}"
    assert not again.unservable  # nothing left to check: every free slot is parked
    assert cache.unpark_all([KEY]) == {KEY}
    assert indexed_free(cache, cluster.model.maps[KEY]) == list(range(8))


def test_a_model_that_compiles_the_map_again_rebuilds_its_index() -> None:
    cluster = allocate_map(8, nodes=2)
    cache = SlotCache()
    hold(cache, cluster.model.maps[KEY], "a", 0)
    assert isinstance(decide(cluster, cache), Placement)
    bigger = allocate_map(12, nodes=3)
    cmap = bigger.model.maps[KEY]
    assert indexed_free(cache, cmap) == list(range(1, 12))
    smaller = allocate_map(4, nodes=1)
    assert indexed_free(cache, smaller.model.maps[KEY]) == [1, 2, 3]
    cache.release("a")
    assert indexed_free(cache, smaller.model.maps[KEY]) == [0, 1, 2, 3]


def test_a_single_unservable_slot_also_waits_for_its_map() -> None:
    """The only free slot is on a cordoned node: a slot of the map freed later must wake the
    pod too, not only the node's uncordon."""
    states = {
        node(0): NodeState(NodeName(node(0)), schedulable=False),
        node(1): NodeState(NodeName(node(1))),
    }
    declared = [DeclaredSlot(0, node(0), (0,)), DeclaredSlot(1, node(1), (0,))]
    cluster = build(
        declared,
        indexing=Indexing.ALLOCATE,
        nodes=states,
        inventories={n: InventoryState(inventory(n, 2)) for n in states},
    )
    cache = SlotCache()
    hold(cache, cluster.model.maps[KEY], "a", 1)
    outcome = decide(cluster, cache)
    assert isinstance(outcome, Status) and outcome.reason == "NodeCordoned"
    assert {WakeKey.node(node(0)), WakeKey.map(KEY)} <= outcome.waits_for
