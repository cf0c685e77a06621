"""The listening port of `kubeio.server.Server` and its cap on connections.

Threads: `bind` is the server's owner's (at start); the rest runs on the server's loop thread.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from kubeio.bounds import Bounds, Refusal
from kubeio.serverconn import Connection

log = logging.getLogger(__name__)


class ContextSource(Protocol):
    """Where the TLS context comes from; read at each accept, so a new certificate serves new
    connections while open ones keep theirs (`webhook.tls.ServingTLS`)."""

    @property
    def context(self) -> ssl.SSLContext: ...


class Acceptor:
    """Binds the port and accepts its connections, each wrapped in TLS (from the context current
    at the accept) when `tls` is set. Past `max_connections` a new connection takes the place of
    the oldest one that never sent a request, closed by `evict` (a flood of idle connections
    cannot lock the apiserver or the kubelet's probe out), or is closed; `refused(reason)` counts
    each."""

    def __init__(
        self,
        host: str,
        port: int,
        bounds: Bounds,
        tls: ContextSource | None,
        reuse_port: bool,
        refused: Callable[[str], None],
        evict: Callable[[Connection], None],
    ) -> None:
        self._host = host
        self._requested_port = port
        self._bounds = bounds
        self._tls = tls
        self._reuse_port = reuse_port
        self._refused = refused
        self._evict = evict
        self.listener: socket.socket | None = None
        self.port = 0
        self.connections: set[Connection] = set()
        #: The connections no request has started on, oldest first (dict order).
        self.fresh: dict[Connection, None] = {}
        #: The most connections held at once since the start.
        self.peak_connections = 0

    def bind(self) -> socket.socket:
        """The listening socket, bound and non-blocking; raises the OSError (a port in use)."""
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
            raise
        self.listener = listener
        self.port = int(listener.getsockname()[1])
        return listener

    def accept(self) -> Iterator[Connection]:
        """Each connection waiting to be accepted, as it is (the caller serves it before the
        next is accepted)."""
        assert self.listener is not None
        while True:
            try:
                sock, remote = self.listener.accept()
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
            conn = Connection(sock, (str(remote[0]), int(remote[1])), time.monotonic())
            conn.handshaken = self._tls is None
            self.connections.add(conn)
            self.fresh[conn] = None
            self.peak_connections = max(self.peak_connections, len(self.connections))
            yield conn

    def _room(self) -> bool:
        """Whether a new connection may open: under the cap, or after closing the oldest
        connection that never started a request (its client loses nothing it asked for)."""
        if len(self.connections) < self._bounds.max_connections:
            return True
        oldest = next(iter(self.fresh), None)
        if oldest is None:
            return False
        self._refused(Refusal.EVICTED)
        self._evict(oldest)
        return True

    def started(self, conn: Connection) -> None:
        """A request started on the connection: it is no longer the first to make room."""
        self.fresh.pop(conn, None)

    def forget(self, conn: Connection) -> None:
        """The connection is closed."""
        self.connections.discard(conn)
        self.fresh.pop(conn, None)
