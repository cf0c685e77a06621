"""A connection that `kubeio.server.Server` serves, and the reading of its requests within the
bounds on request bytes.

Threads: the server's loop thread owns every connection, the `RequestReader` and its byte pool
(no lock).
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field

from kubeio.bounds import Bounds, BytePool, Refusal
from kubeio.http11 import CONTINUE, Head, RefusedError, Request, parse_head

_READ_SIZE = 64 * 1024
#: Past this many answer bytes waiting for a client that does not read, its next requests wait
#: (the answers are small: a patch, a denial, the metrics page).
OUT_HIGH_WATER = 64 * 1024


@dataclass(eq=False, slots=True)
class Connection:
    sock: socket.socket  # an ssl.SSLSocket over TLS
    remote: tuple[str, int]
    since: float  # accepted, the last answer written, or the current request's first byte
    handshaken: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    written: float = 0.0  # when `out` last became non-empty or shrank
    head: Head | None = None  # of the request whose body is arriving
    granted: int = 0  # bytes reserved from the pool for the request in progress
    busy: bool = False  # a worker is answering its request
    closing: bool = False  # no more requests: close once the answers are written
    in_request: bool = False  # bytes of a request not answered yet arrived
    events: int = 0  # what the selector watches for it; 0: not registered
    closed: bool = False

    def answered(self, answer: bytes) -> None:
        """Queues `answer` to be written (its write timeout counts from now when none was)."""
        if not self.out:
            self.written = time.monotonic()
        self.out += answer

    def in_flight(self) -> bool:
        return self.busy or bool(self.out) or self.in_request


class RequestReader:
    """Reads the connections' requests within the bounds: each connection at most
    `connection_share_bytes` on its own; a body larger than that reserves the rest from one pool
    when its head arrives, or is refused (503). Bytes are read only up to what is reserved."""

    def __init__(self, bounds: Bounds) -> None:
        self._bounds = bounds
        self._bytes = BytePool(bounds.pool_bytes)
        self.buffered = 0  # len(inbox) summed over the connections
        #: The most buffered bytes held at once since the start.
        self.peak_buffered_bytes = 0

    def wants_read(self, conn: Connection) -> bool:
        """Reads stop while a request is on a worker, after the last request, while the client
        leaves answers unread, and once the connection holds all the bytes it may."""
        return not (
            conn.busy
            or conn.closing
            or len(conn.out) >= OUT_HIGH_WATER
            or len(conn.inbox) >= self._bounds.connection_share_bytes + conn.granted
        )

    def read(self, conn: Connection) -> None:
        while self.wants_read(conn):
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
            conn.inbox += data
            self.buffered += len(data)
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self.buffered)

    def drop(self, conn: Connection, size: int | None = None) -> None:
        """Removes the first `size` bytes of the inbox (all of them: None), giving its memory
        back: a kept-alive connection does not keep the capacity of a large body it carried."""
        removed = len(conn.inbox) if size is None else size
        conn.inbox = conn.inbox[removed:] if size is not None else bytearray()
        self.buffered -= removed

    def release(self, conn: Connection) -> None:
        """Gives the pool back what the connection's last request reserved."""
        if conn.granted:
            self._bytes.give(conn.granted)
            conn.granted = 0

    def next_request(self, conn: Connection) -> Request | None:
        """The next complete request in the inbox, taken out of it; None while incomplete.
        Raises RefusedError for a request that cannot be framed or whose body does not fit."""
        if conn.head is None:
            head = self._parse_head(conn)
            if head is None:
                return None
            self.drop(conn, head.size)
            bounds = self._bounds
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
                conn.answered(CONTINUE)
        head = conn.head
        if len(conn.inbox) < head.length:
            return None
        with memoryview(conn.inbox) as view:
            body = bytes(view[: head.length])
        self.drop(conn, head.length)
        conn.head = None
        return Request(head, body)

    def _parse_head(self, conn: Connection) -> Head | None:
        """The head at the start of the inbox. Whatever the parser fails on is a head it cannot
        frame, answered 400 and counted, never a connection dropped unanswered."""
        bounds = self._bounds
        try:
            return parse_head(conn.inbox, bounds.max_body_bytes, bounds.max_head_bytes)
        except RefusedError:
            raise
        except (ValueError, UnicodeError, IndexError) as exc:
            raise RefusedError(
                400, f"a malformed request head: {exc}"[:200], Refusal.MALFORMED
            ) from exc
