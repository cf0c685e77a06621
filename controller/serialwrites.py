"""Writes to one object from a pool of threads, in order: per key at most one write runs at a time,
and the writes asked for run in the order they were asked for. Two writes of one pod's condition
handed to two worker threads could land in either order and leave the older value on the pod for
good (ClaimPending after DeviceBusy, Unverifiable after Adopted); here a write asked for while
another of its key runs waits for it, and runs right after it on the same thread."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


class SerialWrites:
    def __init__(self, submit: Callable[..., object]) -> None:
        self._submit = submit  # runs a call on a worker thread
        self._lock = threading.Lock()
        self._queued: dict[str, deque[Callable[[], None]]] = {}

    def put(self, key: str, write: Callable[[], None]) -> None:
        with self._lock:
            queue = self._queued.get(key)
            if queue is not None:
                queue.append(write)  # the thread draining this key runs it next
                return
            self._queued[key] = deque([write])
        self._submit(self._drain, key)

    def drop(self, key: str) -> None:
        """Forgets the writes not started yet (the object is gone or no longer needs them)."""
        with self._lock:
            queue = self._queued.get(key)
            if queue is not None:
                queue.clear()

    def drop_all(self) -> None:
        """Forgets every write not started yet (the writer stops)."""
        with self._lock:
            for queue in self._queued.values():
                queue.clear()

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                queue = self._queued[key]
                if not queue:
                    del self._queued[key]
                    return
                write = queue.popleft()
            write()
