"""Which requests a server answers on its pool's threads instead of its loop, and how they wait.

The loop answers a request inline when its answer is quick (a pod admission, tens of
microseconds) and hands it to a fixed pool of threads when it may take long (a placement map's
validation, a page, a token review). An `Offload` policy says which requests go to the pool, under
which queue key, and what a request the queue refuses is answered. While its request is on the
pool a connection reads nothing more, so the queue never holds more than one request a connection.

`EveryRequest` sends every request to the pool, in one FIFO (the ops and web ports, whose handlers
may block). The webhook sends only map validations, in a queue fair between namespaces
(`webhook.validationpool`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kubeio.http11 import Request


@dataclass(frozen=True, slots=True)
class Full:
    """Why a queue refused: the refusal counted (`reason`) and the cap that was reached."""

    reason: str
    cap: int


@dataclass(frozen=True, slots=True)
class Job:
    """A request on its way to a pool thread, and where its answer goes."""

    request: Request
    remote: tuple[str, int]
    close: bool
    #: Hands the answer back to the loop's thread (any thread may call it).
    reply: Callable[[bytes], None]


class WorkQueue(Protocol):
    """Threads: the loop's thread `put`s; pool threads `get`, then `done` the key they got once
    the job is answered; `close` wakes every `get` (which returns None)."""

    def put(self, key: str, item: Job) -> Full | None: ...

    def get(self) -> tuple[str, Job] | None: ...

    def done(self, key: str) -> None: ...

    def close(self) -> None: ...


class Offload(Protocol):
    @property
    def threads(self) -> int:
        """Threads that answer the queued requests."""
        ...

    @property
    def queue(self) -> WorkQueue: ...

    def key(self, request: Request) -> str | None:
        """The queue key of a request answered on the pool; None: answered on the loop."""
        ...

    def refused(self, request: Request, full: Full, close: bool) -> bytes | None:
        """The answer to a request the queue refused; None: 503, then the connection closed."""
        ...


class Fifo:
    """One queue for every key, of at most `cap` jobs queued or running (past it: `busy`)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: collections.deque[tuple[str, Job]] = collections.deque()
        self._held = 0
        self._closed = False

    def put(self, key: str, item: Job) -> Full | None:
        with self._lock:
            if self._held >= self.cap:
                return Full("busy", self.cap)
            self._jobs.append((key, item))
            self._held += 1
            self._ready.notify()
        return None

    def get(self) -> tuple[str, Job] | None:
        with self._lock:
            while not self._jobs and not self._closed:
                self._ready.wait()
            return None if self._closed else self._jobs.popleft()

    def done(self, key: str) -> None:
        with self._lock:
            self._held -= 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._ready.notify_all()


class EveryRequest:
    """Every request on `threads` threads, first come first served, but GET and HEAD of
    `on_loop` paths, answered on the loop: the kubelet's probes (whose handlers only read a few
    fields) never wait behind the scrapes and pages of others."""

    def __init__(self, threads: int, cap: int, on_loop: frozenset[str] = frozenset()) -> None:
        self.threads = threads
        self.queue: WorkQueue = Fifo(cap)
        self._on_loop = on_loop

    def key(self, request: Request) -> str | None:
        head = request.head
        if head.method in ("GET", "HEAD") and head.target.partition("?")[0] in self._on_loop:
            return None
        return ""

    def refused(self, request: Request, full: Full, close: bool) -> bytes | None:
        return None
