"""The Flask app over TLS from one thread: a selector over the port and every connection.

A server that gives each request in flight a thread spends most of an admission's CPU, in one
process, on those threads taking the interpreter lock in turn (futex waits, context switches), not
on the admission. `LoopServer` accepts, handshakes, reads, calls the app and writes from one thread over
non-blocking sockets, so an admission costs no thread switch. Requests that may take long (a
placement map's validation, seconds for a large map) run on `validation_threads` threads instead,
so they never hold up pod admissions; they wait in a queue shared fairly between namespaces
(`webhook.fairqueue`), and their connection reads nothing more until the answer is back.

Bounded (every cap and timeout is a `ServerSettings` field; each refusal a `Refusal`, counted;
with several processes each keeps its share of the caps, `ServerSettings.per_process`):
- connections: past `max_connections` a new connection takes the place of the oldest one that
  never sent a request (a flood of idle connections cannot lock the apiserver out), or is closed;
- request bytes: each connection reads at most `CONNECTION_SHARE_BYTES` of requests on its own; a
  body larger than that reserves the rest from one pool when its head arrives, or is answered 503
  and closed: a flood of large unfinished bodies holds the pool, not the pod admissions, whose
  reviews fit in a connection's share. Bytes are read only up to what is reserved.
- time: the handshake, a request's head, the whole request, idleness and an answer left unread
  each have a timeout; a connection past one is closed.

Threads: the loop's thread owns the selector, every connection and the byte pool. A validation
thread only calls the app and hands `(connection, answer)` back through `_finished` (under
`_lock`) and a wake-up byte. `start`, `drain` and `stop` are called by the owner, once each, in
that order.
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
from dataclasses import dataclass, field

import orjson
from flask import Flask

from webhook.fairqueue import FairQueue, Full
from webhook.http11 import (
    CONTINUE,
    Head,
    RefusedError,
    Request,
    call,
    encode,
    environ,
    parse_head,
)
from webhook.limits import BytePool, Refusal
from webhook.review import Verdict, peek, render_response
from webhook.settings import CONNECTION_SHARE_BYTES, ServerSettings
from webhook.state import state_of
from webhook.tls import ServingTLS

log = logging.getLogger(__name__)

#: (method, path) answered off the loop: map validation takes seconds for a 1 MiB map.
SLOW_ROUTES = frozenset({("POST", "/validate")})
#: How often connections are checked against the timeouts and the gauges are set.
TICK_SECONDS = 1.0
_READ_SIZE = 64 * 1024
#: Past this many answer bytes waiting for a client that does not read, its next requests wait
#: (the answers are small: a patch, a denial, the metrics page).
_OUT_HIGH_WATER = 64 * 1024
_LISTENER = "listener"
_WAKE = "wake"


@dataclass(eq=False, slots=True)
class _Connection:
    sock: ssl.SSLSocket
    remote: tuple[str, int]
    since: float  # accepted, the last answer written, or the current request's first byte
    handshaken: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    written: float = 0.0  # when `out` last became non-empty or shrank
    head: Head | None = None  # of the request whose body is arriving
    granted: int = 0  # bytes reserved from the pool for the request in progress
    fresh: bool = True  # no request has started on it yet: the first to make room for another
    busy: bool = False  # a worker is answering its request
    closing: bool = False  # no more requests: close once the answers are written
    in_request: bool = False  # bytes of a request not answered yet arrived
    events: int = 0  # what the selector watches for it; 0: not registered
    closed: bool = False


class LoopServer:
    def __init__(self, app: Flask, tls: ServingTLS, settings: ServerSettings) -> None:
        self._app = app
        self._tls = tls
        self._settings = settings
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._metrics = state_of(app).metrics
        for reason in Refusal:
            self._metrics.refused.labels(reason.value)  # every series from the start, at 0
        #: This process's share of the server's caps.
        self._caps = caps = settings.per_process()
        self._bytes = BytePool(caps.pool_bytes)
        self._buffered = 0  # len(inbox) summed over the connections; loop thread only
        self._queue: FairQueue[tuple[_Connection, Request, bool]] = FairQueue(
            caps.validation_queue_per_namespace, caps.validation_queue
        )
        self._workers = [
            threading.Thread(target=self._validate, name=f"https-validate-{n}", daemon=True)
            for n in range(caps.validation_threads)
        ]
        self._lock = threading.Lock()
        self._finished: collections.deque[tuple[_Connection, bytes]] = collections.deque()
        self._connections: set[_Connection] = set()
        #: The connections no request has started on, oldest first (dict order).
        self._fresh: dict[_Connection, None] = {}
        #: The most connections and buffered bytes held at once since the start.
        self.peak_connections = 0
        self.peak_buffered_bytes = 0
        self._again: set[_Connection] = set()  # decrypted bytes left unread in the TLS layer
        self._stopping = threading.Event()
        self._deadline: float | None = None  # set once stopping: in-flight requests end by it
        self._port = 0
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def connections(self) -> int:
        """Open connections now (read from another thread: a moment's value)."""
        return len(self._connections)

    def validations(self, namespace: str) -> int:
        """Map validations of `namespace` queued or running now."""
        return self._queue.held(namespace)

    @property
    def buffered_bytes(self) -> int:
        """Request bytes buffered now, all connections together (a moment's value)."""
        return self._buffered

    def start(self) -> LoopServer:
        """Binds now, so `port` is known and errors surface here."""
        settings = self._settings
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if settings.processes > 1:  # the kernel spreads connections over the processes
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind((settings.host, settings.port))
            listener.listen(socket.SOMAXCONN)
            listener.setblocking(False)
        except OSError:
            listener.close()
            self._close_all()
            raise
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name="https", daemon=True)
        self._thread.start()
        for worker in self._workers:
            worker.start()
        log.info("serving HTTPS on %s:%d from one thread", settings.host, self._port)
        return self

    def drain(self) -> None:
        """Fails /readyz, then waits the shutdown delay so endpoints drop this replica first."""
        state_of(self._app).draining.set()
        time.sleep(self._settings.shutdown_delay_seconds)

    def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (up to the shutdown timeout)."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(self._settings.shutdown_timeout_seconds + 1)
        else:
            self._close_all()
        self._queue.close()

    def _wake(self) -> None:
        # BlockingIOError: a wake-up is pending already; OSError: the loop has ended.
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    # -- the loop's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic() + TICK_SECONDS
        try:
            while not self._done():
                timeout = 0.0 if self._again else max(0.0, next_tick - time.monotonic())
                for key, mask in self._selector.select(timeout):
                    if key.data == _LISTENER:
                        self._accept()
                    elif key.data == _WAKE:
                        self._take_finished()
                    else:
                        self._guarded(key.data, mask)
                again, self._again = self._again, set()
                for conn in again:
                    self._guarded(conn, selectors.EVENT_READ)
                now = time.monotonic()
                if now >= next_tick:
                    self._expire(now)
                    next_tick = now + TICK_SECONDS
        except Exception:
            log.exception("the HTTPS loop failed")
        finally:
            self._close_all()

    def _done(self) -> bool:
        """Once stopping: True when no request is in flight or the shutdown timeout passed."""
        if not self._stopping.is_set():
            return False
        if self._deadline is None:
            self._deadline = time.monotonic() + self._settings.shutdown_timeout_seconds
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
            # Idle connections close now; the others once their answer is written (requests
            # read from now on are answered with `Connection: close`).
            for conn in list(self._connections):
                if not self._in_flight(conn):
                    self._close(conn)
        if time.monotonic() >= self._deadline:
            return True
        return not any(self._in_flight(conn) for conn in self._connections)

    @staticmethod
    def _in_flight(conn: _Connection) -> bool:
        return conn.busy or bool(conn.out) or conn.in_request

    def _guarded(self, conn: _Connection, mask: int) -> None:
        """One connection's event; whatever fails closes that connection, never the loop."""
        if conn.closed:
            return
        try:
            self._step(conn, mask)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("closed a connection from %s: %r", conn.remote[0], exc)
            self._close(conn)
        except Exception:
            log.exception("closed a connection from %s", conn.remote[0])
            self._close(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, remote = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again on the next event
                log.warning("cannot accept a connection: %s", exc)
                return
            if not self._room():
                self._refused(Refusal.CONNECTIONS)
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # Read at each accept: ServingTLS swaps the context when the certificate changes.
                context = self._tls.context
                wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as exc:
                log.debug("dropped a connection from %s: %r", remote[0], exc)
                sock.close()
                continue
            conn = _Connection(wrapped, (str(remote[0]), int(remote[1])), time.monotonic())
            self._connections.add(conn)
            self._fresh[conn] = None
            self.peak_connections = max(self.peak_connections, len(self._connections))
            self._guarded(conn, selectors.EVENT_READ)

    def _room(self) -> bool:
        """Whether a new connection may open: under the cap, or after closing the oldest
        connection that never started a request (its client loses nothing it asked for)."""
        if len(self._connections) < self._caps.max_connections:
            return True
        oldest = next(iter(self._fresh), None)
        if oldest is None:
            return False
        self._refused(Refusal.EVICTED)
        self._close(oldest)
        return True

    def _refused(self, reason: Refusal) -> None:
        self._metrics.refused.labels(reason.value).inc()

    def _step(self, conn: _Connection, mask: int) -> None:
        if not conn.handshaken:
            if not self._handshake(conn):
                return
            mask = selectors.EVENT_READ  # a request may have come with the handshake's end
        if mask & selectors.EVENT_WRITE:
            self._write(conn)
        if mask & selectors.EVENT_READ and not conn.closed:
            self._read(conn)
        if not conn.closed:
            self._serve(conn)

    def _handshake(self, conn: _Connection) -> bool:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return False
        conn.handshaken = True
        conn.since = time.monotonic()
        return True

    def _wants_read(self, conn: _Connection) -> bool:
        """Reads stop while a request is on a worker, after the last request, while the client
        leaves answers unread, and once the connection holds all the bytes it may."""
        return not (
            conn.busy
            or conn.closing
            or len(conn.out) >= _OUT_HIGH_WATER
            or len(conn.inbox) >= CONNECTION_SHARE_BYTES + conn.granted
        )

    def _read(self, conn: _Connection) -> None:
        while self._wants_read(conn):
            room = CONNECTION_SHARE_BYTES + conn.granted - len(conn.inbox)
            try:
                data = conn.sock.recv(min(_READ_SIZE, room))
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            except ssl.SSLZeroReturnError:
                data = b""
            if not data:  # the client is done sending: answer what came, then close
                conn.closing = True
                return
            if not conn.in_request:
                conn.in_request = True
                conn.since = time.monotonic()
            if conn.fresh:
                conn.fresh = False
                self._fresh.pop(conn, None)
            conn.inbox += data
            self._buffered += len(data)
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self._buffered)

    def _drop_inbox(self, conn: _Connection, size: int | None = None) -> None:
        """Removes the first `size` bytes of the inbox (all of them: None), giving its memory
        back: a kept-alive connection does not keep the capacity of a large body it carried."""
        removed = len(conn.inbox) if size is None else size
        conn.inbox = conn.inbox[removed:] if size is not None else bytearray()
        self._buffered -= removed

    def _release(self, conn: _Connection) -> None:
        """Gives the pool back what the connection's last request reserved."""
        if conn.granted:
            self._bytes.give(conn.granted)
            conn.granted = 0

    def _serve(self, conn: _Connection) -> None:
        """Answers the complete requests in the inbox, in order, then writes and watches."""
        answered = False
        while not conn.busy and len(conn.out) < _OUT_HIGH_WATER and conn.inbox:
            try:
                request = self._next_request(conn)
            except RefusedError as refusal:
                log.info("refused a request from %s: %s", conn.remote[0], refusal)
                self._answered(conn, refusal.answer())
                self._drop_inbox(conn)
                conn.head = None
                conn.closing = True
                break
            if request is None:
                break
            close = not request.head.keep_alive or self._stopping.is_set()
            conn.closing = conn.closing or close
            if (request.head.method, request.head.target.partition("?")[0]) in SLOW_ROUTES:
                if self._queue_validation(conn, request, close):
                    break  # queued: the rest waits for its answer
            else:
                self._answered(conn, self._answer(conn, request, close))
                self._release(conn)
            answered = True
            if close:
                self._drop_inbox(conn)
                break
        if answered:  # the next request's time starts now, also when it is already arriving
            conn.since = time.monotonic()
        conn.in_request = bool(conn.inbox) or conn.head is not None
        self._write(conn)
        if not conn.closed and self._wants_read(conn) and conn.sock.pending():
            # Decrypted already: the selector will not report these bytes.
            self._again.add(conn)

    def _answered(self, conn: _Connection, answer: bytes) -> None:
        if not conn.out:
            conn.written = time.monotonic()
        conn.out += answer

    def _next_request(self, conn: _Connection) -> Request | None:
        if conn.head is None:
            head = parse_head(conn.inbox, self._settings.max_body_bytes)
            if head is None:
                return None
            self._drop_inbox(conn, head.size)
            if head.length > CONNECTION_SHARE_BYTES:
                # What does not fit in the connection's own share is reserved before it is
                # read; past the pool the request is refused now, not left to hold what it has.
                if not self._bytes.take(head.length - CONNECTION_SHARE_BYTES):
                    self._refused(Refusal.BUFFER)
                    raise RefusedError(
                        503,
                        "the webhook holds as many request bytes as it may; send again shortly",
                    )
                conn.granted = head.length - CONNECTION_SHARE_BYTES
            conn.head = head
            if head.expects_continue and len(conn.inbox) < head.length:
                self._answered(conn, CONTINUE)
        head = conn.head
        if len(conn.inbox) < head.length:
            return None
        with memoryview(conn.inbox) as view:
            body = bytes(view[: head.length])
        self._drop_inbox(conn, head.length)
        conn.head = None
        return Request(head, body)

    def _queue_validation(self, conn: _Connection, request: Request, close: bool) -> bool:
        """Queues the request under its review's namespace (True), or answers at once that the
        validator is busy: as a denied review, which kubectl and ArgoCD show as it is."""
        seen = peek(request.body)
        namespace = seen[1] if seen else ""
        full = self._queue.put(namespace, (conn, request, close))
        if full is None:
            conn.busy = True
            return True
        self._refused(full.refusal)
        self._release(conn)
        if seen is None:  # not a review: nothing to deny, nothing worth a place in the queue
            self._answered(conn, RefusedError(503, "the validator is busy").answer())
            self._drop_inbox(conn)  # framing is fine, but nothing more is read after a 503
            conn.closing = True
        else:
            self._answered(conn, _busy(seen[0], namespace, full, close))
        return False

    def _answer(self, conn: _Connection, request: Request, close: bool) -> bytes:
        env = environ(request, (self._settings.host, self._port), conn.remote)
        env["wsgi.multiprocess"] = self._settings.processes > 1
        try:
            return call(self._app, env, close)
        except Exception:
            # Flask answers the app's own failures with 500; this is a failure around it.
            log.exception("%s %s failed", request.head.method, request.head.target[:200])
            return RefusedError(500, "the server failed to answer").answer()

    def _validate(self) -> None:
        """A validation thread: answers queued requests until the queue is closed."""
        while (taken := self._queue.get()) is not None:
            namespace, (conn, request, close) = taken
            try:
                answer = self._answer(conn, request, close)
            finally:
                self._queue.done(namespace)
            with self._lock:
                self._finished.append((conn, answer))
            self._wake()

    def _take_finished(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            finished = list(self._finished)
            self._finished.clear()
        for conn, answer in finished:
            conn.busy = False
            if conn.closed:
                self._release(conn)
                continue
            conn.since = time.monotonic()
            self._release(conn)
            self._answered(conn, answer)
            self._guarded(conn, selectors.EVENT_READ)

    def _write(self, conn: _Connection) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                break
            del conn.out[:sent]
            conn.written = time.monotonic()
        if not conn.out and conn.closing and not conn.busy:
            self._close(conn)
            return
        events = selectors.EVENT_WRITE if conn.out else 0
        if self._wants_read(conn):
            events |= selectors.EVENT_READ
        self._watch(conn, events)

    def _watch(self, conn: _Connection, events: int) -> None:
        if events == conn.events:
            return
        if events == 0:
            self._selector.unregister(conn.sock)
        elif conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _expire(self, now: float) -> None:
        settings = self._settings
        for conn in list(self._connections):
            if conn.busy:
                continue
            reason: Refusal | None = None
            if not conn.handshaken:
                limit, reason = settings.handshake_timeout_seconds, Refusal.HANDSHAKE_TIMEOUT
            elif conn.out:
                limit, reason = settings.write_timeout_seconds, Refusal.WRITE_TIMEOUT
            elif conn.in_request and conn.head is None:
                limit, reason = settings.head_timeout_seconds, Refusal.HEAD_TIMEOUT
            elif conn.in_request:
                limit, reason = settings.request_timeout_seconds, Refusal.BODY_TIMEOUT
            else:
                limit = settings.idle_timeout_seconds
            since = conn.written if reason is Refusal.WRITE_TIMEOUT else conn.since
            if now - since > limit:
                log.debug("closed a connection from %s: silent for %.0f s", conn.remote[0], limit)
                if reason is not None:
                    self._refused(reason)
                self._close(conn)
        self._metrics.connections.set(len(self._connections))
        self._metrics.buffered_bytes.set(self._buffered)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._connections.discard(conn)
        self._fresh.pop(conn, None)
        self._again.discard(conn)
        self._drop_inbox(conn)
        if not conn.busy:  # else the request keeps its bytes until its worker is done with them
            self._release(conn)
        if conn.events:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
            conn.events = 0
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._connections):
            self._close(conn)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def _busy(uid: str, namespace: str, full: Full, close: bool) -> bytes:
    """The review answering `uid` that the validator is busy: denied with 429, nothing stored."""
    if full.refusal is Refusal.VALIDATION_NAMESPACE:
        held = f"{full.cap} placement maps of namespace {namespace or '(cluster)'}"
    else:
        held = f"{full.cap} placement maps"
    verdict = Verdict.deny(
        f"gpuplace: the placement-map validator is busy with {held}, the most it queues; nothing "
        f"was changed: apply again in a few seconds",
        code=429,
        reason="TooManyRequests",
    )
    body = orjson.dumps(render_response(uid, verdict))
    return encode("200 OK", [("Content-Type", "application/json")], body, close=close)
