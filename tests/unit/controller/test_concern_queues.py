"""Each concern's queue as its reconciler drives it: what a reconcile reads, whom it tells, and when
its key comes back (a rollout under way, the expiry's second, a template change settling); the
queue itself is tested in test_workqueue.py, the model's and the statuses' in test_reconcilers.py."""

from __future__ import annotations

from typing import Any

from controller.driftjudge import DriftJudge
from controller.inventories import EXPIRY, EXPIRY_SECONDS, InventoryTracker
from controller.snapshot import Published, Snapshot
from controller.statuswriter import StatusKey
from controller.templatesync import SETTLE_SECONDS, TEMPLATES, TemplateSync
from controller.workqueue import WorkQueue
from placement.types import MapKey, RolloutStrategy
from tests.unit.controller.test_reconcilers import FakeInformer, taken
from tests.unit.controller.test_rollout import KEY, FakeDrift, model, setup


class JudgedDrift(FakeDrift):
    """The rollout tests' drift, judged as changed on the first check only."""

    checked: list[set[MapKey]]

    def check(self, keys: Any, _model: Any, _cache: Any) -> set[MapKey]:
        self.checked = [*getattr(self, "checked", []), set(keys)]
        return set(keys) if len(self.checked) == 1 else set()


def judge(strategy: RolloutStrategy, leading: bool = True) -> tuple[DriftJudge, Any, Any]:
    rollouts, kube, cache, drift, _ = setup()
    judged = JudgedDrift(drift.items)
    published = Published()
    published.swap(Snapshot(model=model(strategy, 1)))
    statuses: WorkQueue[StatusKey] = WorkQueue("status")
    return (
        DriftJudge(judged, rollouts, cache, published, statuses, lambda: leading),  # type: ignore[arg-type]
        kube,
        statuses,
    )


def test_a_map_whose_rollout_is_under_way_comes_back_and_its_status_is_told() -> None:
    drift, kube, statuses = judge(RolloutStrategy.EVICT)
    assert drift.reconcile([KEY]) == {KEY: drift.poll_seconds}
    assert kube.evicted == ["t-0"]
    assert taken(statuses) == {KEY}  # its drift count and its rollout note moved
    assert drift.reconcile([KEY]) == {KEY: drift.poll_seconds}  # t-0 still down: waits
    assert kube.evicted == ["t-0"]


def test_a_manual_map_is_judged_once_and_not_polled() -> None:
    drift, kube, statuses = judge(RolloutStrategy.MANUAL)
    assert drift.reconcile([KEY]) == {}
    assert kube.evicted == [] and taken(statuses) == {KEY}


def test_a_drift_judge_without_the_lease_judges_and_evicts_nothing() -> None:
    drift, kube, statuses = judge(RolloutStrategy.EVICT, leading=False)
    assert drift.reconcile([KEY]) is None
    assert kube.evicted == [] and taken(statuses) == set()


def test_the_expiry_comes_back_every_second() -> None:
    tracker = InventoryTracker(lambda *_: None)
    assert tracker.expire([EXPIRY]) == {EXPIRY: EXPIRY_SECONDS}


class RecordingKeeper:
    def __init__(self) -> None:
        self.synced: list[list[MapKey]] = []

    def sync(self, maps: list[MapKey], _current: Any) -> None:
        self.synced.append(maps)


def test_someone_elses_template_change_is_synced_once_the_informer_settled() -> None:
    queue: WorkQueue[str] = WorkQueue("templates")
    keeper = RecordingKeeper()
    leading = [False]
    published = Published()
    published.swap(Snapshot(model=model(RolloutStrategy.MANUAL, 1)))
    sync = TemplateSync(keeper, FakeInformer(), published, queue, lambda: leading[0])  # type: ignore[arg-type]
    sync.on_template("ADDED", {}, None)  # our own create coming back: nothing to do
    assert queue.delayed() == 0 and len(queue) == 0
    sync.on_template("MODIFIED", {}, None)
    assert queue.delayed() == 1 and queue.get(timeout=0) == []  # not before SETTLE_SECONDS
    assert queue.get(timeout=SETTLE_SECONDS * 20) == [TEMPLATES]
    sync.reconcile([TEMPLATES])
    assert keeper.synced == []  # a standby writes no template
    leading[0] = True
    sync.reconcile([TEMPLATES])
    assert keeper.synced == [[KEY]]
