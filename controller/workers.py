"""A fixed set of threads that run calls in the order they were submitted.

The binder submits one Binding call per pod; `concurrent.futures.ThreadPoolExecutor` builds a
Future (a condition and its lock) and probes an idle-thread semaphore on every submit, which cost a
tenth of the binder's CPU per pod in a drain. Nothing here waits on a call's result, so a call is
put on a queue and its exception is logged by the thread that ran it.

Contract: any thread may `submit`; the threads start on the first submit; `shutdown` is called once,
by the owner, and ends every thread after the calls still queued (or drops them with `cancel`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_Call = tuple[Callable[..., object], tuple[Any, ...]] | None  # None: the thread ends


class Workers:
    def __init__(self, count: int, name: str) -> None:
        self._count = count
        self._name = name
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._closed = False

    @property
    def count(self) -> int:
        """The threads that run the calls (started on the first submit)."""
        return self._count

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        if self._closed:
            return  # stopping: the call would find its owner stopped too
        if not self._threads:
            self._start()
        self._calls.put((fn, args))

    def _start(self) -> None:
        with self._start_lock:
            if self._threads:
                return
            threads = [
                threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
                for i in range(self._count)
            ]
            for thread in threads:
                thread.start()
            self._threads = threads

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, args = call
            try:
                fn(*args)
            except Exception:
                log.exception("%s failed", getattr(fn, "__qualname__", fn))

    def shutdown(self, *, cancel: bool = False) -> None:
        """Ends the threads once the queued calls ran (or, with `cancel`, without running
        them), and waits for the calls in progress."""
        self._closed = True
        if cancel:
            try:
                while True:
                    self._calls.get_nowait()
            except queue.Empty:
                pass
        with self._start_lock:
            threads = self._threads
        for _ in threads:
            self._calls.put(None)
        for thread in threads:
            thread.join()
