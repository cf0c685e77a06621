"""Which status changes the controller may coalesce: the bound count alone, nothing else."""

from __future__ import annotations

from dataclasses import replace

from controller.sources import only_bound_changed
from placement.status import MapStatus, Phase, SlotCounts

BASE = MapStatus(
    Phase.VALID,
    observed_generation=3,
    observed_version="abc",
    message="8 of 8 slots served",
    slots=SlotCounts(total=8, served=8, bound=2, blocked=0),
    serving_version="abc",
)


def test_a_moved_bound_count_alone_may_wait() -> None:
    assert only_bound_changed(BASE, replace(BASE, slots=replace(BASE.slots, bound=7)))


def test_the_same_status_is_no_change() -> None:
    assert not only_bound_changed(BASE, replace(BASE))


def test_any_other_change_goes_out_at_once() -> None:
    more = replace(BASE.slots, bound=7)
    changes = [
        replace(BASE, phase=Phase.DEGRADED, slots=more),
        replace(BASE, message="7 of 8 slots served", slots=more),
        replace(BASE, observed_generation=4, slots=more),
        replace(BASE, observed_version="def", slots=more),
        replace(BASE, slots=replace(more, served=7, blocked=1)),
        replace(BASE, serving_version="old", slots=more),
    ]
    for changed in changes:
        assert not only_bound_changed(BASE, changed), changed
