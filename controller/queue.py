"""The binder's scheduling queue: active, backoff and unschedulable, as in kube-scheduler.

Unschedulable pods wait for a change to something they named (`waits_for` keys) and move back to
active as soon as it happens; errors back off exponentially, capped.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Iterable

from placement.wake import WakeKey


class SchedulingQueue:
    """Pods (by uid) waiting for the binder's decision.

    Contract: any thread may add, remove, back off, park (`unschedulable`) and wake pods; the
    binder's worker pops. One condition variable guards every field; `pop` waits on it and is
    woken by an add, a wake, a due backoff or `close`. A pod is in at most one of active, backoff
    and unschedulable: an add or a wake takes it out of unschedulable (and forgets every key it
    waited on), a remove takes it out of all three; a stale deque or heap entry is skipped on pop.
    """

    def __init__(self, max_backoff: float = 10.0, initial_backoff: float = 0.1) -> None:
        self._cond = threading.Condition()
        self._active: deque[str] = deque()
        self._in_active: set[str] = set()
        self._backoff: list[tuple[float, str]] = []
        self._attempts: dict[str, int] = {}
        self._unschedulable: dict[str, frozenset[WakeKey]] = {}
        self._waiting_on: dict[WakeKey, set[str]] = {}
        self._closed = False
        self.max_backoff = max_backoff
        self.initial_backoff = initial_backoff
        self.added_at: dict[str, float] = {}

    def __len__(self) -> int:
        with self._cond:
            return len(self._in_active) + len(self._backoff) + len(self._unschedulable)

    def add(self, uid: str) -> None:
        with self._cond:
            self._drop_unschedulable(uid)
            self.added_at.setdefault(uid, time.monotonic())
            if uid not in self._in_active:
                self._in_active.add(uid)
                self._active.append(uid)
                self._cond.notify()

    def remove(self, uid: str) -> None:
        with self._cond:
            self._drop_unschedulable(uid)
            self._in_active.discard(uid)  # stale deque entries are skipped on pop
            self._attempts.pop(uid, None)
            self.added_at.pop(uid, None)

    def backoff(self, uid: str) -> None:
        with self._cond:
            attempt = self._attempts.get(uid, 0) + 1
            self._attempts[uid] = attempt
            delay = min(self.initial_backoff * 2 ** (attempt - 1), self.max_backoff)
            heapq.heappush(self._backoff, (time.monotonic() + delay, uid))
            self._cond.notify()

    def unschedulable(self, uid: str, waits_for: frozenset[WakeKey]) -> None:
        with self._cond:
            self._drop_unschedulable(uid)
            self._unschedulable[uid] = waits_for
            for key in waits_for:
                self._waiting_on.setdefault(key, set()).add(uid)

    def _drop_unschedulable(self, uid: str) -> None:
        keys = self._unschedulable.pop(uid, None)
        for key in keys or ():
            waiters = self._waiting_on.get(key)
            if waiters is not None:
                waiters.discard(uid)
                if not waiters:
                    del self._waiting_on[key]

    def wake(self, keys: Iterable[WakeKey]) -> int:
        """Moves the pods waiting on any of `keys` to active; returns how many moved."""
        with self._cond:
            uids: set[str] = set()
            for key in keys:
                uids |= self._waiting_on.get(key, set())
            for uid in uids:
                self._drop_unschedulable(uid)
                if uid not in self._in_active:
                    self._in_active.add(uid)
                    self._active.append(uid)
            if uids:
                self._cond.notify()
            return len(uids)

    def wake_all(self) -> int:
        with self._cond:
            uids = list(self._unschedulable)
        for uid in uids:
            self.add(uid)
        return len(uids)

    def succeeded(self, uid: str) -> None:
        with self._cond:
            self._attempts.pop(uid, None)

    def pop(self, timeout: float = 1.0) -> str | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._backoff and self._backoff[0][0] <= now:
                    _, uid = heapq.heappop(self._backoff)
                    if uid not in self._in_active and uid in self.added_at:
                        self._in_active.add(uid)
                        self._active.append(uid)
                while self._active:
                    uid = self._active.popleft()
                    if uid in self._in_active:
                        self._in_active.discard(uid)
                        return uid
                wait = deadline - now
                if self._backoff:
                    wait = min(wait, self._backoff[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)
            return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
