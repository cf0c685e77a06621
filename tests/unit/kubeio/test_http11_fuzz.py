"""Bytes off the wire, fuzzed (Hypothesis), into both ends of gpuplace's HTTP/1.1: the server
(`kubeio.server`) over a real socket, and the request loop (`kubeio.loop`) against a scripted
peer that answers with the fuzzed bytes.

The server answers every complete head, malformed or not, with a status (a refusal: 400, 411,
413, 431 or 505, counted), never 500, and whatever arrives it goes on serving; the loop hands each
request exactly one result, a response or a transport error, and goes on sending.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s_client

from kubeio.bounds import Bounds
from kubeio.client import ClientSettings, Kube, Response
from kubeio.errors import APIError, APITransportError
from kubeio.http11 import ProtocolError, RefusedError, ResponseReader, parse_head
from kubeio.loop import RequestLoop
from kubeio.requests import prepare
from kubeio.server import Server

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

MAX_HEAD = 2048
MAX_BODY = 4096
#: The server's own answers to what it will not serve; the app's are 200 and 404.
REFUSALS = {400, 411, 413, 431, 505}
_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    body = environ["wsgi.input"].read()
    status = "200 OK" if environ["PATH_INFO"] == "/" else "404 Not Found"
    start_response(status, [("Content-Type", "text/plain")])
    return [b"got %d bytes" % len(body)]


class Served:
    """A plain-HTTP server on 127.0.0.1 and the refusals it counted."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.server = Server(
            "fuzzed",
            app,
            "127.0.0.1",
            0,
            Bounds(
                max_connections=64,
                max_head_bytes=MAX_HEAD,
                max_body_bytes=MAX_BODY,
                connection_share_bytes=2 * MAX_HEAD + MAX_BODY,
                max_buffered_bytes=64 * (2 * MAX_HEAD + MAX_BODY),
            ),
            refused=self.refusals.append,
        ).start()

    def exchange(self, data: bytes) -> bytes:
        """Sends `data`, then the end of the client's half, and reads until the server closes."""
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=20) as sock:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            got = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    got += chunk
            return got


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    served = Served()
    try:
        yield served
    finally:
        served.server.stop()


@pytest.fixture
def failures(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """What the server logs when something raised while it served a connection: a failure of
    its own, or a connection it closed on anything but an OSError (the peer's resets)."""
    caplog.set_level(logging.DEBUG, logger="kubeio")
    found: list[logging.LogRecord] = []
    yield found
    for record in caplog.records:
        args = record.args if isinstance(record.args, tuple) else ()
        raised = [a for a in args if isinstance(a, BaseException) and not isinstance(a, OSError)]
        closed = str(record.msg).startswith("%s: closed a connection")
        if record.levelno >= logging.ERROR or (closed and raised):
            found.append(record)
    assert not found, [r.getMessage() for r in found]


def _check(served: Served, data: bytes) -> list[int]:
    """Sends `data`; the statuses of the answers, after checking each refusal was counted and
    the server serves a good request after it."""
    before = len(served.refusals)
    answer = served.exchange(data)
    statuses = [int(code) for code in _STATUS.findall(answer)]
    assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:200]
    assert 500 not in statuses, answer[:400]
    refused = [s for s in statuses if s in REFUSALS]
    assert len(served.refusals) - before == len(refused), (statuses, served.refusals[before:])
    assert refused == refused[-1:] and (not refused or statuses[-1] in REFUSALS)  # then closed
    good = served.exchange(b"GET / HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
    assert good.startswith(b"HTTP/1.1 200 "), good[:200]
    return statuses


# -- the server ---------------------------------------------------------------------------------

_TOKEN = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"get", b"G T", b"", b"\xb2"])
_TARGET = st.one_of(st.sampled_from([b"/", b"/x?a=b", b"*", b"http://h/p", b""]), st.binary())
_VERSION = st.sampled_from(
    [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.x", b"HTTP/11", b"http/1.1"]
) | st.binary(max_size=10)
_NAME = st.sampled_from(
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect", b"X-A"]
) | st.binary(min_size=0, max_size=12)
_VALUE = st.sampled_from(
    [b"0", b"12", b"\xb2", b"1\xb2", b"-1", b" 3 ", b"99999999999999999999", b"chunked", b"close"]
) | st.binary(max_size=24)
_SEPARATOR = st.sampled_from([b": ", b":", b" : ", b"", b"\x00"])


_LINE = st.sampled_from([b"POST / HTTP/1.1", b"GET /x?a=b HTTP/1.0", b"PUT /y HTTP/1.1"])
_KNOWN = st.tuples(
    st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect"]),
    st.just(b": "),
    _VALUE,
)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """A request head of fuzzed parts (a well-formed request line, or one of fuzzed parts; well
    named fields, or fuzzed ones), ended by its blank line; a body follows when its
    Content-Length is well formed and small, so a complete head is a complete request."""
    fuzzed = st.tuples(_TOKEN, _TARGET, _VERSION).map(b" ".join)
    line = draw(_LINE | fuzzed)
    fields = draw(st.lists(_KNOWN | st.tuples(_NAME, _SEPARATOR, _VALUE), max_size=5))
    head = b"\r\n".join([line] + [n + s + v for n, s, v in fields]) + b"\r\n\r\n"
    length = 0
    for name, _sep, value in fields:
        if name.lower() == b"content-length" and re.fullmatch(rb"[ \t]*[0-9]{1,4}[ \t]*", value):
            length = max(length, int(value))
    return head + b"b" * length


# -- the codec, without sockets ------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=3 * MAX_HEAD) | heads())
def test_parse_head_refuses_or_frames_any_bytes(data: bytes) -> None:
    try:
        head = parse_head(bytearray(data), MAX_BODY, MAX_HEAD)
    except RefusedError as refused:
        assert refused.status in REFUSALS
        assert refused.refusal is not None
    else:
        assert head is None or head.size <= len(data)


@FUZZ
@given(chunks=st.lists(st.binary(max_size=128), max_size=6))
def test_the_answer_reader_reads_or_refuses_any_bytes(chunks: list[bytes]) -> None:
    reader = ResponseReader(max_bytes=256)
    with contextlib.suppress(ProtocolError):
        for chunk in chunks:
            reader.feed(chunk)
    assert len(reader.body) <= 256


@FUZZ
@given(head=heads())
def test_every_fuzzed_head_is_answered_and_each_refusal_counted(
    served: Served, failures: list[logging.LogRecord], head: bytes
) -> None:
    statuses = _check(served, head)
    if head.find(b"\r\n\r\n") < MAX_HEAD:
        assert statuses, head[:200]  # a whole head: an answer, never a silent close


@FUZZ
@given(data=st.binary(max_size=3 * MAX_HEAD) | st.builds(bytes.__add__, heads(), st.binary()))
def test_no_bytes_bring_the_server_down(
    served: Served, failures: list[logging.LogRecord], data: bytes
) -> None:
    _check(served, data)


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",  # str.isdigit passes it, int fails
        b"POST / HTTP/1.1\r\nContent-Length: 1\xb2\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_heads_are_answered_400_and_counted(
    served: Served, failures: list[logging.LogRecord], head: bytes
) -> None:
    assert _check(served, head) == [400]
    assert served.refusals[-1] == "malformed"


# -- the request loop -----------------------------------------------------------------------------


class Peer:
    """A scripted server: each connection reads one request head, is answered with `answer`,
    and closed (a request sent again on a new connection gets the same bytes)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.answer = b""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with sock, contextlib.suppress(OSError):
                sock.settimeout(10)
                seen = b""
                while b"\r\n\r\n" not in seen and (chunk := sock.recv(4096)):
                    seen += chunk
                sock.sendall(self.answer)


@pytest.fixture(scope="module")
def peer() -> Iterator[tuple[Peer, RequestLoop]]:
    peer = Peer()
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{peer.listener.getsockname()[1]}"
    loop = RequestLoop(Kube(configuration, ClientSettings(timeout_seconds=10)), connections=1)
    try:
        yield peer, loop
    finally:
        loop.close()
        peer.listener.close()


def _send(peer: Peer, loop: RequestLoop, answer: bytes) -> Response | APIError:
    peer.answer = answer
    got: queue.Queue[Response | APIError] = queue.Queue()
    loop.submit(prepare("POST", "/api/v1/namespaces/a/pods/p/binding", body={}), got.put)
    result = got.get(timeout=30)
    assert got.empty()
    assert loop.alive()
    return result


_STATUS_CODE = st.integers(min_value=0, max_value=1000)


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, int | None, bytes]:
    """A response of fuzzed parts; the status and body a reader must see when it is well formed
    (None: it may not be)."""
    status = draw(_STATUS_CODE)
    body = draw(st.binary(max_size=64))
    fields = draw(st.lists(st.tuples(_NAME, _SEPARATOR, _VALUE), max_size=3))
    chunked = draw(st.booleans())
    head = [b"HTTP/1.1 %d Reason" % status]
    head += [n + s + v for n, s, v in fields]
    head.append(b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body))
    framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked and body else body
    if chunked and not body:
        framed = b"0\r\n\r\n"
    well_formed = not fields and 200 <= status <= 999 and status not in (204, 304)
    return b"\r\n".join(head) + b"\r\n\r\n" + framed, status if well_formed else None, body


@FUZZ
@given(answer=answers())
def test_the_loop_reads_every_well_formed_answer_and_fails_the_rest(
    peer: tuple[Peer, RequestLoop], answer: tuple[bytes, int | None, bytes]
) -> None:
    raw, status, body = answer
    result = _send(*peer, raw)
    if status is not None:
        assert isinstance(result, Response), result
        assert (result.status, result.data) == (status, body)
    else:
        assert isinstance(result, (Response, APITransportError)), result


@FUZZ
@given(
    raw=st.binary(max_size=512)
    | st.builds(bytes.__add__, answers().map(lambda a: a[0]), st.binary())
)
def test_no_bytes_bring_the_loop_down(peer: tuple[Peer, RequestLoop], raw: bytes) -> None:
    result = _send(*peer, raw)
    assert isinstance(result, (Response, APITransportError)), result
