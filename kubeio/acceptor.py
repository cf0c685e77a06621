"""The listening port of `kubeio.server.Server` and its cap on connections.

Threads: `bind` is the server's owner's (at start); the rest runs on the server's loop thread.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
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
    at the accept) when `tls` is set.

    No client holds the port (docs/trust.md, "A client on the port"): a new connection past its
    client address's cap (`Bounds.per_client`) takes the place of that client's connection that
    has waited the longest on it (`longest_waiting`), and one past `max_connections` the place of
    the longest-waiting connection of the client that holds the most (`port_victim`), whoever
    that is, closed by `evict`; only when the server is answering on every candidate is the new
    connection closed. `refused(reason)` counts each."""

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
        #: The open connections of each client address.
        self.clients: dict[str, set[Connection]] = {}
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
            client = str(remote[0])
            refusal = self._room(client)
            if refusal is not None:
                self._refused(refusal)
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
                log.debug("dropped a connection from %s: %r", client, exc)
                sock.close()
                continue
            conn = Connection(sock, (client, int(remote[1])), time.monotonic())
            conn.handshaken = self._tls is None
            self.connections.add(conn)
            self.clients.setdefault(client, set()).add(conn)
            self.peak_connections = max(self.peak_connections, len(self.connections))
            yield conn

    def _room(self, client: str) -> Refusal | None:
        """Makes room for a new connection of `client`: under both caps, or after closing the
        longest-waiting connection of that client (at its cap) or of the client that holds the
        most (the port full). The refusal to count when there is none to close."""
        held = self.clients.get(client, ())
        if len(held) >= self._bounds.per_client:
            victim = longest_waiting(held)
            if victim is None:
                return Refusal.CLIENT_CONNECTIONS
        elif len(self.connections) >= self._bounds.max_connections:
            victim = port_victim(self.clients.values())
            if victim is None:
                return Refusal.CONNECTIONS
        else:
            return None
        self._refused(Refusal.EVICTED)
        self._evict(victim)
        return None

    def forget(self, conn: Connection) -> None:
        """The connection is closed."""
        self.connections.discard(conn)
        held = self.clients.get(conn.remote[0])
        if held is not None:
            held.discard(conn)
            if not held:
                del self.clients[conn.remote[0]]


def port_victim(clients: Iterable[set[Connection]]) -> Connection | None:
    """The connection to close when the port is full: the longest-waiting (`longest_waiting`)
    of the client addresses that hold the most, or, while the server is answering on each of
    theirs, of those that hold the most after them. A client that holds fewer connections than
    another loses none to the newcomer: a flood from a few addresses, however fast it opens and
    drops its connections, closes its own, never the apiserver's between two admissions (closed
    just as it sends a request on it, that admission would fail: a POST is not sent again) nor a
    probe's. Ties go to the one waiting the longest, whichever client holds it."""
    by_size: dict[int, list[Connection]] = {}
    for held in clients:
        by_size.setdefault(len(held), []).extend(held)
    for size in sorted(by_size, reverse=True):
        victim = longest_waiting(by_size[size])
        if victim is not None:
            return victim
    return None


def longest_waiting(connections: Iterable[Connection]) -> Connection | None:
    """The connection to close to make room: the one idle the longest (no request in progress:
    never used, between requests, or still in its handshake), else the one whose client has left
    a request or an answer half sent the longest; None when the server is answering on each
    (`busy`), the only work a client loses by an eviction that it did not leave waiting itself.

    A scan, run only when a cap is reached: it costs less than the TLS handshake of the
    connection that asked for the room."""
    best: Connection | None = None
    best_key = (2, 0.0)
    for conn in connections:
        if conn.busy or conn.closed:
            continue
        if conn.out:
            key = (1, conn.written)
        elif conn.in_request:
            key = (1, conn.since)
        else:
            key = (0, conn.since)
        if key < best_key:
            best, best_key = conn, key
    return best
