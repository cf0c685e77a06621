"""The drift tracker's passes (controller/drift.py): a pass judges a map's bound pods against the
published model, and judges again only what changed since (a holding new to it, or a new compiled
map), so that a drain, which queues a map's pass bind after bind, does not judge every pod of the
map again each time."""

from __future__ import annotations

from typing import Any

import pytest

from controller import drift as drift_module
from controller.drift import DriftTracker
from controller.slotcache import SlotCache
from placement.types import RolloutStrategy
from tests.unit.controller.test_rollout import KEY, FakeEvents, holding, model


class PatchingKube:
    def __init__(self) -> None:
        self.patched: list[str] = []

    def patch(self, path: str, body: Any, content_type: str = "") -> Any:
        self.patched.append(path)
        return body


@pytest.fixture
def judgements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The holdings `drift_of` is asked about, in order."""
    asked: list[str] = []
    real = drift_module.drift_of

    def counting(bound: Any, current: Any) -> Any:
        asked.append(f"{bound.slot.index}")
        return real(bound, current)

    monkeypatch.setattr(drift_module, "drift_of", counting)
    return asked


def test_a_pass_judges_only_what_is_new_since_the_last_against_the_same_model(
    judgements: list[str],
) -> None:
    tracker = DriftTracker(PatchingKube(), FakeEvents())  # type: ignore[arg-type]
    cache = SlotCache()
    for index in range(3):
        cache.add_bound(holding(index))  # on gpu-1; the model puts every slot on gpu-2
    first = model(RolloutStrategy.MANUAL, 1)
    assert tracker.check([KEY], first, cache) == {KEY}
    assert tracker.count(KEY) == 3 and sorted(judgements) == ["0", "1", "2"]

    judgements.clear()
    assert tracker.check([KEY], first, cache) == set()  # nothing new: nothing judged
    assert judgements == [] and tracker.count(KEY) == 3

    cache.add_bound(holding(3))
    assert tracker.check([KEY], first, cache) == {KEY}
    assert judgements == ["3"] and tracker.count(KEY) == 4

    judgements.clear()
    cache.release("old-0")
    assert tracker.check([KEY], first, cache) == {KEY}  # the released pod's drift is gone
    assert judgements == [] and tracker.count(KEY) == 3

    second = model(RolloutStrategy.MANUAL, 1)  # a new compile of the map: all judged again
    assert tracker.check([KEY], second, cache) == set()
    assert sorted(judgements) == ["1", "2", "3"] and tracker.count(KEY) == 3
