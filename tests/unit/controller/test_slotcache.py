"""The slot cache under the threads that use it: the decision thread, the request loop, informers and
the status writer all at once."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from controller.slotcache import Holding, SlotCache
from placement.annotations import BindingDecision
from placement.binding import Placement
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

MAPS = [MapKey("team", f"map-{m}") for m in range(3)]
NODES = [NodeName(f"gpu-{n}") for n in range(2)]
GPUS = [GpuUuid(f"GPU-{g}") for g in range(4)]
WRITERS = 4
ROUNDS = 400


def placement(writer: int, i: int) -> Placement:
    """Each writer owns its indices (no two writers claim one slot); GPUs are shared by all."""
    key = MAPS[i % len(MAPS)]
    index = writer * ROUNDS + i
    node = NODES[i % len(NODES)]
    gpus = (GPUS[i % len(GPUS)], GPUS[(i + 1) % len(GPUS)])
    decision = BindingDecision(key, index, node, gpus, "0,1", 1)
    return Placement(SlotKey(key, index), decision, Sharing.SHARED, gpus)


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Threads switch every microsecond, so reads land in the middle of writes."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def race(writers: list[Callable[[], None]], readers: list[Callable[[], None]]) -> None:
    done = threading.Event()
    errors: list[BaseException] = []

    def guarded(work: Callable[[], None], loop: bool) -> None:
        try:
            while True:
                work()
                if not loop or done.is_set():
                    return
        except BaseException as exc:
            errors.append(exc)

    reading = [threading.Thread(target=guarded, args=(r, True)) for r in readers]
    writing = [threading.Thread(target=guarded, args=(w, False)) for w in writers]
    for thread in reading + writing:
        thread.start()
    for thread in writing:
        thread.join()
    done.set()
    for thread in reading:
        thread.join()
    assert not errors, errors


def readers(cache: SlotCache) -> list[Callable[[], None]]:
    def maps() -> None:
        for key in MAPS:
            for index, uid in cache.taken_indices(key).items():
                assert isinstance(index, int) and uid
            cache.bound_count(key)

    def gpus() -> None:
        for node in NODES:
            for gpu in GPUS:
                for uid, sharing in cache.gpu_holders(node, gpu).items():
                    assert sharing is Sharing.SHARED and uid

    def holdings() -> None:
        for held in cache.holdings():
            cache.slot_holder(held.slot)
            cache.holding(held.uid)
        len(cache)

    return [maps, gpus, holdings]


def check_consistent(cache: SlotCache) -> None:
    held = cache.holdings()
    assert len(cache) == len(held)
    for key in MAPS:
        expected = {h.slot.index: h.uid for h in held if h.slot.map == key}
        assert cache.taken_indices(key) == expected
    for node in NODES:
        for gpu in GPUS:
            expected_users = {h.uid for h in held if h.node == node and gpu in h.gpus}
            assert set(cache.gpu_holders(node, gpu)) == expected_users
    for h in held:
        assert cache.slot_holder(h.slot) == h.uid
        assert cache.holding(h.uid) == h


def test_assume_confirm_forget_race_with_readers() -> None:
    cache = SlotCache()

    def writer(w: int) -> Callable[[], None]:
        def work() -> None:
            for i in range(ROUNDS):
                uid = f"w{w}-{i}"
                cache.assume(uid, f"team/p-{uid}", placement(w, i))
                if i % 3 == 0:
                    cache.forget(uid)  # the Binding failed
                else:
                    cache.confirm(uid)  # the pod showed up bound
                if i % 3 == 1 and i >= 2:
                    cache.release(f"w{w}-{i - 2}")  # an older pod was deleted
                    cache.release(f"w{w}-{i - 2}")  # idempotent

        return work

    race([writer(w) for w in range(WRITERS)], readers(cache))
    check_consistent(cache)
    held = cache.holdings()
    assert held and all(not h.assumed for h in held)
    # Left: each writer's i % 3 == 1 (confirmed, never released) and its last i % 3 == 2.
    kept = {i for i in range(ROUNDS) if i % 3 == 1} | {ROUNDS - 2}
    assert {h.uid for h in held} == {f"w{w}-{i}" for w in range(WRITERS) for i in kept}


def test_informer_adds_race_with_decisions() -> None:
    """Bound pods arrive from informers (a rebuild) while the decision thread assumes others."""
    cache = SlotCache()

    def informer(w: int) -> Callable[[], None]:
        def work() -> None:
            for i in range(ROUNDS):
                p = placement(w, i)
                uid = f"w{w}-{i}"
                cache.add_bound(
                    Holding(uid, f"team/{uid}", p.slot, p.decision.node, p.gpus, p.sharing, False)
                )
                if i % 2:
                    cache.release(uid)

        return work

    def decisions() -> None:
        for i in range(ROUNDS):
            uid = f"d-{i}"
            cache.assume(uid, f"team/{uid}", placement(WRITERS, i))
            cache.confirm(uid)

    race([informer(w) for w in range(WRITERS)] + [decisions], readers(cache))
    check_consistent(cache)
    assert len(cache) == WRITERS * ROUNDS // 2 + ROUNDS


def test_readers_get_copies() -> None:
    cache = SlotCache()
    cache.assume("a", "team/a", placement(0, 0))
    taken = cache.taken_indices(MAPS[0])
    users = cache.gpu_holders(NODES[0], GPUS[0])
    cache.release("a")
    assert dict(taken) == {0: "a"}
    assert dict(users) == {"a": Sharing.SHARED}
    assert cache.taken_indices(MAPS[0]) == {}
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {}


# -- transitions, one at a time -------------------------------------------------------------------
def one(index: int, gpus: tuple[GpuUuid, ...], sharing: Sharing = Sharing.EXCLUSIVE) -> Placement:
    key = MAPS[0]
    decision = BindingDecision(key, index, NODES[0], gpus, "0", 1)
    return Placement(SlotKey(key, index), decision, sharing, gpus)


def test_assume_confirm_release_moves_a_holding_through_its_states() -> None:
    cache = SlotCache()
    cache.assume("a", "team/web-0", one(0, (GPUS[0],)))
    held = cache.holding("a")
    assert held is not None and held.assumed
    assert cache.slot_holder(SlotKey(MAPS[0], 0)) == "a"
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {"a": Sharing.EXCLUSIVE}
    assert cache.bound_count(MAPS[0]) == 0  # assumed, not bound yet
    cache.confirm("a")
    assert cache.bound_count(MAPS[0]) == 1
    released = cache.release("a")
    assert released is not None and not released.assumed
    assert cache.release("a") is None  # idempotent
    assert cache.slot_holder(SlotKey(MAPS[0], 0)) is None
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {}
    assert cache.taken_indices(MAPS[0]) == {} and len(cache) == 0


def test_forget_undoes_an_assumption_completely() -> None:
    cache = SlotCache()
    cache.assume("a", "team/web-0", one(0, (GPUS[0], GPUS[1])))
    cache.forget("a")
    assert cache.holding("a") is None and len(cache) == 0
    assert all(cache.gpu_holders(NODES[0], g) == {} for g in GPUS)


def test_confirm_of_an_unknown_or_bound_pod_changes_nothing() -> None:
    cache = SlotCache()
    cache.confirm("nobody")
    assert len(cache) == 0
    cache.assume("a", "team/web-0", one(0, (GPUS[0],)))
    cache.confirm("a")
    cache.confirm("a")
    held = cache.holding("a")
    assert held is not None and not held.assumed


def test_a_new_holding_of_a_pod_replaces_its_old_one() -> None:
    cache = SlotCache()
    cache.assume("a", "team/web-0", one(0, (GPUS[0],)))
    cache.assume("a", "team/web-0", one(1, (GPUS[1],)))
    assert cache.taken_indices(MAPS[0]) == {1: "a"}
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {}
    assert cache.gpu_holders(NODES[0], GPUS[1]) == {"a": Sharing.EXCLUSIVE}


def test_shared_gpus_keep_every_user_until_the_last_leaves() -> None:
    cache = SlotCache()
    cache.assume("a", "team/web-0", one(0, (GPUS[0],), Sharing.SHARED))
    cache.assume("b", "team/web-1", one(1, (GPUS[0],), Sharing.SHARED))
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {"a": Sharing.SHARED, "b": Sharing.SHARED}
    cache.release("a")
    assert cache.gpu_holders(NODES[0], GPUS[0]) == {"b": Sharing.SHARED}


# -- a second holder ------------------------------------------------------------------------------


def held(uid: str, index: int, sharing: Sharing = Sharing.EXCLUSIVE) -> Holding:
    return Holding(
        uid,
        f"ml/{uid}",
        SlotKey(MapKey("ml", "llm"), index),
        NodeName("gpu-1"),
        ("GPU-a", f"GPU-{uid}"),
        sharing,
        assumed=False,
    )


def test_a_second_holder_of_an_exclusive_gpu_is_a_conflict_until_one_is_released() -> None:
    cache = SlotCache()
    assert cache.add_bound(held("p1", 0)) == []
    [conflict] = cache.add_bound(held("p2", 1))
    assert (conflict.node, conflict.gpu, conflict.holders) == ("gpu-1", "GPU-a", ("p1", "p2"))
    assert cache.conflicts() == [conflict]
    assert cache.gpu_holders(NodeName("gpu-1"), "GPU-a") == {  # both still hold it
        "p1": Sharing.EXCLUSIVE,
        "p2": Sharing.EXCLUSIVE,
    }
    assert cache.add_bound(held("p2", 1)) == []  # the same pod again: nothing new to report
    cache.release("p1")
    assert cache.conflicts() == []


def test_pods_that_may_share_a_gpu_are_no_conflict() -> None:
    shared = SlotCache()
    shared.add_bound(held("p1", 0, Sharing.SHARED))
    assert shared.add_bound(held("p2", 1, Sharing.SHARED)) == []
    assert shared.add_bound(held("p3", 2, Sharing.EXCLUSIVE)) != []  # one of them exclusive
    lines = SlotCache(may_share=lambda a, b, gpu: gpu == "GPU-a")  # legacy lines that share
    lines.add_bound(held("p1", 0))
    assert lines.add_bound(held("p2", 1)) == [] and lines.conflicts() == []


def test_a_maps_holdings_are_its_slots_only_and_follow_releases() -> None:
    cache = SlotCache()
    cache.assume("a", "team/a", placement(0, 0))  # map 0
    cache.assume("b", "team/b", placement(0, 1))  # map 1
    cache.assume("c", "team/c", placement(1, 0))  # map 0, another index
    assert {h.uid for h in cache.map_holdings(MAPS[0])} == {"a", "c"}
    assert {h.uid for h in cache.map_holdings(MAPS[1])} == {"b"}
    cache.release("a")
    assert [h.uid for h in cache.map_holdings(MAPS[0])] == ["c"]
    assert cache.map_holdings(MapKey("team", "none")) == []
