"""The request loop against local servers (plain HTTP and TLS): many requests in flight from one
thread, keep-alive reuse, a connection the server closed while idle, the guard, timeouts, close;
and its answer reader on the shapes the apiserver answers with."""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes import client as k8s_client

from kubeio import loop as loop_module
from kubeio import pki
from kubeio.client import ClientSettings, Kube, Response
from kubeio.errors import APIError, APITransportError, FencedError
from kubeio.http11 import ProtocolError, ResponseReader
from kubeio.loop import RequestLoop, answer_error
from kubeio.requests import prepare
from tests.unit.kubeio.test_kubeio_client import Server

# -- the answer reader ------------------------------------------------------------------------


def _read_in(raw: bytes, cut: int) -> ResponseReader:
    reader = ResponseReader()
    reader.feed(raw[:cut])
    if cut < len(raw):
        reader.feed(raw[cut:])
    return reader


def test_a_response_with_content_length_is_complete_only_with_its_whole_body() -> None:
    raw = b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nContent-Type: x\r\n\r\nhello"
    for cut in range(len(raw)):
        assert not ResponseReader().feed(raw[:cut])
        reader = _read_in(raw, cut)
        assert (reader.complete, reader.status, bytes(reader.body), reader.keep_alive) == (
            True,
            201,
            b"hello",
            True,
        )


def test_bytes_after_the_answer_keep_it_but_not_its_connection() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200")
    assert (reader.status, bytes(reader.body), reader.keep_alive) == (200, b"ok", False)


def test_a_chunked_response_is_joined_and_complete_only_after_its_last_chunk() -> None:
    raw = b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    for cut in range(len(raw)):
        assert not ResponseReader().feed(raw[:cut])
        reader = _read_in(raw, cut)
        assert (reader.complete, reader.status, bytes(reader.body)) == (True, 409, b"abcde")


def test_an_interim_answer_is_skipped() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert (reader.status, reader.body, reader.keep_alive) == (204, b"", True)


def test_connection_close_and_http_1_0_end_the_connection() -> None:
    closing = ResponseReader()
    old = ResponseReader()
    assert closing.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert old.feed(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert not closing.keep_alive
    assert not old.keep_alive


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",  # neither a length nor chunked: the end is unknowable
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",  # a digit to str.isdigit
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_what_is_not_an_answer_it_can_read_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseReader().feed(raw)


def test_an_answer_larger_than_its_bound_is_a_protocol_error() -> None:
    reader = ResponseReader(max_bytes=4)
    assert not reader.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    with pytest.raises(ProtocolError):
        reader.feed(b"3\r\nabc\r\n")


# -- the loop ----------------------------------------------------------------------------------


def run_all(loop: RequestLoop, paths: list[str], guard: object = None) -> list[Response | APIError]:
    answers: queue.Queue[tuple[int, Response | APIError]] = queue.Queue()
    for i, path in enumerate(paths):
        loop.submit(
            prepare("POST", path, body={"i": i}),
            lambda answer, i=i: answers.put((i, answer)),  # type: ignore[misc]
            guard,  # type: ignore[arg-type]
        )
    got = dict(answers.get(timeout=30) for _ in paths)
    return [got[i] for i in range(len(paths))]


def test_every_request_is_answered_over_at_most_the_connections_it_may_open(
    keeps: tuple[Server, Kube],
) -> None:
    server, kube = keeps
    loop = RequestLoop(kube, connections=4)
    try:
        paths = [f"/api/v1/namespaces/a/pods/p{i}/binding" for i in range(60)]
        answers = run_all(loop, paths)
        assert loop.alive()
    finally:
        loop.close()
    assert not loop.alive()  # the binder's health check reads this
    assert all(
        isinstance(a, Response) and a.status == 200 and a.json() == {"ok": True} for a in answers
    )
    assert sorted(server.requests) == sorted(f"POST {p}" for p in paths)
    assert 1 <= server.connections <= 4


def test_an_error_status_is_an_answer_and_the_connection_stays(keeps: tuple[Server, Kube]) -> None:
    server, kube = keeps
    loop = RequestLoop(kube, connections=1)
    try:
        answers = run_all(loop, ["/api/v1/missing", "/api/v1/there"])
    finally:
        loop.close()
    statuses = [a.status if isinstance(a, Response) else None for a in answers]
    assert statuses == [404, 200]
    assert server.connections == 1


def test_a_connection_the_server_closed_while_idle_is_replaced_and_the_request_sent_again(
    closes: tuple[Server, Kube],
) -> None:
    server, kube = closes
    loop = RequestLoop(kube, connections=1)
    try:
        answers = [run_all(loop, [f"/api/v1/c{i}"])[0] for i in range(4)]
    finally:
        loop.close()
    assert [a.status if isinstance(a, Response) else repr(a) for a in answers] == [200] * 4
    assert server.requests == [f"POST /api/v1/c{i}" for i in range(4)]


def test_a_failing_guard_sends_nothing(keeps: tuple[Server, Kube]) -> None:
    server, kube = keeps
    loop = RequestLoop(kube, connections=2)
    try:
        answers = run_all(loop, ["/api/v1/a", "/api/v1/b"], guard=lambda: False)
    finally:
        loop.close()
    assert all(isinstance(a, FencedError) for a in answers)
    assert server.requests == []


def test_no_server_is_a_transport_error() -> None:
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing listens
    loop = RequestLoop(Kube(configuration, ClientSettings()), connections=2)
    try:
        answers = run_all(loop, ["/api/v1/a"])
    finally:
        loop.close()
    assert isinstance(answers[0], APITransportError)


def test_an_unanswered_request_fails_after_the_timeout_and_close_fails_what_is_queued() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does) and never answers
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    loop = RequestLoop(Kube(configuration, ClientSettings(timeout_seconds=0.5)), connections=1)
    try:
        answers = run_all(loop, ["/api/v1/a"])
        assert isinstance(answers[0], APITransportError) and "no answer" in str(answers[0])
        later: queue.Queue[Response | APIError] = queue.Queue()
        for _ in range(3):
            loop.submit(prepare("GET", "/api/v1/b"), later.put)
    finally:
        loop.close()
        silent.close()
    assert all(isinstance(later.get(timeout=5), APITransportError) for _ in range(3))
    after: queue.Queue[Response | APIError] = queue.Queue()
    loop.submit(prepare("GET", "/api/v1/c"), after.put)
    assert isinstance(after.get(timeout=5), APITransportError)


class HeldAnswers:
    """A server that answers each request only once `release()` says so: a request in flight for
    as long as a test needs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.received: queue.Queue[bytes] = queue.Queue()
        self._release = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def release(self) -> None:
        self._release.set()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(4096)
                data = data[length:]
                self.received.put(head.split(b"\r\n", 1)[0])
                self._release.wait()
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}")


def held_loop(server: HeldAnswers) -> RequestLoop:
    configuration = k8s_client.Configuration()
    configuration.host = server.host
    return RequestLoop(Kube(configuration, ClientSettings(timeout_seconds=60)), connections=2)


def test_drain_waits_for_what_was_written_and_sends_nothing_after_it_began() -> None:
    server = HeldAnswers()
    loop = held_loop(server)
    answers: list[Response | APIError] = []
    try:
        loop.submit(prepare("POST", "/api/v1/a", body={}), answers.append)
        assert server.received.get(timeout=30) == b"POST /api/v1/a HTTP/1.1"

        def answer_once_draining() -> None:
            while not loop._draining:
                time.sleep(0.01)
            server.release()

        threading.Thread(target=answer_once_draining, daemon=True).start()
        assert loop.drain(60)
        # The answer to what was written came before drain returned.
        assert [a.status for a in answers if isinstance(a, Response)] == [201]
        later: list[Response | APIError] = []
        loop.submit(prepare("POST", "/api/v1/b", body={}), later.append)
        assert len(later) == 1 and isinstance(later[0], FencedError)
    finally:
        loop.close()
        server.sock.close()
    assert server.received.empty()  # b never reached the server


def test_drain_says_when_an_answer_is_still_outstanding() -> None:
    server = HeldAnswers()
    loop = held_loop(server)
    answers: list[Response | APIError] = []
    try:
        loop.submit(prepare("POST", "/api/v1/a", body={}), answers.append)
        server.received.get(timeout=30)
        assert not loop.drain(0.2)
        assert answers == []
    finally:
        server.release()
        loop.close()
        server.sock.close()


@contextlib.contextmanager
def tls_loop(
    tmp_path: Path, trusted: bool, connections: int
) -> Iterator[tuple[Server, RequestLoop]]:
    """A local HTTPS server and a loop whose client trusts its certificate's CA (or another)."""
    ca = pki.self_signed_ca("server-ca", timedelta(days=1))
    leaf = pki.issue(
        ca,
        "localhost",
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        validity=timedelta(days=1),
        ip_addresses=["127.0.0.1"],
    )
    leaf.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    known = ca if trusted else pki.self_signed_ca("another-ca", timedelta(days=1))
    (tmp_path / "ca.crt").write_bytes(known.cert_pem)
    server = Server(close_after_each=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = k8s_client.Configuration()
    configuration.host = f"https://127.0.0.1:{server.server_address[1]}"
    configuration.ssl_ca_cert = str(tmp_path / "ca.crt")
    loop = RequestLoop(Kube(configuration, ClientSettings()), connections=connections)
    try:
        yield server, loop
    finally:
        loop.close()
        server.shutdown()
        server.server_close()


def test_over_tls_with_a_verified_server_certificate(tmp_path: Path) -> None:
    with tls_loop(tmp_path, trusted=True, connections=3) as (server, loop):
        answers = run_all(loop, [f"/api/v1/t{i}" for i in range(20)])
    assert all(isinstance(a, Response) and a.status == 200 for a in answers)
    assert len(server.requests) == 20


def wait_for(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_warmed_connections_are_opened_before_any_request_and_then_used(tmp_path: Path) -> None:
    with tls_loop(tmp_path, trusted=True, connections=3) as (server, loop):
        loop.warm(5)  # no more than the loop may hold
        assert wait_for(lambda: server.connections == 3)
        assert server.requests == []
        answers = run_all(loop, [f"/api/v1/w{i}" for i in range(20)])
        assert server.connections == 3
    assert all(isinstance(a, Response) and a.status == 200 for a in answers)


def test_a_connection_idle_past_its_time_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_module, "IDLE_SECONDS", 0.2)
    with tls_loop(tmp_path, trusted=True, connections=2) as (server, loop):
        loop.warm(2)
        assert wait_for(lambda: server.connections == 2)
        assert wait_for(lambda: not loop._open)  # both closed once idle for 0.2 s
        answers = run_all(loop, ["/api/v1/after"])
        assert server.connections == 3  # a new one: none was left to reuse
    assert isinstance(answers[0], Response) and answers[0].status == 200


def test_a_warmed_connection_that_fails_is_dropped_and_a_request_still_gets_its_error(
    tmp_path: Path,
) -> None:
    with tls_loop(tmp_path, trusted=False, connections=2) as (server, loop):
        loop.warm(2)
        answers = run_all(loop, ["/api/v1/t"])
        assert loop.alive()
    assert isinstance(answers[0], APITransportError)
    assert server.requests == []


def test_a_server_whose_certificate_is_not_trusted_is_a_transport_error(tmp_path: Path) -> None:
    with tls_loop(tmp_path, trusted=False, connections=1) as (server, loop):
        answers = run_all(loop, ["/api/v1/t"])
    assert isinstance(answers[0], APITransportError)
    assert server.requests == []


def test_an_answer_is_an_error_only_when_it_failed() -> None:
    refused = Response(409, b'{"kind":"Status","reason":"AlreadyExists","message":"bound"}')
    transport = APITransportError(0, "Transport", "reset")
    assert answer_error(Response(201, b"{}")) is None
    error = answer_error(refused)
    assert error is not None and (error.status, error.reason) == (409, "AlreadyExists")
    assert answer_error(transport) is transport
