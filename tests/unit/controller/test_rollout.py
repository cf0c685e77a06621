"""`rollout: evict` decisions: budget per map, the replacement must be Running before the next
eviction, PodDisruptionBudget and RBAC refusals, and slots that cannot take a pod yet."""

from __future__ import annotations

import threading
from typing import Any

from controller.rollout import Rollouts
from controller.slotcache import Holding, SlotCache
from kubeio.errors import APIForbiddenError, APITooManyRequestsError
from placement.binding import Code, Status
from placement.compile import Compiler
from placement.drift import BoundSlot, Drift, DriftKind
from placement.maps import DeclaredSlot, PlacementMap, Rollout
from placement.model import Model
from placement.types import MapKey, NodeName, RolloutStrategy, Sharing, SlotKey

KEY = MapKey("ml", "train")


class FakeKube:
    def __init__(self, refuse: Exception | None = None) -> None:
        self.evicted: list[str] = []
        self.refuse = refuse

    def create(self, path: str, body: Any) -> Any:
        if self.refuse is not None:
            raise self.refuse
        self.evicted.append(body["metadata"]["name"])
        return body


class FakeEvents:
    def emit(self, *args: Any) -> None:
        pass


class FakeDrift:
    def __init__(self, drifted: list[tuple[Holding, Drift]]) -> None:
        self.items = drifted

    def maps(self) -> list[MapKey]:
        return [KEY] if self.items else []

    def count(self, key: MapKey) -> int:
        return len(self.items) if key == KEY else 0

    def drifted(self, key: MapKey) -> list[tuple[Holding, Drift]]:
        return list(self.items) if key == KEY else []


def model(strategy: RolloutStrategy, max_unavailable: int) -> Model:
    compiler = Compiler()
    slots = tuple(DeclaredSlot(i, "gpu-2", (i,)) for i in range(4))
    compiler.set_map(PlacementMap(KEY, slots, rollout=Rollout(strategy, max_unavailable)))
    built, _ = compiler.build()
    return built


def holding(index: int, uid: str = "") -> Holding:
    return Holding(
        uid or f"old-{index}",
        f"ml/t-{index}",
        SlotKey(KEY, index),
        NodeName("gpu-1"),
        (f"#{index}",),
        Sharing.EXCLUSIVE,
        assumed=False,
    )


def setup(
    refuse: Exception | None = None, blocked: set[int] | None = None
) -> tuple[Rollouts, FakeKube, SlotCache, FakeDrift, dict[str, bool]]:
    cache = SlotCache()
    items = []
    for i in range(4):
        held = holding(i)
        cache.add_bound(held)
        bound = BoundSlot(held.slot, held.node, held.gpus)
        items.append((held, Drift(DriftKind.SLOT_MOVED, bound, NodeName("gpu-2"), (f"#{i}",))))
    running = {h.uid: True for h, _ in items}
    kube = FakeKube(refuse)

    def servable(uid: str, slot: SlotKey) -> Status | None:
        if blocked and slot.index in blocked:
            return Status(Code.UNSCHEDULABLE, "DeviceBusy", "busy")
        return None

    rollouts = Rollouts(kube, FakeEvents(), lambda uid: running.get(uid, False), servable)  # type: ignore[arg-type]
    return rollouts, kube, cache, FakeDrift(items), running


def test_one_at_a_time_the_next_only_after_the_replacement_runs() -> None:
    rollouts, kube, cache, drift, running = setup()
    m = model(RolloutStrategy.EVICT, 1)
    rollouts.step(m, drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-0"]
    rollouts.step(m, drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-0"]  # t-0 is still down
    # The old pod is gone, its replacement bound but not Running yet: still one down.
    cache.release("old-0")
    drift.items = drift.items[1:]
    cache.add_bound(holding(0, "new-0"))
    rollouts.step(m, drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-0"]
    running["new-0"] = True
    rollouts.step(m, drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-0", "t-1"]


def test_max_unavailable_two_and_a_pod_already_down_costs_nothing() -> None:
    rollouts, kube, cache, drift, running = setup()
    running["old-3"] = False  # t-3 is not Running anyway: one slot down already
    rollouts.step(model(RolloutStrategy.EVICT, 2), drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-0"]
    rollouts, kube, cache, drift, running = setup()
    rollouts.step(model(RolloutStrategy.EVICT, 2), drift, cache)  # type: ignore[arg-type]
    assert sorted(kube.evicted) == ["t-0", "t-1"]  # evicted concurrently


def test_manual_maps_and_unservable_slots_evict_nothing() -> None:
    rollouts, kube, cache, drift, _ = setup()
    rollouts.step(model(RolloutStrategy.MANUAL, 1), drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == []
    rollouts, kube, cache, drift, _ = setup(blocked={0, 1})
    rollouts.step(model(RolloutStrategy.EVICT, 1), drift, cache)  # type: ignore[arg-type]
    assert kube.evicted == ["t-2"]


def test_refusals_are_reported_not_retried_in_a_loop() -> None:
    pdb = APITooManyRequestsError(429, "TooManyRequests", "disruption budget")
    rollouts, _, cache, drift, _ = setup(refuse=pdb)
    changed = rollouts.step(model(RolloutStrategy.EVICT, 1), drift, cache)  # type: ignore[arg-type]
    assert changed == {KEY}
    assert rollouts.states[KEY].waiting == "waiting for a PodDisruptionBudget"
    forbidden = APIForbiddenError(403, "Forbidden", "cannot create pods/eviction")
    rollouts, _, cache, drift, _ = setup(refuse=forbidden)
    rollouts.step(model(RolloutStrategy.EVICT, 1), drift, cache)  # type: ignore[arg-type]
    assert "controller.allowEvictions" in rollouts.states[KEY].waiting


def test_the_evictions_a_budget_allows_are_in_flight_together() -> None:
    rollouts, kube, cache, drift, _ = setup()
    # Each Eviction waits until all four are in flight: evicting one after another would break
    # the barrier (its timeout) instead.
    together = threading.Barrier(4, timeout=10)
    create = kube.create

    def create_together(path: str, body: Any) -> Any:
        together.wait()
        return create(path, body)

    kube.create = create_together  # type: ignore[method-assign]
    rollouts.step(model(RolloutStrategy.EVICT, 4), drift, cache)  # type: ignore[arg-type]
    assert sorted(kube.evicted) == ["t-0", "t-1", "t-2", "t-3"]
    assert rollouts.states[KEY].down == 4
