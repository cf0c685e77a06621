"""What a listening port of ours may hold and how long each phase of a request may take, what it
refuses, and the pool of request bytes its connections share.

Every listening port is bounded (docs/trust.md: the ports a tenant can reach are bounded):
connections, request bytes buffered, threads and the time each phase of a request may take. Each
refusal is one `Refusal` (or one a pool's queue names, `kubeio.pool.Full`), counted by the
server's owner; the set is fixed, so the series are few.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import StrEnum


class Refusal(StrEnum):
    #: A new connection past `max_connections` while the server is answering on every open one.
    CONNECTIONS = "connections"
    #: A new connection past its client's `per_client` cap while the server is answering on every
    #: connection of that client.
    CLIENT_CONNECTIONS = "client_connections"
    #: An open connection that waited the longest on its client (idle, or a request or an answer
    #: half sent), closed to make room for a new one.
    EVICTED = "evicted"
    #: A request whose body does not fit in the shared byte pool now: 503, then closed.
    BUFFER = "buffer"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: The request line and headers did not arrive in time.
    HEAD_TIMEOUT = "head_timeout"
    #: The whole request (head and body) did not arrive in time.
    BODY_TIMEOUT = "body_timeout"
    #: An answer the client did not read in time.
    WRITE_TIMEOUT = "write_timeout"
    #: The request line and headers exceed `max_head_bytes`: 431.
    HEAD_TOO_LARGE = "head_too_large"
    #: A body past `max_body_bytes`, or one not framed by Content-Length: 413 or 411.
    BODY = "body"
    #: Not an HTTP/1.x request line and headers: 400 or 505.
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Bounds:
    """One server's caps and timeouts (each server process has its own)."""

    #: Open connections; past it a new one takes the place of the connection that has waited the
    #: longest on its client (`kubeio.acceptor`), or is closed at once.
    max_connections: int
    #: The request line and headers together.
    max_head_bytes: int
    #: 0: requests with a body are refused (413) before it is read.
    max_body_bytes: int
    #: Request bytes each connection may buffer without drawing on the shared pool; more than a
    #: whole head, so a head never waits on the pool.
    connection_share_bytes: int
    #: Request bytes buffered, all connections together: each connection's share, the rest a
    #: pool larger bodies draw on (past it: 503).
    max_buffered_bytes: int
    #: A new connection's TLS handshake must end within this long.
    handshake_timeout_seconds: float = 10.0
    #: A request's line and headers must arrive within this long of its first byte.
    head_timeout_seconds: float = 10.0
    #: The whole request, body included, must arrive within this long of its first byte.
    request_timeout_seconds: float = 30.0
    #: A connection with no request in progress is closed after this long.
    idle_timeout_seconds: float = 120.0
    #: An answer the client does not read (no progress) for this long closes its connection.
    write_timeout_seconds: float = 10.0
    #: After stop, in-flight requests are given this long to finish.
    shutdown_timeout_seconds: float = 10.0
    #: False: every answer closes its connection, so none idles between requests.
    keep_alive: bool = True
    #: Connections the kernel queues before the loop accepts them.
    backlog: int = socket.SOMAXCONN
    #: Open connections of one client address; past it the client's own longest-waiting
    #: connection makes room. 0: half of `max_connections` (`per_client`).
    max_connections_per_client: int = 0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max connections must be at least 1")
        if not 0 <= self.max_connections_per_client <= self.max_connections:
            raise ValueError(
                f"max connections per client {self.max_connections_per_client} must be between "
                f"1 and max connections {self.max_connections} (0: half of them)"
            )
        if self.connection_share_bytes < self.max_head_bytes + 4:
            raise ValueError(
                f"a connection's share of {self.connection_share_bytes} bytes must hold a whole "
                f"head of {self.max_head_bytes} bytes and its blank line"
            )
        if self.pool_bytes < max(0, self.max_body_bytes - self.connection_share_bytes):
            least = self.max_connections * self.connection_share_bytes + self.max_body_bytes
            raise ValueError(
                f"max buffered bytes {self.max_buffered_bytes} leave no room for one body of "
                f"max body bytes {self.max_body_bytes} besides the {self.max_connections} "
                f"connections' shares of {self.connection_share_bytes}: give at least {least}"
            )

    @property
    def per_client(self) -> int:
        """Open connections one client address may hold. Half the port by default: one client
        alone never holds the port, yet the apiserver, one address that opens a connection per
        admission in flight, keeps room for hundreds (docs/trust.md, "A client on the port")."""
        return self.max_connections_per_client or max(1, self.max_connections // 2)

    @property
    def pool_bytes(self) -> int:
        """What bodies larger than a connection's share draw on, all connections together."""
        return self.max_buffered_bytes - self.max_connections * self.connection_share_bytes


def small_bounds(connections: int, head_bytes: int, seconds: float = 10.0) -> Bounds:
    """Bounds of a port for probes, scrapes and pages: no request body, one request a
    connection, a connection silent for `seconds` (its head, its answer) cut, and a quarter of
    the connections to one client (a scraper and the kubelet need a few each)."""
    share = 2 * head_bytes
    return Bounds(
        max_connections=connections,
        max_head_bytes=head_bytes,
        max_body_bytes=0,
        connection_share_bytes=share,
        max_buffered_bytes=connections * share,
        head_timeout_seconds=seconds,
        request_timeout_seconds=seconds,
        idle_timeout_seconds=seconds,
        write_timeout_seconds=seconds,
        shutdown_timeout_seconds=seconds,
        keep_alive=False,
        backlog=128,
        max_connections_per_client=max(1, connections // 4),
    )


class BytePool:
    """Request bytes that connections draw on beyond their own share, up to `size`.

    Threads: only the server's loop thread uses it (no lock).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0

    def take(self, n: int) -> bool:
        """Reserves `n` bytes; False (nothing reserved) when they do not fit."""
        if self.in_use + n > self.size:
            return False
        self.in_use += n
        return True

    def give(self, n: int) -> None:
        self.in_use -= n
