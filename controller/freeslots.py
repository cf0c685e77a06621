"""The free slots of each map, indexed for the binder's `indexing: allocate` decisions.

A map's index holds its free slots in ascending order: declared, not blocked by the compile, not
held by a pod, and not parked. A slot a decision found it cannot serve now (its node cordoned, its
GPU still in use, ...) is parked with that refusal until one of the keys it waits for is woken, so
that the next decision starts at the lowest slot that may be servable instead of checking every
slot again: finding the lowest candidate is a binary search, and each free slot is checked at most
once per change that may unblock it.

The index of a map is built from the compiled map the first decision hands it (in the order its
slots are declared, O(slots)) and again when the model gives that map a new compiled form; the
slot cache keeps it current as holdings come and go. Not thread-safe: the slot cache calls it
under its own lock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from placement.binding import Status
from placement.model import CompiledMap
from placement.types import MapKey, SlotKey
from placement.wake import WakeKey

#: Up to this many slots are parked or put back one at a time (a binary search and a move of the
#: list's tail each); more are merged into or filtered out of the list in one linear pass.
_ONE_BY_ONE = 32


@dataclass(slots=True)
class MapIndex:
    cmap: CompiledMap
    free: list[int]  # ascending
    parked: dict[int, Status] = field(default_factory=dict)

    def remove(self, index: int) -> None:
        at = bisect_left(self.free, index)
        if at < len(self.free) and self.free[at] == index:
            del self.free[at]

    def next_free(self, after: int, limit: int = 1) -> list[int]:
        """The lowest `limit` free slots above index `after`."""
        at = bisect_right(self.free, after)
        return self.free[at : at + limit]

    def put_back(self, indices: list[int]) -> None:
        """Slots free again (not among `free`): one by one when few, else merged in one sort
        (two sorted runs: linear)."""
        if len(indices) <= _ONE_BY_ONE:
            for i in indices:
                insort(self.free, i)
        else:
            self.free = sorted(self.free + sorted(indices))


class FreeSlotIndex:
    def __init__(self) -> None:
        self._maps: dict[MapKey, MapIndex] = {}
        #: Wake key -> map -> the indices of its parked slots that wait for it.
        self._parked_on: dict[WakeKey, dict[MapKey, set[int]]] = {}
        #: Slots examined by `next_free` and `MapIndex` builds: what a decision cost, counted.
        self.examined = 0

    def of(self, cmap: CompiledMap, taken: Mapping[int, str]) -> MapIndex:
        """The index of `cmap`'s map, built anew if the model compiled the map again."""
        index = self._maps.get(cmap.key)
        if index is None or index.cmap is not cmap:
            if index is not None:
                self._unregister(cmap.key, index)
            free = [i for i in cmap.sorted_indices if i not in taken and not cmap.slots[i].blocked]
            self.examined += len(cmap.slots)
            index = self._maps[cmap.key] = MapIndex(cmap, free)
        return index

    def get(self, key: MapKey) -> MapIndex | None:
        return self._maps.get(key)

    def taken(self, slot: SlotKey) -> None:
        """A pod holds `slot` now."""
        index = self._maps.get(slot.map)
        if index is None:
            return
        index.remove(slot.index)
        status = index.parked.pop(slot.index, None)
        if status is not None:
            self._unregister_slot(slot.map, slot.index, status)

    def freed(self, slot: SlotKey) -> None:
        """No pod holds `slot` any more."""
        index = self._maps.get(slot.map)
        if index is None:
            return
        declared = index.cmap.slots.get(slot.index)
        if declared is None or declared.blocked or slot.index in index.parked:
            return
        at = bisect_left(index.free, slot.index)
        if at == len(index.free) or index.free[at] != slot.index:
            index.free.insert(at, slot.index)

    def park(self, cmap: CompiledMap, refused: Sequence[tuple[int, Status]]) -> None:
        """Slots of `cmap` a decision could not serve: out of the candidates until a key of
        their refusal is woken (`unpark`). A slot taken meanwhile, or a map compiled again
        since, is left alone."""
        index = self._maps.get(cmap.key)
        if index is None or index.cmap is not cmap:
            return
        free = set(index.free) if len(refused) > _ONE_BY_ONE else None
        parked: set[int] = set()
        slots_of: dict[int, tuple[Status, list[int]]] = {}
        for i, status in refused:
            is_free = i in free if free is not None else index.next_free(i - 1) == [i]
            if not is_free or i in index.parked or not status.waits_for:
                continue
            index.parked[i] = status
            parked.add(i)
            # A node's slots share one refusal: its keys are looked up once.
            slots_of.setdefault(id(status), (status, []))[1].append(i)
        for status, indices in slots_of.values():
            for key in status.waits_for:
                self._parked_on.setdefault(key, {}).setdefault(cmap.key, set()).update(indices)
        if len(parked) <= _ONE_BY_ONE:
            for i in parked:
                index.remove(i)
        elif parked:
            index.free = [i for i in index.free if i not in parked]

    def unpark(self, keys: Iterable[WakeKey]) -> set[MapKey]:
        """Puts back the parked slots that wait for any of `keys`; returns their maps."""
        back: dict[MapKey, list[int]] = {}
        for key in keys:
            for map_key, waiting in self._parked_on.pop(key, {}).items():
                index = self._maps.get(map_key)
                if index is None:
                    continue
                for i in waiting:
                    status = index.parked.pop(i, None)
                    if status is not None:
                        self._unregister_slot(map_key, i, status)
                        back.setdefault(map_key, []).append(i)
        for key_of_map, indices in back.items():
            self._maps[key_of_map].put_back(indices)
        return set(back)

    def unpark_all(self, live: Iterable[MapKey]) -> set[MapKey]:
        """Every parked slot back among the candidates, and the index of each map not in `live`
        dropped; returns the maps that had parked slots."""
        keep = set(live)
        maps = set()
        for key in list(self._maps):
            index = self._maps[key]
            if index.parked:
                maps.add(key)
                index.put_back(list(index.parked))
                index.parked.clear()
            if key not in keep:
                del self._maps[key]
        self._parked_on.clear()
        return maps

    def _unregister(self, key: MapKey, index: MapIndex) -> None:
        for i, status in index.parked.items():
            self._unregister_slot(key, i, status)
        index.parked.clear()

    def _unregister_slot(self, map_key: MapKey, i: int, status: Status) -> None:
        for key in status.waits_for:
            maps = self._parked_on.get(key)
            waiting = maps.get(map_key) if maps is not None else None
            if maps is None or waiting is None:
                continue
            waiting.discard(i)
            if not waiting:
                del maps[map_key]
                if not maps:
                    del self._parked_on[key]
