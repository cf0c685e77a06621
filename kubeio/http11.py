"""HTTP/1.1 requests off a byte buffer and WSGI calls into their answers, without I/O.

What `kubeio.server` needs to serve the apiserver, probes and scrapes: a request line and headers
(the block limited in size), bodies framed by Content-Length (the apiserver always sends one),
keep-alive and `Connection: close`. A request the server will not serve raises `RefusedError`,
whose answer closes the connection: the rest of the stream cannot be framed; its `reason` is the
refusal the server counts.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

from kubeio.bounds import Refusal

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import WSGIApplication, WSGIEnvironment

#: The request line and headers together, by default; past this without their end: 431.
MAX_HEAD_BYTES = 64 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: Framing is ours: the app's own values of these would contradict the bytes sent.
_HOP_BY_HOP = frozenset({"content-length", "connection", "transfer-encoding", "keep-alive"})
MALFORMED, HEAD_TOO_LARGE, BODY = Refusal.MALFORMED, Refusal.HEAD_TOO_LARGE, Refusal.BODY
_REASONS = {
    400: "Bad Request",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class RefusedError(Exception):
    """A request answered by the server itself with `status`, then the connection closed;
    `refusal` is what the server counts."""

    def __init__(self, status: int, why: str, refusal: Refusal | None = None) -> None:
        super().__init__(f"{status}: {why}")
        self.status = status
        self.why = why
        self.refusal = refusal

    def answer(self) -> bytes:
        body = json.dumps({"code": self.status, "reason": self.why}).encode()
        headers = [("Content-Type", "application/json")]
        return encode(f"{self.status} {_REASONS[self.status]}", headers, body, close=True)


@dataclass(frozen=True, slots=True)
class Head:
    """A request line and its headers; `size` bytes of the buffer, the blank line included."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    length: int
    keep_alive: bool
    expects_continue: bool
    size: int


@dataclass(frozen=True, slots=True)
class Request:
    head: Head
    body: bytes


def parse_head(buf: bytearray, max_body: int, max_head: int = MAX_HEAD_BYTES) -> Head | None:
    """The head at the start of `buf`; None while incomplete. Raises `RefusedError`."""
    end = buf.find(b"\r\n\r\n", 0, max_head + 4)
    if end < 0:
        if len(buf) > max_head:
            raise RefusedError(
                431, f"the request line and headers exceed {max_head} bytes", HEAD_TOO_LARGE
            )
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise RefusedError(400, f"not an HTTP request line: {lines[0][:80]!r}", MALFORMED)
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/"):
            raise RefusedError(505, f"{version[:16]!r} is not served; use HTTP/1.1", MALFORMED)
        raise RefusedError(400, f"not an HTTP request line: {lines[0][:80]!r}", MALFORMED)
    headers = tuple(_header(line) for line in lines[1:])
    length: int | None = None
    tokens: set[str] = set()
    expects_continue = False
    for name, value in headers:
        lower = name.lower()
        if lower == "content-length":
            if not value.isdigit() or (length is not None and length != int(value)):
                raise RefusedError(400, f"bad Content-Length {value[:40]!r}", MALFORMED)
            length = int(value)
        elif lower == "transfer-encoding":
            raise RefusedError(
                411, "send the body with a Content-Length, not Transfer-Encoding", BODY
            )
        elif lower == "connection":
            tokens.update(t.strip().lower() for t in value.split(","))
        elif lower == "expect" and value.strip().lower() == "100-continue":
            expects_continue = version == "HTTP/1.1"
    length = length or 0
    if length > max_body:
        raise RefusedError(413, f"the body of {length} bytes exceeds {max_body} bytes", BODY)
    # HTTP/1.0 connections are closed after their answer: the apiserver speaks HTTP/1.1.
    keep_alive = version == "HTTP/1.1" and "close" not in tokens
    return Head(method, target, version, headers, length, keep_alive, expects_continue, end + 4)


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon or not name or name != name.strip() or line[0] in " \t":
        raise RefusedError(400, f"not a header line: {line[:80]!r}", MALFORMED)
    return name, value.strip()


def environ(
    request: Request, server: tuple[str, int], remote: tuple[str, int], scheme: str = "https"
) -> WSGIEnvironment:
    """The WSGI environ of `request` (PEP 3333), received over `scheme` (https: over TLS)."""
    head = request.head
    target = head.target
    if "://" in target:  # absolute form: the path starts after the authority
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    path, _, query = target.partition("?")
    env: WSGIEnvironment = {
        "REQUEST_METHOD": head.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": head.version,
        "REMOTE_ADDR": remote[0],
        "REMOTE_PORT": str(remote[1]),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if request.body or head.method in ("POST", "PUT", "PATCH"):
        env["CONTENT_LENGTH"] = str(len(request.body))
    for name, value in head.headers:
        key = name.upper().replace("-", "_")
        if "_" in name:
            continue  # `X_Y` would pass for `X-Y` in the environ; proxies drop them too
        if key == "CONTENT_TYPE":
            env[key] = value
        elif key != "CONTENT_LENGTH":
            key = "HTTP_" + key
            env[key] = f"{env[key]},{value}" if key in env else value
    return env


def call(app: WSGIApplication, env: WSGIEnvironment, close: bool) -> bytes:
    """The whole answer of `app` to `env`, framed with Content-Length."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    written: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
    ) -> Callable[[bytes], object]:
        # Nothing is sent before the app returns, so an error page may always replace the
        # headers given before.
        if started and exc_info is None:
            raise AssertionError("start_response called twice without exc_info")
        started[:] = [(status, headers)]
        return written.append

    result: Iterable[bytes] = app(env, start_response)
    try:
        written.extend(result)
    finally:
        closer = getattr(result, "close", None)
        if closer is not None:
            closer()
    if not started:
        raise RuntimeError("the WSGI app returned without calling start_response")
    status, headers = started[0]
    head_only = env["REQUEST_METHOD"] == "HEAD"
    return encode(status, headers, b"".join(written), close=close, head_only=head_only)


def encode(
    status: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    close: bool,
    head_only: bool = False,
) -> bytes:
    """An answer framed by its Content-Length; to HEAD, the length of what GET would send."""
    lines = [f"HTTP/1.1 {status}"]
    length = str(len(body))
    for name, value in headers:
        lower = name.lower()
        if lower == "content-length" and head_only:
            length = value
        elif lower not in _HOP_BY_HOP:
            lines.append(f"{name}: {value}")
    code = int(status[:3])
    bodiless = code < 200 or code in (204, 304)
    if not bodiless:
        lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if bodiless or head_only else head + body
