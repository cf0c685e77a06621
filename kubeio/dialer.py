"""The connections of `kubeio.loop.RequestLoop`: opened without blocking (TCP, then TLS when the
endpoint is https), and the bytes of a request written on one.

Threads: the loop's thread only.
"""

from __future__ import annotations

import errno
import selectors
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kubeio.http11 import ResponseReader
from kubeio.requests import Request

#: (scheme, host, port, TLS context, server name), as `Kube.endpoint` gives it.
Endpoint = tuple[str, str, int, ssl.SSLContext | None, str | None]
J = TypeVar("J")


@dataclass(eq=False, slots=True)
class Connection(Generic[J]):
    sock: socket.socket
    state: str = "connecting"  # connecting | handshaking | idle | writing | reading
    job: J | None = None
    out: bytes = b""
    answer: ResponseReader | None = None  # its answers, from its first request on
    deadline: float = 0.0  # of its request, or (idle) when it is closed
    answered_before: bool = False  # a request was answered on it (a kept-alive connection)


class Dialer:
    """Opens connections to `endpoint`, each registered with `selector` for the event it waits
    for; `connected` and `handshake` say when one is ready for its first request."""

    def __init__(self, endpoint: Endpoint, selector: selectors.BaseSelector) -> None:
        self._endpoint = endpoint
        self._selector = selector

    def open(self, job: J | None, deadline: float) -> Connection[J]:
        """A connection on its way (TCP connecting), for `job` (None: opened ahead of requests);
        raises ConnectionError when it cannot be."""
        _scheme, host, port, _context, _sni = self._endpoint
        try:
            sock = socket.socket(
                socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
            )
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex((host, port))
        except OSError as exc:
            raise ConnectionError(f"cannot connect: {exc}") from exc
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            raise ConnectionError(f"cannot connect: {errno.errorcode.get(code, code)}")
        conn = Connection(sock, job=job, deadline=deadline)
        self._selector.register(sock, selectors.EVENT_WRITE, conn)
        return conn

    def connected(self, conn: Connection[J]) -> bool:
        """The TCP connection is writable: True when it is ready (plain HTTP, or TLS set up at
        once), False while the TLS handshake goes on."""
        code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise ConnectionError(f"cannot connect: {errno.errorcode.get(code, code)}")
        scheme, _host, _port, context, sni = self._endpoint
        if scheme != "https" or context is None:
            return True
        self._selector.unregister(conn.sock)
        conn.sock = context.wrap_socket(
            conn.sock,
            server_hostname=sni or self._endpoint[1],
            do_handshake_on_connect=False,
        )
        conn.state = "handshaking"
        self._selector.register(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        return self.handshake(conn)

    def handshake(self, conn: Connection[J]) -> bool:
        """The TLS handshake goes on: True once it is done."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return False
        return True


def encode(request: Request, headers: Callable[[str | None], dict[str, str]], host: str) -> bytes:
    """The request's bytes on the wire, with the client's `headers(content_type)`."""
    fields = headers(request.content_type)
    fields.update(request.headers)
    lines = [f"{request.method} {request.target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in fields.items()]
    body = request.body or b""
    if body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
