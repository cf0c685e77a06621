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
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class Node:
    """A container object the collector tracks."""


def test_tune_collects_the_youngest_generation_less_often(collector: None) -> None:
    heap.tune()
    assert gc.get_threshold() == heap.THRESHOLDS
    assert heap.THRESHOLDS[0] > 700  # CPython's default


def test_what_is_alive_at_freeze_is_left_out_of_collections_and_still_freed(
    collector: None,
) -> None:
    cached = Node()
    heap.freeze()
    later = Node()
    assert gc.get_freeze_count() > 0
    tracked = {id(o) for o in gc.get_objects()}
    assert id(cached) not in tracked
    assert id(later) in tracked
    # Reference counting frees a frozen object once nothing holds it.
    gone = weakref.ref(cached)
    del cached
    assert gone() is None
