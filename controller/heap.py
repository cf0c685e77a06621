"""The interpreter's cyclic garbage collector in the controller process.

The controller holds a large cache for as long as it runs (every pod, node, inventory and map the
informers listed, the slot cache built from them) and allocates many small objects per watch event
that die young (the event's decoded JSON). With CPython's default thresholds (700, 10, 10) the
youngest generation is collected every 700 container allocations, which one pod event exceeds;
the objects the cache keeps are promoted and scanned again by the older generations' collections,
and a full collection walks the whole cache, once more each time the heap has grown by a quarter
(200-450 ms each at 1,000 nodes and 5,000 pods on two cores, several of them during a start-up).

So the controller collects the youngest generation every `THRESHOLDS[0]` allocations; it does not
collect at all while it builds its caches (`paused`: from its start until the informers have
listed everything, and while a new leader compiles and rebuilds its slot cache), and then moves
what it built out of the collector's sight (`gc.freeze`): reference counting still frees those
objects when the cache lets them go (decoded JSON, the bulk of it, holds no reference cycles).
What a cycle among the frozen objects keeps is never collected: at most what was alive at a
freeze (the end of the start's pause, and of a new leader's two), since objects made later are
collected as before. On a cluster of 40,000 pods the collections a start-up made cost 0.5-1 s before its
first bind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: (youngest generation, middle, oldest): see the module's docstring.
THRESHOLDS = (50_000, 20, 20)


class _Pauses:
    """The collector is paused while any pause lasts (pauses nest, across threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def pause(self) -> None:
        with self._lock:
            self.count += 1
            gc.disable()

    def resume(self) -> None:
        with self._lock:
            self.count -= 1
            if self.count == 0:
                gc.freeze()
                gc.enable()


_pauses = _Pauses()


def tune() -> None:
    """Sets the collector's thresholds for this process, and pauses it (at the start: `resume`
    once the caches are listed)."""
    gc.set_threshold(*THRESHOLDS)
    pause()


def pause() -> None:
    """No collection until as many `resume`s as `pause`s."""
    _pauses.pause()


def resume() -> None:
    """Ends a `pause`; the last one freezes what is alive and collects again."""
    _pauses.resume()


@contextmanager
def paused() -> Iterator[None]:
    pause()
    try:
        yield
    finally:
        resume()


def _malloc_trim() -> object:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None  # not glibc (musl has no malloc_trim): nothing to hand back this way


_TRIM = _malloc_trim()


def trim() -> None:
    """Hands the allocator's free memory back to the system (glibc's malloc_trim). A list of
    whole objects (a page of 500 pods of 100 KB each is 50 MB) is freed once the informer has
    trimmed it (controller/trim.py), but the allocator keeps those pages, scattered among the
    small blocks the cache keeps, and the process's resident size would stay at its peak."""
    if callable(_TRIM):
        _TRIM(0)
