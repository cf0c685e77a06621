"""The interpreter's cyclic garbage collector in the controller process.

The controller holds a large cache for as long as it runs (every pod, node, inventory and map the
informers listed, the slot cache built from them) and allocates many small objects per watch event
that die young (the event's decoded JSON). With CPython's default thresholds (700, 10, 10) the
youngest generation is collected every 700 container allocations, which one pod event exceeds;
the objects the cache keeps are promoted and scanned again by the older generations' collections,
and a full collection walks the whole cache, once more each time the heap has grown by a quarter
(200-450 ms each at 1,000 nodes and 5,000 pods on two cores, several of them during a start-up).

So the controller collects the youngest generation every `THRESHOLDS[0]` allocations, and a new
leader moves what it has just listed and rebuilt out of the collector's sight (`gc.freeze`):
reference counting still frees those objects when the cache lets them go (decoded JSON, the bulk
of it, holds no reference cycles). What a cycle among the frozen objects keeps is never collected:
at most what was alive at the freeze, once per leadership, since objects made later are collected
as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

#: (youngest generation, middle, oldest): see the module's docstring.
THRESHOLDS = (50_000, 20, 20)


def tune() -> None:
    """Sets the collector's thresholds for this process (at its start)."""
    gc.set_threshold(*THRESHOLDS)


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


def freeze() -> None:
    """Every object alive now leaves the collector's generations: a leader calls it once its
    caches are rebuilt, before it binds."""
    gc.freeze()
