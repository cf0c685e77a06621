"""Work queued per tenant and taken round-robin between tenants, bounded per tenant and in all.

Map validation takes seconds for a large map and runs on a few threads. With one FIFO, a namespace
that sends many (a loop of server-side dry runs) would hold every other namespace's map behind
its own; here each namespace waits in its own FIFO, the workers take one item from each waiting
namespace in turn, and past its cap a namespace is refused at once while the others still queue.

Threads: any thread may `put`; worker threads `get`, then call `done` for the key they got once
its work is finished. Everything runs under one lock; `get` waits on its condition.
"""

from __future__ import annotations

import collections
import threading
from enum import StrEnum
from typing import Generic, TypeVar

from kubeio.pool import Full

T = TypeVar("T")


class QueueRefusal(StrEnum):
    """Why `put` refused (`Full.reason`), counted with the server's own refusals."""

    #: Past the cap of the key (a namespace's map validations).
    NAMESPACE = "validation_namespace"
    #: Past the cap of all keys together.
    QUEUE = "validation_queue"


class FairQueue(Generic[T]):
    def __init__(self, per_key: int, total: int) -> None:
        if per_key < 1 or total < 1:
            raise ValueError("a fair queue's caps must be at least 1")
        self.per_key = per_key
        self.total = total
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queues: dict[str, collections.deque[T]] = {}
        self._turns: collections.deque[str] = collections.deque()  # keys with queued items
        self._held: collections.Counter[str] = collections.Counter()  # queued + running, per key
        self._count = 0  # queued + running, every key
        self._closed = False

    def put(self, key: str, item: T) -> Full | None:
        """Queues `item` for `key`; what refused it when a cap is reached (nothing queued)."""
        with self._lock:
            if self._held[key] >= self.per_key:
                return Full(QueueRefusal.NAMESPACE, self.per_key)
            if self._count >= self.total:
                return Full(QueueRefusal.QUEUE, self.total)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = collections.deque()
                self._turns.append(key)
            queue.append(item)
            self._held[key] += 1
            self._count += 1
            self._ready.notify()
        return None

    def get(self) -> tuple[str, T] | None:
        """The next item, from the key whose turn it is; blocks; None once closed."""
        with self._lock:
            while not self._turns and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            key = self._turns.popleft()
            queue = self._queues[key]
            item = queue.popleft()
            if queue:
                self._turns.append(key)  # its next item waits for every other key's turn
            else:
                del self._queues[key]
            return key, item

    def done(self, key: str) -> None:
        """The work of an item `get` returned for `key` is finished: its place is free."""
        with self._lock:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
            self._count -= 1

    def held(self, key: str) -> int:
        with self._lock:
            return self._held[key]

    def close(self) -> None:
        """Wakes every waiting `get` (which returns None); queued items are dropped."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()
