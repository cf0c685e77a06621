"""The Flask app over TLS from one thread: a selector over the port and every connection.

A server that gives each request in flight a thread spends most of an admission's CPU, in one
process, on those threads taking the interpreter lock in turn (futex waits, context switches), not
on the admission. `LoopServer` accepts, handshakes, reads, calls the app and writes from one thread over
non-blocking sockets, so an admission costs no thread switch. Requests that may take long (a
placement map's validation, seconds for a large map) run on `SLOW_WORKERS` threads instead, so
they never hold up pod admissions; their connection reads nothing more until the answer is back.

Threads: the loop's thread owns the selector and every connection. A worker only calls the app
and hands `(connection, answer)` back through `_finished` (under `_lock`) and a wake-up byte.
`start`, `drain` and `stop` are called by the owner, once each, in that order.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from flask import Flask

from webhook.http11 import CONTINUE, Head, RefusedError, Request, call, environ, parse_head
from webhook.settings import ServerSettings
from webhook.state import state_of
from webhook.tls import ServingTLS

log = logging.getLogger(__name__)

#: Threads that answer the requests of `SLOW_ROUTES`.
SLOW_WORKERS = 2
#: (method, path) answered off the loop: map validation takes seconds for a 1 MiB map.
SLOW_ROUTES = frozenset({("POST", "/validate")})
#: A connection with no request in progress is closed after this long.
IDLE_TIMEOUT_SECONDS = 120.0
#: A request's head and body must arrive within this long of its first byte (slowloris).
REQUEST_TIMEOUT_SECONDS = 30.0
HANDSHAKE_TIMEOUT_SECONDS = 10.0
#: How often connections are checked against the timeouts above.
TICK_SECONDS = 1.0
_READ_SIZE = 64 * 1024
#: Past this many answer bytes waiting for a client that does not read, its next requests wait.
_OUT_HIGH_WATER = 1024 * 1024
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
    head: Head | None = None  # of the request whose body is arriving
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
        self._pool = ThreadPoolExecutor(SLOW_WORKERS, thread_name_prefix="https-slow")
        self._lock = threading.Lock()
        self._finished: collections.deque[tuple[_Connection, bytes]] = collections.deque()
        self._connections: set[_Connection] = set()
        self._again: set[_Connection] = set()  # decrypted bytes left unread in the TLS layer
        self._stopping = threading.Event()
        self._deadline: float | None = None  # set once stopping: in-flight requests end by it
        self._port = 0
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

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
        self._pool.shutdown(wait=False, cancel_futures=True)

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
            self._guarded(conn, selectors.EVENT_READ)

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
        """Reads stop while a request is on a worker, after the last request, and while the
        client leaves answers unread or sends faster than they are answered."""
        return not (
            conn.busy
            or conn.closing
            or len(conn.out) >= _OUT_HIGH_WATER
            or len(conn.inbox) >= self._settings.max_body_bytes + 2 * _READ_SIZE
        )

    def _read(self, conn: _Connection) -> None:
        while self._wants_read(conn):
            try:
                data = conn.sock.recv(_READ_SIZE)
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
            conn.inbox += data

    def _serve(self, conn: _Connection) -> None:
        """Answers the complete requests in the inbox, in order, then writes and watches."""
        answered = False
        while not conn.busy and len(conn.out) < _OUT_HIGH_WATER and conn.inbox:
            try:
                request = self._next_request(conn)
            except RefusedError as refusal:
                log.info("refused a request from %s: %s", conn.remote[0], refusal)
                conn.out += refusal.answer()
                conn.inbox.clear()
                conn.closing = True
                break
            if request is None:
                break
            close = not request.head.keep_alive or self._stopping.is_set()
            conn.closing = conn.closing or close
            if (request.head.method, request.head.target.partition("?")[0]) in SLOW_ROUTES:
                conn.busy = True
                self._pool.submit(self._answer_off_loop, conn, request, close)
                break
            conn.out += self._answer(conn, request, close)
            answered = True
            if close:
                conn.inbox.clear()
                break
        if answered:  # the next request's time starts now, also when it is already arriving
            conn.since = time.monotonic()
        conn.in_request = bool(conn.inbox) or conn.head is not None
        self._write(conn)
        if not conn.closed and self._wants_read(conn) and conn.sock.pending():
            # Decrypted already: the selector will not report these bytes.
            self._again.add(conn)

    def _next_request(self, conn: _Connection) -> Request | None:
        if conn.head is None:
            head = parse_head(conn.inbox, self._settings.max_body_bytes)
            if head is None:
                return None
            del conn.inbox[: head.size]
            conn.head = head
            if head.expects_continue and len(conn.inbox) < head.length:
                conn.out += CONTINUE
        head = conn.head
        if len(conn.inbox) < head.length:
            return None
        body = bytes(conn.inbox[: head.length])
        del conn.inbox[: head.length]
        conn.head = None
        return Request(head, body)

    def _answer(self, conn: _Connection, request: Request, close: bool) -> bytes:
        env = environ(request, (self._settings.host, self._port), conn.remote)
        env["wsgi.multiprocess"] = self._settings.processes > 1
        try:
            return call(self._app, env, close)
        except Exception:
            # Flask answers the app's own failures with 500; this is a failure around it.
            log.exception("%s %s failed", request.head.method, request.head.target[:200])
            return RefusedError(500, "the server failed to answer").answer()

    def _answer_off_loop(self, conn: _Connection, request: Request, close: bool) -> None:
        answer = self._answer(conn, request, close)
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
            if conn.closed:
                continue
            conn.busy = False
            conn.since = time.monotonic()
            conn.out += answer
            self._guarded(conn, selectors.EVENT_READ)

    def _write(self, conn: _Connection) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                break
            del conn.out[:sent]
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
        for conn in list(self._connections):
            if conn.busy:
                continue
            if not conn.handshaken:
                limit = HANDSHAKE_TIMEOUT_SECONDS
            elif conn.in_request:
                limit = REQUEST_TIMEOUT_SECONDS
            else:
                limit = IDLE_TIMEOUT_SECONDS  # idle, or its answer unread that long
            if now - conn.since > limit:
                log.debug("closed a connection from %s: silent for %.0f s", conn.remote[0], limit)
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._connections.discard(conn)
        self._again.discard(conn)
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
