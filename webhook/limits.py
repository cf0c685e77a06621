"""What the webhook's server refuses, and the pool of request bytes it shares between connections.

Every listening port is bounded (DESIGN.md, Trust): connections, request bytes buffered, threads
and the time each phase of a request may take. Each refusal is one `Refusal`, counted in
`gpuplace_webhook_refused_total{reason}`; the set is fixed, so the series are few.
"""

from __future__ import annotations

from enum import StrEnum


class Refusal(StrEnum):
    #: A new connection past `max_connections`, with no idle unused connection to make room.
    CONNECTIONS = "connections"
    #: An open connection that never sent a request, closed to make room for a new one.
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
    #: A map validation past the cap of its namespace.
    VALIDATION_NAMESPACE = "validation_namespace"
    #: A map validation past the cap of all namespaces together.
    VALIDATION_QUEUE = "validation_queue"


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
