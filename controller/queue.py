"""The binder's scheduling queue: active, backoff and unschedulable, as in kube-scheduler.

Unschedulable pods wait for a change to something they named (`waits_for` keys) and move back to
active as soon as it happens; errors back off exponentially, capped.

Pods whose verdicts name the same cohort (pods of one `indexing: allocate` map that hold no slot:
any of them would get the same answer) are woken one at a time: a change wakes the cohort's
longest-waiting pod, and each decision of a woken pod that does not send it back to the cohort
(it was placed, went away, or now waits for something else) wakes the next. So a change that
cannot help them costs one decision, not one per pod, and a change that frees slots places pods
one after another until one finds none.
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
        #: Cohort -> its unschedulable pods, longest-waiting first (values unused).
        self._cohorts: dict[str, dict[str, None]] = {}
        self._cohort_of: dict[str, str] = {}
        #: A pod woken for its cohort -> that cohort, until its next verdict.
        self._woken_for: dict[str, str] = {}
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
            self._pass_on(uid)
            self._in_active.discard(uid)  # stale deque entries are skipped on pop
            self._attempts.pop(uid, None)
            self.added_at.pop(uid, None)

    def backoff(self, uid: str) -> None:
        with self._cond:
            attempt = self._attempts.get(uid, 0) + 1
            self._attempts[uid] = attempt
            delay = min(self.initial_backoff * 2 ** (attempt - 1), self.max_backoff)
            self._pass_on(uid)
            heapq.heappush(self._backoff, (time.monotonic() + delay, uid))
            self._cond.notify()

    def unschedulable(self, uid: str, waits_for: frozenset[WakeKey], cohort: str = "") -> None:
        """Parks `uid` until one of `waits_for` is woken; with a `cohort`, in that cohort's line
        (see the module's docstring)."""
        with self._cond:
            self._drop_unschedulable(uid)
            if self._woken_for.get(uid) == cohort and cohort:
                del self._woken_for[uid]  # the change did not help the cohort: its line stops
            else:
                self._pass_on(uid)
            self._unschedulable[uid] = waits_for
            for key in waits_for:
                self._waiting_on.setdefault(key, set()).add(uid)
            if cohort:
                self._cohort_of[uid] = cohort
                self._cohorts.setdefault(cohort, {})[uid] = None

    def placed(self, uid: str) -> None:
        """`uid` was given a slot: if a change woke it for its cohort, the next one is woken."""
        with self._cond:
            self._pass_on(uid)

    def _pass_on(self, uid: str) -> None:
        """The verdict on a pod woken for its cohort did not return it there: the cohort's next
        pod is woken (the change that woke this one may help that one too)."""
        cohort = self._woken_for.pop(uid, None)
        if cohort is not None:
            self._wake_cohort(cohort)

    def _wake_cohort(self, cohort: str) -> bool:
        line = self._cohorts.get(cohort)
        if not line:
            return False
        uid = next(iter(line))
        self._drop_unschedulable(uid)
        self._woken_for[uid] = cohort
        self._activate(uid)
        return True

    def _activate(self, uid: str) -> None:
        if uid not in self._in_active:
            self._in_active.add(uid)
            self._active.append(uid)

    def _drop_unschedulable(self, uid: str) -> None:
        cohort = self._cohort_of.pop(uid, None)
        if cohort is not None:
            line = self._cohorts[cohort]
            del line[uid]
            if not line:
                del self._cohorts[cohort]
        keys = self._unschedulable.pop(uid, None)
        for key in keys or ():
            waiters = self._waiting_on.get(key)
            if waiters is not None:
                waiters.discard(uid)
                if not waiters:
                    del self._waiting_on[key]

    def wake(self, keys: Iterable[WakeKey]) -> int:
        """Moves the pods waiting on any of `keys` to active, one per cohort; returns how many
        moved."""
        with self._cond:
            uids: set[str] = set()
            for key in keys:
                uids |= self._waiting_on.get(key, set())
            cohorts: set[str] = set()
            moved = 0
            for uid in uids:
                cohort = self._cohort_of.get(uid)
                if cohort is not None:
                    cohorts.add(cohort)
                    continue
                self._drop_unschedulable(uid)
                self._activate(uid)
                moved += 1
            moved += sum(self._wake_cohort(cohort) for cohort in cohorts)
            if moved:
                self._cond.notify()
            return moved

    def wake_all(self) -> int:
        """Every unschedulable pod to active, but one per cohort (its line goes on from there)."""
        with self._cond:
            uids = [uid for uid in self._unschedulable if uid not in self._cohort_of]
            cohorts = list(self._cohorts)
        for uid in uids:
            self.add(uid)
        with self._cond:
            moved = sum(self._wake_cohort(cohort) for cohort in cohorts)
            if moved:
                self._cond.notify()
        return len(uids) + moved

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
