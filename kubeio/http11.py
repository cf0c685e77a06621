"""HTTP/1.1 on both sides, without I/O: the server's requests and the WSGI calls that answer
them (`kubeio.server`), and the request loop's answers (`kubeio.loop`). The bytes are parsed by
llhttp, Node.js's parser, through httptools (the parser under uvicorn): one well-kept, fuzzed
parser for every message gpuplace reads off a socket of its own; docs/architecture.md says why it
and not h11 (bench/httpcodec.py).

The server's side: a request line and headers (the block limited in size), bodies framed by
Content-Length (the apiserver always sends one), keep-alive and `Connection: close`. A request the
server will not serve raises `RefusedError`, whose answer closes the connection: the rest of the
stream cannot be framed; its `reason` is the refusal the server counts. The client's side:
`ResponseReader`, one answer read as it arrives.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

import httptools

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


class _HeadParts:
    """What llhttp reports of a request's head, its callbacks' receiver. The head's own facts
    are taken when it completes: llhttp resets them once a message without a body is complete."""

    __slots__ = ("complete", "headers", "keep_alive", "method", "parser", "url", "version")

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.complete = False
        self.keep_alive = False
        self.method = b""
        self.version = ""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1").strip(" \t")))

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.complete = True
        self.keep_alive = parser.should_keep_alive()
        self.method = parser.get_method()
        self.version = "HTTP/" + parser.get_http_version()


def parse_head(buf: bytearray, max_body: int, max_head: int = MAX_HEAD_BYTES) -> Head | None:
    """The head at the start of `buf`; None while incomplete. Raises `RefusedError`.

    The head ends at its first blank line; llhttp parses it (request line, header syntax,
    Content-Length's digits, one Content-Length, no Content-Length beside Transfer-Encoding). It
    is fed in two steps, so a head llhttp would end elsewhere (before the blank line) is refused:
    what follows the head is framed by this head's Content-Length, by the caller."""
    end = buf.find(b"\r\n\r\n", 0, max_head + 4)
    if end < 0:
        if len(buf) > max_head:
            raise RefusedError(
                431, f"the request line and headers exceed {max_head} bytes", HEAD_TOO_LARGE
            )
        return None
    parts = _HeadParts()
    with memoryview(buf) as view:
        _feed(parts.parser, view[: end + 2])
        if parts.complete:
            raise RefusedError(400, "the head ends before its blank line", MALFORMED)
        _feed(parts.parser, view[end + 2 : end + 4])
    if not parts.complete:
        raise RefusedError(400, "blank lines where a request line was expected", MALFORMED)
    version = parts.version
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise RefusedError(505, f"{version!r} is not served; use HTTP/1.1", MALFORMED)
    length = 0
    expects_continue = False
    for name, value in parts.headers:
        lower = name.lower()
        if lower == "content-length":
            try:
                length = int(value)  # digits only, and only one: llhttp refused the rest
            except ValueError:
                raise RefusedError(400, f"bad Content-Length {value[:40]!r}", MALFORMED) from None
        elif lower == "transfer-encoding":
            raise RefusedError(
                411, "send the body with a Content-Length, not Transfer-Encoding", BODY
            )
        elif lower == "expect" and value.lower() == "100-continue":
            expects_continue = version == "HTTP/1.1"
    if length > max_body:
        raise RefusedError(413, f"the body of {length} bytes exceeds {max_body} bytes", BODY)
    # HTTP/1.0 connections are closed after their answer: the apiserver speaks HTTP/1.1.
    keep_alive = version == "HTTP/1.1" and parts.keep_alive
    method = parts.method.decode("ascii")
    target = parts.url.decode("latin-1")
    headers = tuple(parts.headers)
    return Head(method, target, version, headers, length, keep_alive, expects_continue, end + 4)


def _feed(parser: httptools.HttpRequestParser, data: memoryview) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        pass  # the head is whole; no protocol is switched to, the request is served as sent
    except httptools.HttpParserError as exc:
        raise RefusedError(400, f"not an HTTP/1.1 request: {exc}", MALFORMED) from None


class ProtocolError(Exception):
    """An answer that is not HTTP/1.1, or that the client will not read (too large, unframed)."""


#: The most an answer may carry: a Binding's answer is a Status of a few hundred bytes.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class ResponseReader:
    """The answers on one client connection, one request at a time: `expect` before each
    request, then `feed` the bytes as they arrive until it says the answer is complete: `status`,
    `body`, and whether the connection may carry another request (`keep_alive`). llhttp frames
    them (Content-Length, chunked, no body for 1xx, 204 and 304); an interim 1xx answer is
    skipped. Raises `ProtocolError` for what is not an answer, is larger than `max_bytes`, or is
    framed by the connection's end (never sent by the apiserver, and the end cannot be told from
    a failure); the connection is then unusable. Bytes past an answer are not read: the
    connection is not kept."""

    __slots__ = (
        "_framed",
        "_keep",
        "_max",
        "_parser",
        "body",
        "complete",
        "keep_alive",
        "received",
        "status",
    )

    def __init__(self, max_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._max = max_bytes
        self._framed = False
        self._keep = False
        self.status = 0
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.received = 0  # bytes of the answer that arrived

    def expect(self) -> None:
        """A request was sent: its answer comes next (llhttp goes on, as the connection does)."""
        self.status = 0
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.received = 0

    def feed(self, data: bytes) -> bool:
        """True once the answer is complete."""
        if self.complete:
            self.keep_alive = False
            return True
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, ProtocolError):
                raise exc.__context__ from None
            raise ProtocolError(f"not an HTTP/1.1 answer: {exc}") from None
        except httptools.HttpParserUpgrade:
            raise ProtocolError("the server switched protocols") from None
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise ProtocolError(f"not an HTTP/1.1 answer: {exc}") from None
            self.keep_alive = False  # what follows the answer is no answer
        return self.complete

    # llhttp's callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            self.keep_alive = False  # a second answer to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) not in (14, 17):  # neither framing header: most of the apiserver's
            return
        lower = name.lower()
        if lower == b"transfer-encoding":
            self._framed = True
        elif lower == b"content-length":
            self._framed = True
            if int(value) > self._max:  # digits only: llhttp refused the rest
                raise ProtocolError(f"an answer of {int(value)} bytes")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if not self._framed and not (100 <= status < 200 or status in (204, 304)):
            raise ProtocolError("an answer framed by neither Content-Length nor chunked")
        self._framed = False
        # Taken now: llhttp resets it once a message without a body is complete.
        self._keep = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.body += body
        if len(self.body) > self._max:
            raise ProtocolError(f"an answer of more than {self._max} bytes")

    def on_message_complete(self) -> None:
        if self.complete:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # interim (100 Continue): the answer follows
        self.status = status
        self.complete = True
        self.keep_alive = self._keep


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
