"""Many requests in flight from one thread: non-blocking keep-alive connections and a selector.

`Kube.send` holds a thread for each request in flight. A binder with a hundred Bindings in flight
then runs a hundred threads, and in one Python process most of what each request costs is those
threads taking the interpreter lock in turn (a futex wait and a context switch each time), not the
request. `RequestLoop` sends them all from one thread: each request is written whole on an idle
connection (a new one is opened, TCP and TLS without blocking, by `kubeio.dialer`, while fewer
than `connections` are open), and its answer is read when its socket is readable, by
`kubeio.http11.ResponseReader` (llhttp).

`warm(count)` opens connections ahead of any request (a binder that is about to start binding a
backlog): otherwise the first `connections` requests each wait for TCP and TLS, on the same
thread that sends the rest.

Contract: `submit` and `warm` from any thread; `done` runs on the loop's thread, once per
request, and must be quick (it is the loop); `drain` and then `close` once, by the owner. `drain`
ends the sending: from its call on nothing more is written (what is queued, submitted later or
due for a resend fails with a `FencedError`, unsent), and it waits, bounded, for the answers to
what was already written. `close` fails what is still unanswered with a transport error. A request's `guard` is asked on the loop's thread immediately
before its one write; when it says no, nothing is sent and `done` gets a `FencedError`. A
kept-alive connection that the server closed before answering a request's first byte is replaced
and the request sent once more (the guard asked again), as `Kube.send` does.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kubeio.client import Kube, Response
from kubeio.dialer import Connection, Dialer, encode
from kubeio.errors import APIError, APITransportError, FencedError, error_for
from kubeio.http11 import ProtocolError, ResponseReader
from kubeio.requests import Request

log = logging.getLogger(__name__)

Done = Callable[[Response | APIError], None]
_READ_SIZE = 64 * 1024
#: How often the loop looks for requests past their timeout.
_TICK_SECONDS = 0.5
#: A connection with no request for this long is closed (as Go's http.Transport does): a leader
#: that bound a backlog, or warmed its connections for one, does not hold them all forever.
IDLE_SECONDS = 90.0


@dataclass(slots=True)
class _Job:
    request: Request
    done: Done
    guard: Callable[[], bool] | None
    retried: bool = False


_Connection = Connection[_Job]


def answer_error(answer: Response | APIError) -> APIError | None:
    """What a request's answer means to its caller: None when it succeeded, else the error
    `Kube.request` would have raised for it."""
    if isinstance(answer, APIError):
        return answer
    return None if answer.status < 300 else error_for(answer.status, answer.data)


class Sender(Protocol):
    """What sends a component's requests without a thread each (`RequestLoop`; tests: a fake)."""

    def submit(
        self, request: Request, done: Done, guard: Callable[[], bool] | None = None
    ) -> None: ...

    def warm(self, count: int) -> None: ...

    def drain(self, timeout: float) -> bool: ...

    def close(self) -> None: ...

    def alive(self) -> bool: ...


def _unsent(job: _Job) -> FencedError:
    return FencedError(0, "Fenced", f"{job.request.describe()}: not sent, the sender is draining")


class RequestLoop:
    """Sends `Kube` requests from one thread over up to `connections` keep-alive connections."""

    def __init__(self, kube: Kube, connections: int, name: str = "requests") -> None:
        if connections < 1:
            raise ValueError("a request loop needs at least one connection")
        self._kube = kube
        self._limit = connections
        self._endpoint = kube.endpoint()
        self._timeout = kube.settings.timeout_seconds
        self._selector = selectors.DefaultSelector()
        self._dialer = Dialer(self._endpoint, self._selector)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._queue: collections.deque[_Job] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        #: Set by `drain`: nothing more is written (under _lock).
        self._draining = False
        #: Set by the loop's thread once draining and nothing written is still unanswered.
        self._drained = threading.Event()
        self._warm = 0  # connections still to open ahead of requests (under _lock)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------
    def submit(self, request: Request, done: Done, guard: Callable[[], bool] | None = None) -> None:
        job = _Job(request, done, guard)
        with self._lock:
            closed, draining = self._closed, self._draining
            if not closed and not draining:
                self._queue.append(job)
        if closed:
            done(APITransportError(0, "Transport", f"{request.describe()}: the loop is closed"))
            return
        if draining:
            done(_unsent(job))
            return
        self._wake()

    def warm(self, count: int) -> None:
        """Opens up to `count` connections (no more than the loop may hold) with no request yet.
        One that fails is dropped: a request opens its own when it finds none idle."""
        with self._lock:
            self._warm = max(self._warm, min(count, self._limit))
        self._wake()

    def drain(self, timeout: float) -> bool:
        """Stops sending and waits up to `timeout` seconds for the answers to the requests already
        written (each of which still ends by its own timeout). True when none is unanswered: then
        nothing of this loop's can reach the apiserver any more."""
        with self._lock:
            if self._closed:
                return not self._open_jobs()
            self._draining = True
        self._wake()
        return self._drained.wait(timeout)

    def _open_jobs(self) -> bool:
        return any(conn.job is not None for conn in list(self._open))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(10)

    def alive(self) -> bool:
        """Whether the loop's thread runs (it ends on `close`, or on a failure of its own)."""
        return self._thread.is_alive()

    def _wake(self) -> None:
        # BlockingIOError: a wake is already pending; OSError: the loop has ended.
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    # -- the loop's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic() + _TICK_SECONDS
        try:
            while True:
                with self._lock:
                    closed = self._closed
                if closed:
                    break
                self._check_drained()
                self._start_queued()
                timeout = max(0.0, next_tick - time.monotonic())
                for key, mask in self._selector.select(timeout):
                    conn = key.data
                    if conn is None:
                        self._drain_wake()
                        continue
                    self._step(conn, mask)
                now = time.monotonic()
                if now >= next_tick:
                    self._expire(now)
                    next_tick = now + _TICK_SECONDS
        except Exception:
            log.exception("the request loop failed")
        finally:
            self._shutdown()

    def _check_drained(self) -> None:
        """While draining: fails what is queued unsent, and says so once nothing is in flight."""
        with self._lock:
            if not self._draining:
                return
            queued = list(self._queue)
            self._queue.clear()
        for job in queued:
            job.done(_unsent(job))
        if not self._open_jobs():
            self._drained.set()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _start_queued(self) -> None:
        while True:
            conn = self._idle.pop() if self._idle else None
            if conn is None and len(self._open) >= self._limit:
                return
            with self._lock:
                job = self._queue.popleft() if self._queue else None
            if job is None:
                if conn is not None:
                    self._idle.append(conn)
                self._open_warm()
                return
            if conn is None:
                self._connect(job)
            else:
                self._send(conn, job)

    def _open_warm(self) -> None:
        while len(self._open) < self._limit:
            with self._lock:
                if self._warm <= 0:
                    return
                self._warm -= 1
            self._connect(None)

    def _connect(self, job: _Job | None) -> None:
        try:
            conn = self._dialer.open(job, time.monotonic() + self._timeout)
        except ConnectionError as exc:
            self._fail(job, str(exc))
            return
        self._open.add(conn)

    def _step(self, conn: _Connection, mask: int) -> None:
        try:
            if conn.state == "connecting":
                if self._dialer.connected(conn):
                    self._ready(conn)
            elif conn.state == "handshaking":
                if self._dialer.handshake(conn):
                    self._ready(conn)
            elif conn.state == "writing":
                self._write(conn)
            elif conn.state == "reading":
                self._read(conn)
            elif conn.state == "idle":
                self._idle_readable(conn)
        except (OSError, ProtocolError, ValueError) as exc:
            self._broken(conn, exc)

    def _ready(self, conn: _Connection) -> None:
        """Connected (and TLS set up): its first request goes out."""
        job, conn.job = conn.job, None
        conn.state = "idle"
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        if job is not None:
            self._send(conn, job)
        else:
            conn.deadline = time.monotonic() + IDLE_SECONDS
            self._idle.append(conn)

    def _send(self, conn: _Connection, job: _Job) -> None:
        request = job.request
        with self._lock:
            draining = self._draining
        if draining:
            self._idle.append(conn)
            job.done(_unsent(job))
            return
        if job.guard is not None and not job.guard():
            self._idle.append(conn)
            job.done(FencedError(0, "Fenced", f"{request.describe()}: not sent, guard failed"))
            return
        conn.job = job
        if conn.answer is None:
            conn.answer = ResponseReader()
        conn.answer.expect()
        conn.deadline = time.monotonic() + self._timeout
        conn.out = encode(request, self._kube.headers, self._endpoint[1])
        conn.state = "writing"
        try:
            self._write(conn)
        except (OSError, ValueError) as exc:
            self._broken(conn, exc)

    def _write(self, conn: _Connection) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
                return
            conn.out = conn.out[sent:]
        conn.state = "reading"
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._read(conn)

    def _read(self, conn: _Connection) -> None:
        answer = conn.answer
        assert answer is not None
        ended = False  # the server closed the connection (after its answer, or before it)
        while True:
            try:
                data = conn.sock.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                return
            if not data:
                ended = True
                break
            answer.feed(data)
        if not answer.complete:
            if ended:
                raise ConnectionResetError("closed by the server")
            return
        job, conn.job = conn.job, None
        conn.answered_before = True
        if not answer.keep_alive or ended:
            self._discard(conn)
        else:
            conn.state = "idle"
            conn.deadline = time.monotonic() + IDLE_SECONDS
            self._idle.append(conn)
        if job is not None:
            job.done(Response(answer.status, bytes(answer.body)))

    def _idle_readable(self, conn: _Connection) -> None:
        """Readable with no request on it: the server closed it, or (TLS 1.3) sent the session
        tickets that follow a handshake, which a connection opened ahead of requests reads here."""
        try:
            data = conn.sock.recv(_READ_SIZE)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return  # TLS records only: still usable
        if data:
            log.debug("%d bytes from the server on an idle connection: closed", len(data))
        self._discard(conn)

    def _broken(self, conn: _Connection, exc: BaseException) -> None:
        """The connection failed: its request is sent again on a new one when nothing of the
        answer came and the connection had served before (closed while idle), else it fails."""
        job, conn.job = conn.job, None
        retry = (
            job is not None
            and not job.retried
            and conn.answered_before
            and conn.answer is not None
            and not conn.answer.received
            and isinstance(exc, (ConnectionResetError, BrokenPipeError))
        )
        self._discard(conn)
        if job is None:
            return
        if retry:
            job.retried = True
            with self._lock:
                self._queue.appendleft(job)
            return
        self._fail(job, str(exc) or type(exc).__name__)

    def _discard(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _fail(self, job: _Job | None, message: str) -> None:
        if job is None:
            log.debug("a connection opened ahead of requests failed: %s", message)
            return
        job.done(APITransportError(0, "Transport", f"{job.request.describe()}: {message}"))

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._open if c.deadline <= now]:
            job, conn.job = conn.job, None
            self._discard(conn)
            if job is not None:
                self._fail(job, f"no answer within {self._timeout:.0f} s")

    def _shutdown(self) -> None:
        with self._lock:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
        for conn in list(self._open):
            job, conn.job = conn.job, None
            self._discard(conn)
            if job is not None:
                queued.append(job)
        for job in queued:
            self._fail(job, "the loop is closed")
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
