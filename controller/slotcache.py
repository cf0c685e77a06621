"""The binder's cache of who holds which slot and GPU, in kube-scheduler's vocabulary.

Invariants: every `assume` is followed by `confirm` (the pod showed up bound) or `forget` (the bind
failed); `release` is idempotent. A GPU is held by one pod, or by several that all share it: a
holding that breaks this (two bound pods on one exclusive GPU, seen in their bindings) is still
recorded, since both pods run there, and comes back from `add_bound` as a `Conflict` for its
caller to report; `conflicts()` lists those standing until one of the holders is released.

Concurrency: the cache is written from three kinds of thread: the decision thread (`assume`), the
request loop's thread (`confirm`, `forget`, as Bindings are answered) and the informer threads
(`add_bound`, `confirm`, `release`), and read from the decision thread, the drift queue's worker and
the status writer. Every method takes
the one lock, and every reader returns a copy (or an immutable value), so no caller iterates a
dictionary that another thread is changing. A decision that reads several times is still
consistent enough: only the decision thread adds holdings for pods it has not seen bound.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice

from controller.freeslots import FreeSlotIndex, MapIndex
from placement.binding import Placement, Status
from placement.model import CompiledMap
from placement.types import MapKey, NodeName, Sharing, SlotKey
from placement.wake import WakeKey


@dataclass(frozen=True, slots=True)
class Holding:
    uid: str
    pod: str  # namespace/name
    slot: SlotKey
    node: NodeName
    gpus: tuple[str, ...]
    sharing: Sharing
    assumed: bool  # True until the pod is seen bound
    revision: str = ""  # revision of the map version that placed the pod, when known


@dataclass(frozen=True, slots=True)
class Conflict:
    """One GPU held by more than one pod where one of them holds it exclusively."""

    node: NodeName
    gpu: str
    holders: tuple[str, ...]  # pod uids, sorted


#: Whether two holdings may hold one GPU together although one of them holds it exclusively
#: (legacy lines that share a GPU): called under the cache's lock, so it must not call back.
MayShare = Callable[[Holding, Holding, str], bool]


def _never(_a: Holding, _b: Holding, _gpu: str) -> bool:
    return False


class SlotCache:
    def __init__(self, may_share: MayShare = _never) -> None:
        self._may_share = may_share
        self._lock = threading.RLock()
        self._by_uid: dict[str, Holding] = {}
        self._slots: dict[SlotKey, str] = {}
        self._by_map: dict[MapKey, dict[int, str]] = defaultdict(dict)
        self._gpus: dict[tuple[NodeName, str], dict[str, Sharing]] = defaultdict(dict)
        self._free = FreeSlotIndex()
        self._conflicts: dict[tuple[NodeName, str], Conflict] = {}

    # SlotView
    def slot_holder(self, slot: SlotKey) -> str | None:
        with self._lock:
            return self._slots.get(slot)

    def gpu_holders(self, node: NodeName, gpu: str) -> Mapping[str, Sharing]:
        """A copy: the pods that use GPU `gpu` of `node`, and how."""
        with self._lock:
            users = self._gpus.get((node, gpu))
            return dict(users) if users else {}

    def taken_indices(self, key: MapKey) -> Mapping[int, str]:
        """A copy: index -> uid of the pods holding slots of map `key`."""
        with self._lock:
            taken = self._by_map.get(key)
            return dict(taken) if taken else {}

    def holding(self, uid: str) -> Holding | None:
        with self._lock:
            return self._by_uid.get(uid)

    def free_slots(self, cmap: CompiledMap) -> FreeView:
        """The free slots of `cmap` for an allocation, from the index (controller/freeslots.py)."""
        with self._lock:
            self._map_index(cmap)
        return FreeView(self, cmap)

    def park(self, cmap: CompiledMap, refused: Sequence[tuple[int, Status]]) -> None:
        """Free slots of `cmap` a decision could not serve: left out of the next decisions
        until a key their refusal waits for is woken (`unpark`)."""
        with self._lock:
            self._free.park(cmap, refused)

    def unpark(self, keys: Iterable[WakeKey]) -> set[MapKey]:
        """The parked slots that wait for any of `keys` are candidates again; returns their
        maps, whose waiting pods may now be placed."""
        with self._lock:
            return self._free.unpark(keys)

    def unpark_all(self, live: Iterable[MapKey]) -> set[MapKey]:
        """Every parked slot a candidate again (the binder's periodic retry); the index of a map
        not in `live` is dropped. Returns the maps that had parked slots."""
        with self._lock:
            return self._free.unpark_all(live)

    def next_free(self, cmap: CompiledMap, after: int, limit: int) -> list[int]:
        """The lowest `limit` free, unparked slots of `cmap` above index `after`."""
        with self._lock:
            found = self._map_index(cmap).next_free(after, limit)
            self._free.examined += len(found)
            return found

    def parked(self, cmap: CompiledMap, limit: int) -> tuple[int, tuple[Status, ...]]:
        """How many free slots of `cmap` are parked, and the refusals of the first `limit`."""
        with self._lock:
            parked = self._map_index(cmap).parked
            return len(parked), tuple(islice(parked.values(), limit))

    def _map_index(self, cmap: CompiledMap) -> MapIndex:
        return self._free.of(cmap, self._by_map.get(cmap.key, {}))

    @property
    def examined(self) -> int:
        """How many slots the free-slot index has looked at so far (its builds and each step
        of a decision's walk): the work decisions cost, counted."""
        with self._lock:
            return self._free.examined

    def bound_count(self, key: MapKey) -> int:
        """Slots of map `key` whose pods are bound (assumed ones, still being bound, are not):
        what a map's status reports, from the state the binder decides with."""
        with self._lock:
            taken = self._by_map.get(key, {})
            return sum(
                1
                for uid in taken.values()
                if (held := self._by_uid.get(uid)) is not None and not held.assumed
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_uid)

    def holdings(self) -> list[Holding]:
        with self._lock:
            return list(self._by_uid.values())

    def map_holdings(self, key: MapKey) -> list[Holding]:
        """The holdings of map `key`'s slots (a copy taken under the lock), in time that grows
        with that map's slots, not with every pod held."""
        with self._lock:
            return [
                held
                for uid in self._by_map.get(key, {}).values()
                if (held := self._by_uid.get(uid)) is not None
            ]

    def assume(self, uid: str, pod: str, placement: Placement) -> None:
        self._add(
            Holding(
                uid,
                pod,
                placement.slot,
                placement.decision.node,
                placement.gpus,
                placement.sharing,
                assumed=True,
                revision=placement.decision.revision,
            )
        )

    def add_bound(self, holding: Holding) -> list[Conflict]:
        """Holds what a bound pod's binding says; returns the GPUs it now holds with a pod that
        may not share them (new conflicts only)."""
        return self._add(holding)

    def conflicts(self) -> list[Conflict]:
        with self._lock:
            return list(self._conflicts.values())

    def conflict_count(self) -> int:
        with self._lock:
            return len(self._conflicts)

    def _add(self, holding: Holding) -> list[Conflict]:
        found = []
        with self._lock:
            before = dict(self._conflicts)  # a pod added again is no news
            self.release(holding.uid)
            self._by_uid[holding.uid] = holding
            self._slots[holding.slot] = holding.uid
            self._by_map[holding.slot.map][holding.slot.index] = holding.uid
            self._free.taken(holding.slot)
            for gpu in holding.gpus:
                users = self._gpus[(holding.node, gpu)]
                users[holding.uid] = holding.sharing
                conflict = self._judge(holding.node, gpu, users)
                if conflict is not None and before.get((holding.node, gpu)) != conflict:
                    found.append(conflict)
        return found

    def _judge(self, node: NodeName, gpu: str, users: Mapping[str, Sharing]) -> Conflict | None:
        """Records (or clears) the conflict on one GPU; returns it, None when there is none."""
        key = (node, gpu)
        clashing = self._clashing(gpu, users)
        if not clashing:
            self._conflicts.pop(key, None)
            return None
        conflict = Conflict(node, gpu, tuple(sorted(clashing)))
        self._conflicts[key] = conflict
        return conflict

    def _clashing(self, gpu: str, users: Mapping[str, Sharing]) -> set[str]:
        """The holders of one GPU in a pair that may not hold it together."""
        out: set[str] = set()
        if len(users) < 2 or Sharing.EXCLUSIVE not in users.values():
            return out
        uids = sorted(users)
        for i, a in enumerate(uids):
            for b in uids[i + 1 :]:
                if users[a] is Sharing.SHARED and users[b] is Sharing.SHARED:
                    continue
                if self._may_share(self._by_uid[a], self._by_uid[b], gpu):
                    continue
                out.update((a, b))
        return out

    def confirm(self, uid: str) -> None:
        with self._lock:
            holding = self._by_uid.get(uid)
            if holding is not None and holding.assumed:
                self._by_uid[uid] = replace(holding, assumed=False)

    def forget(self, uid: str) -> None:
        self.release(uid)

    def release(self, uid: str) -> Holding | None:
        with self._lock:
            holding = self._by_uid.pop(uid, None)
            if holding is None:
                return None
            if self._slots.get(holding.slot) == uid:
                del self._slots[holding.slot]
                taken = self._by_map.get(holding.slot.map)
                if taken is not None:
                    taken.pop(holding.slot.index, None)
                    if not taken:
                        del self._by_map[holding.slot.map]
                self._free.freed(holding.slot)
            for gpu in holding.gpus:
                users = self._gpus.get((holding.node, gpu))
                if users is not None:
                    users.pop(uid, None)
                    self._judge(holding.node, gpu, users)
                    if not users:
                        del self._gpus[(holding.node, gpu)]
            return holding


class FreeView:
    """One map's free slots as a decision walks them (placement.binding.FreeSlots): each call
    reads the index under the cache's lock, so holdings that come and go meanwhile are seen."""

    def __init__(self, cache: SlotCache, cmap: CompiledMap) -> None:
        self._cache = cache
        self._cmap = cmap

    def next_free(self, after: int, limit: int) -> list[int]:
        return self._cache.next_free(self._cmap, after, limit)

    def parked(self, limit: int) -> tuple[int, tuple[Status, ...]]:
        return self._cache.parked(self._cmap, limit)
