"""The controller's garbage-collector settings (controller/heap.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from controller import heap


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        while heap._pauses.count > 0:
            heap.resume()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        gc.enable()


class Node:
    """A container object the collector tracks."""


def test_tune_collects_the_youngest_generation_less_often_once_the_start_is_over(
    collector: None,
) -> None:
    heap.tune()
    assert gc.get_threshold() == heap.THRESHOLDS
    assert heap.THRESHOLDS[0] > 700  # CPython's default
    assert not gc.isenabled()  # the start-up's pause
    heap.resume()
    assert gc.isenabled()


def test_the_collector_runs_again_only_when_every_pause_has_ended(collector: None) -> None:
    heap.pause()
    with heap.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    heap.resume()
    assert gc.isenabled()


def test_what_is_alive_at_freeze_is_left_out_of_collections_and_still_freed(
    collector: None,
) -> None:
    cached = Node()
    with heap.paused():
        pass  # the last pause's end freezes what is alive
    later = Node()
    assert gc.get_freeze_count() > 0
    tracked = {id(o) for o in gc.get_objects()}
    assert id(cached) not in tracked
    assert id(later) in tracked
    # Reference counting frees a frozen object once nothing holds it.
    gone = weakref.ref(cached)
    del cached
    assert gone() is None
