"""One HTTP/1.1 server for every port a component opens: a WSGI app, over TLS or not, served
from one thread, a selector over the port and every connection.

A server that gives each request in flight a thread spends most of a quick request's CPU, in one
process, on those threads taking the interpreter lock in turn (futex waits, context switches), not
on the request. `Server` accepts, handshakes, reads, calls the app and writes from one thread over
non-blocking sockets, so a pod admission costs no thread switch. Requests that may take long run
on a fixed pool of threads instead, chosen by an `Offload` policy (`kubeio.pool`), so they never
hold up the others; their connection reads nothing more until the answer is back.

Bounded (every cap and timeout is a `Bounds` field; each refusal counted through `refused`):
- connections: past `max_connections` a new connection takes the place of the oldest one that
  never sent a request (a flood of idle connections cannot lock the apiserver or the kubelet's
  probe out), or is closed;
- request bytes: each connection reads at most `connection_share_bytes` of requests on its own; a
  body larger than that reserves the rest from one pool when its head arrives, or is answered 503
  and closed: a flood of large unfinished bodies holds the pool, not the small requests, which
  fit in a connection's share. Bytes are read only up to what is reserved.
- time: the handshake, a request's head, the whole request, idleness and an answer left unread
  each have a timeout; a connection past one is closed.
- threads: the loop's, and the pool's `Offload.threads`.

Threads: the loop's thread owns the selector, every connection and the byte pool. A pool thread
only calls the app and hands `(connection, answer)` back through `_finished` (under `_lock`) and
a wake-up byte. `start` and `stop` are called by the owner, once each, in that order.
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
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol

from kubeio.bounds import Bounds, BytePool, Refusal
from kubeio.http11 import CONTINUE, Head, RefusedError, Request, call, environ, parse_head
from kubeio.pool import Job, Offload

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger(__name__)

#: How often connections are checked against the timeouts and the load is reported.
TICK_SECONDS = 1.0
_READ_SIZE = 64 * 1024
#: Past this many answer bytes waiting for a client that does not read, its next requests wait
#: (the answers are small: a patch, a denial, the metrics page).
_OUT_HIGH_WATER = 64 * 1024
_LISTENER = "listener"
_WAKE = "wake"


class ContextSource(Protocol):
    """Where the TLS context comes from; read at each accept, so a new certificate serves new
    connections while open ones keep theirs (`webhook.tls.ServingTLS`)."""

    @property
    def context(self) -> ssl.SSLContext: ...


def _no_count(reason: str) -> None:
    pass


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket  # an ssl.SSLSocket over TLS
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


class Server:
    """Serves `app` on host:port within `bounds`; `name` names its threads.

    `tls`: None serves plain HTTP. `offload`: which requests go to the pool (None: none; every
    request is answered on the loop). `refused(reason)` counts each refusal, `load(connections,
    buffered_bytes)` is told the load once a tick; both on the loop's thread. `reuse_port`: several
    processes bind the port (SO_REUSEPORT) and the kernel spreads connections over them.
    """

    def __init__(
        self,
        name: str,
        app: WSGIApplication,
        host: str,
        port: int,
        bounds: Bounds,
        *,
        tls: ContextSource | None = None,
        offload: Offload | None = None,
        refused: Callable[[str], None] = _no_count,
        load: Callable[[int, int], None] | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.name = name
        self._app = app
        self._host = host
        self._requested_port = port
        self._bounds = bounds
        self._tls = tls
        self._offload = offload
        self._count = refused
        self._load = load
        self._reuse_port = reuse_port
        self._scheme = "http" if tls is None else "https"
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._bytes = BytePool(bounds.pool_bytes)
        self._buffered = 0  # len(inbox) summed over the connections; loop thread only
        threads = offload.threads if offload is not None else 0
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-pool-{n}", daemon=True)
            for n in range(threads)
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

    @property
    def buffered_bytes(self) -> int:
        """Request bytes buffered now, all connections together (a moment's value)."""
        return self._buffered

    def start(self) -> Server:
        """Binds now, so `port` is known and errors (a port in use) surface to the caller."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self._reuse_port:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind((self._host, self._requested_port))
            listener.listen(self._bounds.backlog)
            listener.setblocking(False)
        except OSError:
            listener.close()
            self._close_all()
            raise
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        for worker in self._workers:
            worker.start()
        log.info(
            "%s: serving %s on %s:%d from one thread and %d more",
            self.name,
            self._scheme.upper(),
            self._host,
            self._port,
            len(self._workers),
        )
        return self

    def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (up to the shutdown timeout)."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(self._bounds.shutdown_timeout_seconds + 1)
        else:
            self._close_all()
        if self._offload is not None:
            self._offload.queue.close()

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
            log.exception("%s: the loop failed", self.name)
        finally:
            self._close_all()

    def _done(self) -> bool:
        """Once stopping: True when no request is in flight or the shutdown timeout passed."""
        if not self._stopping.is_set():
            return False
        if self._deadline is None:
            self._deadline = time.monotonic() + self._bounds.shutdown_timeout_seconds
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
            log.debug("%s: closed a connection from %s: %r", self.name, conn.remote[0], exc)
            self._close(conn)
        except Exception:
            log.exception("%s: closed a connection from %s", self.name, conn.remote[0])
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
                if self._tls is not None:
                    # Read at each accept: the context is swapped when the certificate changes.
                    context = self._tls.context
                    sock = context.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
            except (OSError, ValueError) as exc:
                log.debug("dropped a connection from %s: %r", remote[0], exc)
                sock.close()
                continue
            conn = _Connection(sock, (str(remote[0]), int(remote[1])), time.monotonic())
            conn.handshaken = self._tls is None
            self._connections.add(conn)
            self._fresh[conn] = None
            self.peak_connections = max(self.peak_connections, len(self._connections))
            self._guarded(conn, selectors.EVENT_READ)

    def _room(self) -> bool:
        """Whether a new connection may open: under the cap, or after closing the oldest
        connection that never started a request (its client loses nothing it asked for)."""
        if len(self._connections) < self._bounds.max_connections:
            return True
        oldest = next(iter(self._fresh), None)
        if oldest is None:
            return False
        self._refused(Refusal.EVICTED)
        self._close(oldest)
        return True

    def _refused(self, reason: str) -> None:
        try:
            self._count(reason)
        except Exception:  # a counter's failure must not take the loop down
            log.exception("%s: counting a refusal failed", self.name)

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
        assert isinstance(conn.sock, ssl.SSLSocket)
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
            or len(conn.inbox) >= self._bounds.connection_share_bytes + conn.granted
        )

    def _read(self, conn: _Connection) -> None:
        while self._wants_read(conn):
            room = self._bounds.connection_share_bytes + conn.granted - len(conn.inbox)
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
                log.info("%s: refused a request from %s: %s", self.name, conn.remote[0], refusal)
                if refusal.refusal is not None:
                    self._refused(refusal.refusal)
                self._answered(conn, refusal.answer())
                self._drop_inbox(conn)
                conn.head = None
                conn.closing = True
                break
            if request is None:
                break
            close = (
                not request.head.keep_alive
                or not self._bounds.keep_alive
                or self._stopping.is_set()
            )
            conn.closing = conn.closing or close
            key = self._offload.key(request) if self._offload is not None else None
            if key is not None:
                if self._offloaded(conn, key, request, close):
                    break  # queued: the rest waits for its answer
            else:
                self._answered(conn, self._answer(request, conn.remote, close))
                self._release(conn)
            answered = True
            if close:
                self._drop_inbox(conn)
                break
        if answered:  # the next request's time starts now, also when it is already arriving
            conn.since = time.monotonic()
        conn.in_request = bool(conn.inbox) or conn.head is not None
        self._write(conn)
        if (
            not conn.closed
            and self._wants_read(conn)
            and isinstance(conn.sock, ssl.SSLSocket)
            and conn.sock.pending()
        ):
            # Decrypted already: the selector will not report these bytes.
            self._again.add(conn)

    def _answered(self, conn: _Connection, answer: bytes) -> None:
        if not conn.out:
            conn.written = time.monotonic()
        conn.out += answer

    def _next_request(self, conn: _Connection) -> Request | None:
        if conn.head is None:
            bounds = self._bounds
            head = parse_head(conn.inbox, bounds.max_body_bytes, bounds.max_head_bytes)
            if head is None:
                return None
            self._drop_inbox(conn, head.size)
            beyond = head.length - bounds.connection_share_bytes
            if beyond > 0:
                # What does not fit in the connection's own share is reserved before it is
                # read; past the pool the request is refused now, not left to hold what it has.
                if not self._bytes.take(beyond):
                    raise RefusedError(
                        503,
                        "the server holds as many request bytes as it may; send again shortly",
                        Refusal.BUFFER,
                    )
                conn.granted = beyond
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

    def _offloaded(self, conn: _Connection, key: str, request: Request, close: bool) -> bool:
        """Queues the request for the pool under `key` (True), or answers at once what the
        policy answers a request its queue refuses (by default 503, then closed)."""
        assert self._offload is not None
        job = Job(request, conn.remote, close, partial(self._finish, conn))
        full = self._offload.queue.put(key, job)
        if full is None:
            conn.busy = True
            return True
        self._refused(full.reason)
        self._release(conn)
        answer = self._offload.refused(request, full, close)
        if answer is None:
            self._answered(
                conn, RefusedError(503, "the server is busy; send again shortly").answer()
            )
            self._drop_inbox(conn)  # framing is fine, but nothing more is read after a 503
            conn.closing = True
        else:
            self._answered(conn, answer)
        return False

    def _answer(self, request: Request, remote: tuple[str, int], close: bool) -> bytes:
        env = environ(request, (self._host, self._port), remote, self._scheme)
        env["wsgi.multiprocess"] = self._reuse_port
        try:
            return call(self._app, env, close)
        except Exception:
            # Flask answers the app's own failures with 500; this is a failure around it.
            log.exception(
                "%s: %s %s failed", self.name, request.head.method, request.head.target[:200]
            )
            return RefusedError(500, "the server failed to answer").answer()

    def _work(self) -> None:
        """A pool thread: answers queued requests until the queue is closed."""
        assert self._offload is not None
        queue = self._offload.queue
        while (taken := queue.get()) is not None:
            key, job = taken
            try:
                answer = self._answer(job.request, job.remote, job.close)
            finally:
                queue.done(key)
            job.reply(answer)

    def _finish(self, conn: _Connection, answer: bytes) -> None:
        """Hands a pool thread's answer to the loop's thread."""
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
        settings = self._bounds
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
                log.debug(
                    "%s: closed a connection from %s: silent for %.0f s",
                    self.name,
                    conn.remote[0],
                    limit,
                )
                if reason is not None:
                    self._refused(reason)
                self._close(conn)
        if self._load is not None:
            self._load(len(self._connections), self._buffered)

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
