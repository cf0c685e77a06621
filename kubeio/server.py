"""One HTTP/1.1 server for every port a component opens: a WSGI app, over TLS or not, served
from one thread, a selector over the port and every connection.

A server that gives each request in flight a thread spends most of a quick request's CPU, in one
process, on those threads taking the interpreter lock in turn (futex waits, context switches), not
on the request. `Server` accepts, handshakes, reads, calls the app and writes from one thread over
non-blocking sockets, so a pod admission costs no thread switch. Requests that may take long run
on a fixed pool of threads instead, chosen by an `Offload` policy (`kubeio.pool`), so they never
hold up the others; their connection reads nothing more until the answer is back.

Bounded (every cap and timeout is a `Bounds` field; each refusal counted through `refused`):
- connections: past its client address's cap (`Bounds.per_client`) or `max_connections` a new
  connection takes the place of the connection that has waited the longest on its client, that
  client's or, of the client holding the most, the port's (`kubeio.acceptor.port_victim`): no
  client holds the port against the apiserver or the kubelet's probe; it is closed only while
  every candidate is being answered;
- request bytes: each connection reads at most `connection_share_bytes` of requests on its own; a
  body larger than that reserves the rest from one pool when its head arrives, or is answered 503
  and closed: a flood of large unfinished bodies holds the pool, not the small requests, which
  fit in a connection's share. Bytes are read only up to what is reserved.
- time: the handshake, a request's head, the whole request, idleness and an answer left unread
  each have a timeout; a connection past one is closed.
- threads: the loop's, and the pool's `Offload.threads`.

The rooms: `kubeio.acceptor` binds the port, accepts and evicts; `kubeio.serverconn` reads and
frames each connection's requests within the byte bounds; `kubeio.dispatch` calls the app, on the
loop or on the pool; `Server` runs the loop, writes the answers and enforces the timeouts.

Threads: the loop's thread owns the selector, every connection and the byte pool. A pool thread
only calls the app and hands `(connection, answer)` back through `Dispatch` and a wake-up byte.
`start` and `stop` are called by the owner, once each, in that order.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kubeio.acceptor import Acceptor, ContextSource
from kubeio.bounds import Bounds, Refusal
from kubeio.dispatch import Dispatch
from kubeio.pool import Offload
from kubeio.serverconn import Connection, RequestReader

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

__all__ = ["ContextSource", "Server"]

log = logging.getLogger(__name__)

#: How often connections are checked against the timeouts and the load is reported.
TICK_SECONDS = 1.0
_LISTENER = "listener"
_WAKE = "wake"


def _no_count(reason: str) -> None:
    pass


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
        self._host = host
        self._bounds = bounds
        self._offload = offload
        self._count = refused
        self._load = load
        self._scheme = "http" if tls is None else "https"
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._acceptor = Acceptor(host, port, bounds, tls, reuse_port, self._refused, self._close)
        self._reader = RequestReader(bounds)
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._dispatch = Dispatch(
            name,
            app,
            host,
            lambda: self.port,
            self._scheme,
            bounds,
            self._reader,
            offload=offload,
            multiprocess=reuse_port,
            refused=self._refused,
            draining=self._draining,
            wake=self._wake,
        )
        self._again: set[Connection] = set()  # decrypted bytes left unread in the TLS layer
        self._deadline: float | None = None  # set once stopping: in-flight requests end by it
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._acceptor.port

    @property
    def connections(self) -> int:
        """Open connections now (read from another thread: a moment's value)."""
        return len(self._acceptor.connections)

    @property
    def buffered_bytes(self) -> int:
        """Request bytes buffered now, all connections together (a moment's value)."""
        return self._reader.buffered

    @property
    def peak_connections(self) -> int:
        """The most connections held at once since the start."""
        return self._acceptor.peak_connections

    @property
    def peak_buffered_bytes(self) -> int:
        """The most request bytes buffered at once since the start."""
        return self._reader.peak_buffered_bytes

    def start(self) -> Server:
        """Binds now, so `port` is known and errors (a port in use) surface to the caller."""
        try:
            listener = self._acceptor.bind()
        except OSError:
            self._close_all()
            raise
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        for worker in self._dispatch.workers:
            worker.start()
        log.info(
            "%s: serving %s on %s:%d from one thread and %d more",
            self.name,
            self._scheme.upper(),
            self._host,
            self.port,
            len(self._dispatch.workers),
        )
        return self

    def drain(self) -> None:
        """From now on every answer closes its connection (`Connection: close`): a client
        that sends a request on a kept-alive connection gets its answer and dials again (to
        another replica once endpoints dropped this one), so `stop` finds few idle connections
        to close under a client that may be writing on them."""
        self._draining.set()

    def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (up to the shutdown timeout)."""
        self._draining.set()
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
            listener = self._acceptor.listener
            if listener is not None:
                self._selector.unregister(listener)
                listener.close()
            # Idle connections close now; the others once their answer is written (requests
            # read from now on are answered with `Connection: close`).
            for conn in list(self._acceptor.connections):
                if not conn.in_flight():  # a request already here is read and answered first
                    self._guarded(conn, selectors.EVENT_READ)
                if not conn.closed and not conn.in_flight():
                    self._close(conn)
        if time.monotonic() >= self._deadline:
            return True
        return not any(conn.in_flight() for conn in self._acceptor.connections)

    def _guarded(self, conn: Connection, mask: int) -> None:
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
        for conn in self._acceptor.accept():
            self._guarded(conn, selectors.EVENT_READ)

    def _refused(self, reason: str) -> None:
        try:
            self._count(reason)
        except Exception:  # a counter's failure must not take the loop down
            log.exception("%s: counting a refusal failed", self.name)

    def _step(self, conn: Connection, mask: int) -> None:
        if not conn.handshaken:
            if not self._handshake(conn):
                return
            mask = selectors.EVENT_READ  # a request may have come with the handshake's end
        if mask & selectors.EVENT_WRITE:
            self._write(conn)
        if mask & selectors.EVENT_READ and not conn.closed:
            self._reader.read(conn)
        if not conn.closed:
            self._serve(conn)

    def _handshake(self, conn: Connection) -> bool:
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

    def _serve(self, conn: Connection) -> None:
        """Answers the complete requests in the inbox, in order, then writes and watches."""
        self._dispatch.serve(conn)
        self._write(conn)
        if (
            not conn.closed
            and self._reader.wants_read(conn)
            and isinstance(conn.sock, ssl.SSLSocket)
            and conn.sock.pending()
        ):
            # Decrypted already: the selector will not report these bytes.
            self._again.add(conn)

    def _take_finished(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        for conn, answer in self._dispatch.take_finished():
            conn.busy = False
            if conn.closed:
                self._reader.release(conn)
                continue
            conn.since = time.monotonic()
            self._reader.release(conn)
            conn.answered(answer)
            self._guarded(conn, selectors.EVENT_READ)

    def _write(self, conn: Connection) -> None:
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
        if self._reader.wants_read(conn):
            events |= selectors.EVENT_READ
        self._watch(conn, events)

    def _watch(self, conn: Connection, events: int) -> None:
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
        for conn in list(self._acceptor.connections):
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
            self._load(len(self._acceptor.connections), self._reader.buffered)

    def _close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._acceptor.forget(conn)
        self._again.discard(conn)
        self._reader.drop(conn)
        if not conn.busy:  # else the request keeps its bytes until its worker is done with them
            self._reader.release(conn)
        if conn.events:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
            conn.events = 0
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._acceptor.connections):
            self._close(conn)
        if self._acceptor.listener is not None:
            with contextlib.suppress(OSError):
                self._acceptor.listener.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
