"""A keyed, rate-limited work queue and the workers that drain it: the shape of client-go's workqueue,
one queue per concern of the controller (docs/architecture.md, Threads).

Contract of `WorkQueue` (every method from any thread):
- A key is queued at most once: adding a key that waits changes nothing (dedup), so a burst of
  events for one object costs one reconcile.
- A key is never handed to two workers at once: a key added while a worker holds it waits, queued
  once, until that worker calls `done`, and is then queued again.
- Keys are handed out in the order they became ready, first in first out between keys: a key that
  is added again and again goes to the back each time and cannot keep another from its turn.
- `retry(key)`: the key comes back after its own exponential backoff (`base_delay` doubled with each
  failure in a row, at most `max_delay`); `forget(key)` ends its run of failures.
- `add_after(key, delay)`: the key becomes ready after `delay` (a poll, a write held back); an
  earlier readiness wins over a later one, and a plain `add` makes it ready now. With `tick`, the
  time is rounded up to a multiple of it: keys due within one tick become ready together, so
  workers taking batches take them in one wake (a drain's maps, each settled 0.5 s after its
  binds, would otherwise wake a worker once a map).
- The global rate limit: with `qps`, a token bucket (`burst` tokens, refilled at `qps` a second)
  that every key handed out takes one token from, whatever its key: the whole queue's pace against
  the apiserver, on top of each key's backoff.
- `shut_down()`: every `get` returns an empty list from then on; what still waits is dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

#: A reconciler's answer for a batch: the keys to hand out again after so many seconds (a poll, a
#: write held back), or after their backoff (`RETRY`: that key failed); the others are done.
#: Raising instead retries the whole batch with backoff.
Requeue = Mapping[K, float] | None
#: The delay that means "failed: after the key's backoff".
RETRY = -1.0


class TokenBucket:
    """`burst` tokens, refilled at `qps` a second; callers hold the queue's lock."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float]) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, got {qps} and {burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def available(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        return self._tokens

    def take(self, n: int) -> None:
        self._tokens -= n

    def wait_for_one(self) -> float:
        """Seconds until a token is there (0 when one is)."""
        return max(0.0, (1.0 - self.available()) / self.qps)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        base_delay: float = 0.005,
        max_delay: float = 60.0,
        qps: float | None = None,
        burst: int = 1,
        tick: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if tick < 0:
            raise ValueError(f"{name}: a tick is at least 0, got {tick}")
        self.name = name
        self.tick = tick
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._clock = clock
        self._bucket = TokenBucket(qps, burst, clock) if qps is not None else None
        self._cond = threading.Condition()
        self._ready: deque[K] = deque()
        #: queued, or to be queued again when its worker is done with it
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        #: (when, sequence, key); an entry is live while `_due[key]` is its time
        self._delayed: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._sequence = itertools.count()
        self._shut = False
        #: keys added and keys retried after a failure, since the start (for /metrics)
        self.adds = 0
        self.retries = 0

    # -- adding ---------------------------------------------------------------------------------
    def add(self, key: K) -> None:
        with self._cond:
            self._add(key)

    def add_all(self, keys: Iterable[K]) -> None:
        with self._cond:
            for key in keys:
                self._add(key)

    def _add(self, key: K) -> None:
        if self._shut:
            return
        self._due.pop(key, None)  # ready now: a later readiness it had is void
        self.adds += 1
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by `done`
        self._ready.append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shut or key in self._dirty:
                return  # ready already, or again as soon as its worker is done: sooner
            when = self._clock() + delay
            if self.tick:
                when = math.ceil(when / self.tick) * self.tick
            due = self._due.get(key)
            if due is not None and due <= when:
                return
            self._due[key] = when
            earliest = self._delayed[0][0] if self._delayed else None
            heapq.heappush(self._delayed, (when, next(self._sequence), key))
            if earliest is None or when < earliest:
                # A waiting worker wakes by the earliest time already: a later one needs no wake.
                self._cond.notify()

    def retry(self, key: K) -> float:
        """The key again after its backoff; returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            self.retries += 1
        delay = min(self.max_delay, self.base_delay * float(2**failures))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # -- taking ---------------------------------------------------------------------------------
    def get(self, limit: int = 1, timeout: float | None = None) -> list[K]:
        """Up to `limit` ready keys (at least one), marked processing until `done`; blocks until
        one is ready and the rate limit allows it, at most `timeout`. Empty: timed out or shut
        down."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._shut:
                self._promote()
                wait: float | None = None
                if self._ready:
                    n = min(limit, len(self._ready))
                    if self._bucket is not None:
                        wait = self._bucket.wait_for_one()
                        n = min(n, int(self._bucket.available()))
                    if n >= 1:
                        if self._bucket is not None:
                            self._bucket.take(n)
                        keys = [self._ready.popleft() for _ in range(n)]
                        self._dirty.difference_update(keys)
                        self._processing.update(keys)
                        return keys
                if self._delayed:
                    until_due = max(0.0, self._delayed[0][0] - self._clock())
                    wait = until_due if wait is None else min(wait, until_due)
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return []
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
        return []

    def _promote(self) -> None:
        """Delayed keys whose time has come become ready (caller holds the lock)."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            when, _, key = heapq.heappop(self._delayed)
            if self._due.get(key) == when:
                self._add(key)

    def done(self, key: K) -> None:
        """The worker is done with `key`; it is queued again if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty and not self._shut:
                self._ready.append(key)
                self._cond.notify()

    # -- state ----------------------------------------------------------------------------------
    def shut_down(self) -> None:
        with self._cond:
            self._shut = True
            self._ready.clear()
            self._dirty.clear()
            self._delayed.clear()
            self._due.clear()
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        return self._shut

    def __len__(self) -> int:
        """Keys ready now (not those delayed or being processed)."""
        with self._cond:
            return len(self._ready)

    def delayed(self) -> int:
        with self._cond:
            return len(self._due)


class Workers(Generic[K]):
    """`count` threads named `<queue>-N` taking up to `batch` keys at a time from `queue` and
    handing them to `reconcile`. A batch that raises is retried, key by key, after each key's
    backoff; keys it names in its answer come back after the delay named (after their backoff for
    `RETRY`); the others are forgotten (their backoff starts over)."""

    def __init__(
        self,
        queue: WorkQueue[K],
        reconcile: Callable[[list[K]], Requeue[K]],
        *,
        count: int = 1,
        batch: int = 1,
    ) -> None:
        if count < 1 or batch < 1:
            raise ValueError(f"{queue.name}: workers need count >= 1 and batch >= 1")
        self.queue = queue
        self.reconcile = reconcile
        self.count = count
        self.batch = batch
        self._threads: list[threading.Thread] = []
        #: thread name -> when it took the batch it is working on (for health)
        self._busy: dict[str, float] = {}

    def start(self) -> Workers[K]:
        if self._threads:
            return self
        for n in range(self.count):
            thread = threading.Thread(target=self._run, name=f"{self.queue.name}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Shuts the queue down and waits, at most `timeout` in all, for batches in progress."""
        self.queue.shut_down()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def alive(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stuck(self, grace: float) -> float:
        """How long the longest batch in progress has run, when over `grace`; else 0."""
        now = time.monotonic()
        longest = max((now - since for since in list(self._busy.values())), default=0.0)
        return longest if longest > grace else 0.0

    def _run(self) -> None:
        name = threading.current_thread().name
        while True:
            keys = self.queue.get(self.batch)
            if not keys:
                return  # shut down
            self._busy[name] = time.monotonic()
            try:
                self._one(keys)
            finally:
                self._busy.pop(name, None)
                for key in keys:
                    self.queue.done(key)

    def _one(self, keys: list[K]) -> None:
        try:
            again = self.reconcile(keys) or {}
        except Exception:
            log.exception(
                "%s: reconciling %d key(s) failed; retried with backoff", self.queue.name, len(keys)
            )
            for key in keys:
                self.queue.retry(key)
            return
        for key in keys:
            delay = again.get(key)
            if delay is None:
                self.queue.forget(key)
            elif delay == RETRY:
                self.queue.retry(key)
            else:
                self.queue.add_after(key, delay)


class QueueCollector(Collector):
    """`gpuplace_controller_queue_depth{queue}` (keys ready), `..._queue_delayed{queue}` (keys
    waiting for a delay or a backoff), `..._queue_adds_total{queue}`,
    `..._queue_retries_total{queue}` and `..._queue_longest_batch_seconds{queue}` (how long the
    batch in progress the longest has run): read from the queues at scrape time, nothing counted
    on their paths but two integers."""

    def __init__(self, workers: Sequence[Workers[Any]]) -> None:
        self.workers = workers

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ("queue",)
        depth = GaugeMetricFamily(
            "gpuplace_controller_queue_depth", "Keys ready in a work queue", labels=labels
        )
        delayed = GaugeMetricFamily(
            "gpuplace_controller_queue_delayed",
            "Keys of a work queue waiting for a delay or their backoff",
            labels=labels,
        )
        adds = CounterMetricFamily(
            "gpuplace_controller_queue_adds", "Keys added to a work queue", labels=labels
        )
        retries = CounterMetricFamily(
            "gpuplace_controller_queue_retries",
            "Keys of a work queue retried after a failure",
            labels=labels,
        )
        longest = GaugeMetricFamily(
            "gpuplace_controller_queue_longest_batch_seconds",
            "How long the batch in progress in a work queue the longest has run",
            labels=labels,
        )
        for workers in self.workers:
            queue = workers.queue
            depth.add_metric([queue.name], len(queue))
            delayed.add_metric([queue.name], queue.delayed())
            adds.add_metric([queue.name], queue.adds)
            retries.add_metric([queue.name], queue.retries)
            longest.add_metric([queue.name], workers.stuck(0.0))
        yield from (depth, delayed, adds, retries, longest)
