"""The webhook's app on the one server (`kubeio.server`): over TLS from one thread, map validation
on a pool, real TLS on 127.0.0.1; and the HTTP/1.1 parser (`kubeio.http11`)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any, BinaryIO

import pytest
from flask import Flask

from kubeio import server as loop
from kubeio import serverconn
from kubeio.http11 import RefusedError, Request, environ, parse_head
from kubeio.server import Server
from placement.annotations import MAP_LABEL
from tests.unit.webhook_builders import make_configmap, make_model, make_pod, placement_yaml, review
from webhook.app import create_app
from webhook.certs import KeyPair, generate_ca, issue_serving
from webhook.modelcache import StaticModel
from webhook.server import drain, https_server
from webhook.settings import ServerSettings, WebhookSettings
from webhook.state import state_of
from webhook.tls import ServingTLS

MAX_BODY = 64 * 1024
#: How long a test waits for what must happen; reaching it fails the test.
WAIT = 10.0


@pytest.fixture
def ca() -> KeyPair:
    return generate_ca("test-ca", timedelta(days=365))


@pytest.fixture
def tls(ca: KeyPair) -> Iterator[ServingTLS]:
    serving = ServingTLS(issue_serving(ca, ["localhost"], ["127.0.0.1"], timedelta(days=1)))
    yield serving
    serving.close()


@pytest.fixture
def app() -> Flask:
    return create_app(settings(), StaticModel(make_model().map("llm").obj()))


def settings() -> WebhookSettings:
    return WebhookSettings(
        server=ServerSettings(
            host="127.0.0.1",
            port=0,
            max_body_bytes=MAX_BODY,
            shutdown_delay_seconds=0,
            shutdown_timeout_seconds=int(WAIT),
        )
    )


@pytest.fixture
def server(app: Flask, tls: ServingTLS) -> Iterator[Server]:
    running = https_server(app, tls, settings().server).start()
    try:
        yield running
    finally:
        running.stop()


def context_for(ca: KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


def connect(server: Server, ca: KeyPair) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=context_for(ca), timeout=WAIT
    )


def raw(server: Server, ca: KeyPair) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    return context_for(ca).wrap_socket(sock, server_hostname="127.0.0.1")


def mutate_body(name: str) -> bytes:
    pod = make_pod(name).label(MAP_LABEL, "llm").obj()
    return json.dumps(review(pod, uid=f"uid-{name}")).encode()


def mutate(conn: http.client.HTTPSConnection, name: str) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/mutate", body=mutate_body(name), headers=headers)
    response = conn.getresponse()
    assert response.status == 200
    answer: dict[str, Any] = json.loads(response.read())["response"]
    return answer


def validate_body() -> bytes:
    obj = make_configmap("llm", placement_yaml())
    return json.dumps(review(obj, kind="ConfigMap", resource="configmaps")).encode()


def read_status(stream: BinaryIO) -> int:
    """One HTTP/1.1 answer off a stream that holds several (http.client reads just one)."""
    status = int(stream.readline().split()[1])
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    stream.read(length)
    return status


def read_all(sock: ssl.SSLSocket) -> bytes:
    """Everything until the server closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_kept_alive_connections_answer_many_clients_each_its_own_review(
    server: Server, ca: KeyPair
) -> None:
    clients, reviews = 16, 20
    failures: list[BaseException] = []

    def client(c: int) -> None:
        conn = connect(server, ca)
        try:
            for i in range(reviews):
                answer = mutate(conn, f"web-c{c}-r{i}")
                assert answer["uid"] == f"uid-web-c{c}-r{i}"
                assert answer["patchType"] == "JSONPatch"
                if i == 0:
                    first = conn.sock
            assert conn.sock is first  # every review on the one kept-alive connection
        except BaseException as exc:
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    assert failures == []
    assert not any(thread.is_alive() for thread in threads)


def test_pipelined_requests_are_answered_in_order(server: Server, ca: KeyPair) -> None:
    body = mutate_body("web-0")
    post = (
        b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    gets = [b"GET %s HTTP/1.1\r\nHost: webhook\r\n\r\n" % p for p in (b"/healthz", b"/missing")]
    with raw(server, ca) as sock:
        sock.sendall((gets[0] + post + gets[1]) * 3)
        stream = sock.makefile("rb")
        statuses = [read_status(stream) for _ in range(9)]
    assert statuses == [200, 200, 404] * 3


def test_a_body_over_the_limit_is_refused_from_its_content_length(
    server: Server, ca: KeyPair
) -> None:
    """The body is never sent: waiting for it would leave the test without an answer."""
    with raw(server, ca) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)
        )
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close" in answer
    assert b"exceeds 65536 bytes" in answer


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (
            b"POST /mutate HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n",
            411,
            "body",
        ),
        (b"not http at all\r\n\r\n", 400, "malformed"),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505, "malformed"),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (70 * 1024), 431, "head_too_large"),
    ],
    ids=["chunked", "garbage", "bad-header", "version", "huge-head"],
)
def test_requests_the_server_cannot_frame_are_refused_counted_and_closed(
    app: Flask, server: Server, ca: KeyPair, request_bytes: bytes, status: int, reason: str
) -> None:
    with raw(server, ca) as sock:
        sock.sendall(request_bytes)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    registry = state_of(app).metrics.registry
    assert registry.get_sample_value("gpuplace_webhook_refused_total", {"reason": reason}) == 1
    conn = connect(server, ca)
    try:
        assert mutate(conn, "after")["uid"] == "uid-after"  # the server goes on
    finally:
        conn.close()


def test_garbage_after_an_answered_request_gets_a_400_and_the_server_goes_on(
    server: Server, ca: KeyPair
) -> None:
    with raw(server, ca) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\nnot http at all\r\n\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 400 " in answer
    conn = connect(server, ca)
    try:
        assert mutate(conn, "web-0")["uid"] == "uid-web-0"
    finally:
        conn.close()


def test_connections_closed_half_way_through_a_request_leave_the_server_serving(
    server: Server, ca: KeyPair
) -> None:
    for i in range(6):
        conn = connect(server, ca)
        assert mutate(conn, f"web-{i}")["uid"] == f"uid-web-{i}"
        conn.close()
        with raw(server, ca) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\nPOST /mutate HTT")
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
    conn = connect(server, ca)
    try:
        assert mutate(conn, "after")["uid"] == "uid-after"
    finally:
        conn.close()


def test_connection_close_and_http_1_0_close_after_their_answer(
    server: Server, ca: KeyPair
) -> None:
    for request in (
        b"GET /healthz HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\nGET /healthz HTTP/1.1\r\n",
        b"GET /healthz HTTP/1.0\r\n\r\n",
    ):
        with raw(server, ca) as sock:
            sock.sendall(request)
            answer = read_all(sock)
        assert answer.count(b"HTTP/1.1 200 ") == 1
        assert b"Connection: close" in answer


def test_expect_100_continue_is_answered_before_the_body(server: Server, ca: KeyPair) -> None:
    body = mutate_body("web-7")
    with raw(server, ca) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        stream = sock.makefile("rb")
        assert stream.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert stream.readline() == b"\r\n"
        sock.sendall(body)
        assert read_status(stream) == 200


def test_operations_endpoints_and_readiness_after_drain(
    app: Flask, server: Server, ca: KeyPair
) -> None:
    conn = connect(server, ca)
    try:
        for path, status in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200)):
            conn.request("GET", path)
            response = conn.getresponse()
            text = response.read()
            assert response.status == status, path
            assert response.getheader("Connection") is None, path  # kept alive
        assert b"gpuplace_" in text  # the metrics page
        drain(app, settings().server, server)
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        assert (response.status, response.read()) == (503, b"shutting down\n")
        # Draining: the answer closes the connection, the client dials again for the next.
        assert response.getheader("Connection") == "close"
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_head_is_answered_with_the_length_get_would_send(server: Server, ca: KeyPair) -> None:
    with raw(server, ca) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"Content-Length: 3\r\n" in answer
    assert answer.endswith(b"\r\n\r\n")  # no body


def test_a_failing_view_is_answered_500_by_flask(app: Flask, server: Server, ca: KeyPair) -> None:
    def broken() -> Any:
        raise RuntimeError("view failed")

    app.view_functions["ops.healthz"] = broken
    conn = connect(server, ca)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert response.status == 500
        response.read()
        assert mutate(conn, "web-0")["uid"] == "uid-web-0"  # on the same connection
    finally:
        conn.close()


def test_a_failure_of_the_server_closes_only_its_connection(
    server: Server, ca: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    def parse_or_fail(buf: bytearray, max_body: int, max_head: int) -> Any:
        if buf.startswith(b"BOOM"):
            raise RuntimeError("the parser failed")
        return parse_head(buf, max_body, max_head)

    monkeypatch.setattr(serverconn, "parse_head", parse_or_fail)
    kept = connect(server, ca)
    try:
        assert mutate(kept, "web-0")["uid"] == "uid-web-0"
        with raw(server, ca) as sock:
            sock.sendall(b"BOOM / HTTP/1.1\r\n\r\n")
            assert read_all(sock) == b""
        assert mutate(kept, "web-1")["uid"] == "uid-web-1"
    finally:
        kept.close()


class SlowValidate:
    """Replaces the app's /validate with one that holds until released."""

    def __init__(self, app: Flask) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        view: Callable[[], Any] = app.view_functions["validate.validate"]

        def slow() -> Any:
            self.entered.set()
            assert self.release.wait(WAIT * 3)
            try:
                return view()
            finally:
                self.finished.set()

        app.view_functions["validate.validate"] = slow

    def send(self, conn: http.client.HTTPSConnection) -> None:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/validate", body=validate_body(), headers=headers)
        assert self.entered.wait(WAIT)


def test_a_slow_validation_holds_up_no_pod_admission(
    app: Flask, server: Server, ca: KeyPair
) -> None:
    slow = SlowValidate(app)
    validating, mutating = connect(server, ca), connect(server, ca)
    try:
        slow.send(validating)
        for i in range(20):
            assert mutate(mutating, f"web-{i}")["uid"] == f"uid-web-{i}"
        assert not slow.finished.is_set()  # all twenty answered while the validation ran
        slow.release.set()
        response = validating.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["response"]["allowed"] is True
        assert mutate(validating, "after")["uid"] == "uid-after"  # and the connection goes on
    finally:
        slow.release.set()
        validating.close()
        mutating.close()


def test_requests_behind_a_slow_validation_are_answered_after_it(
    app: Flask, server: Server, ca: KeyPair
) -> None:
    slow = SlowValidate(app)
    body = validate_body()
    with raw(server, ca) as sock:
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%sGET /missing HTTP/1.1\r\nHost: w\r\n\r\n"
            % (len(body), body)
        )
        assert slow.entered.wait(WAIT)
        slow.release.set()
        stream = sock.makefile("rb")
        assert [read_status(stream), read_status(stream)] == [200, 404]


def test_a_new_certificate_serves_new_connections_while_open_ones_keep_theirs(
    server: Server, ca: KeyPair, tls: ServingTLS
) -> None:
    before = connect(server, ca)
    try:
        assert mutate(before, "web-0")["uid"] == "uid-web-0"
        new_ca = generate_ca("new-ca", timedelta(days=365))
        assert tls.update(issue_serving(new_ca, ["localhost"], ["127.0.0.1"], timedelta(days=1)))
        after = connect(server, new_ca)
        try:
            assert mutate(after, "web-1")["uid"] == "uid-web-1"
        finally:
            after.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            raw(server, ca).close()  # the old CA no longer verifies what new handshakes get
        assert mutate(before, "web-2")["uid"] == "uid-web-2"
    finally:
        before.close()


def test_stop_finishes_the_request_in_flight(app: Flask, tls: ServingTLS, ca: KeyPair) -> None:
    slow = SlowValidate(app)
    server = https_server(app, tls, settings().server).start()
    conn = connect(server, ca)
    stopper = threading.Thread(target=server.stop)
    try:
        slow.send(conn)
        stopper.start()
        refused_new_connections(server)
        slow.release.set()
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["response"]["allowed"] is True
        stopper.join(WAIT)
        assert not stopper.is_alive()
    finally:
        slow.release.set()
        conn.close()
        if not stopper.ident:
            server.stop()


def refused_new_connections(server: Server) -> None:
    """Returns once the port refuses connections: the server is stopping."""
    stopped = threading.Event()
    while not stopped.wait(0.01):
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=WAIT).close()
        except ConnectionRefusedError:
            return


@pytest.fixture
def short_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "TICK_SECONDS", 0.05)


def short_timeouts() -> ServerSettings:
    return replace(
        settings().server,
        idle_timeout_seconds=0.2,
        head_timeout_seconds=0.2,
        request_timeout_seconds=0.2,
        handshake_timeout_seconds=0.2,
        write_timeout_seconds=0.2,
    )


@pytest.mark.usefixtures("short_tick")
def test_silent_connections_are_closed(app: Flask, tls: ServingTLS, ca: KeyPair) -> None:
    """Idle after an answer, half-way through a request's head or body, and before a
    handshake; each but the idle one counted."""
    server = https_server(app, tls, short_timeouts()).start()
    try:
        with raw(server, ca) as idle:
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
            assert read_all(idle).startswith(b"HTTP/1.1 200 ")  # then closed, not refused
        with raw(server, ca) as slowloris:
            slowloris.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n")
            assert read_all(slowloris) == b""
        with raw(server, ca) as half_body:
            half_body.sendall(b"POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Length: 9\r\n\r\n{}")
            assert read_all(half_body) == b""
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as plain:
            assert plain.recv(1) == b""
    finally:
        server.stop()
    registry = state_of(app).metrics.registry
    for reason in ("head_timeout", "body_timeout", "handshake_timeout"):
        counted = registry.get_sample_value("gpuplace_webhook_refused_total", {"reason": reason})
        assert counted == 1, reason


# -- the request parser and the WSGI environ, without sockets --------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET / HTTP/1.1\r\nHost: w\r\n\r\n", (0, True, False)),
        (b"GET / HTTP/1.1\r\nConnection: Keep-Alive, Close\r\n\r\n", (0, False, False)),
        (b"GET / HTTP/1.0\r\n\r\n", (0, False, False)),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 12\r\nExpect: 100-continue\r\n\r\n",
            (12, True, True),
        ),
        (
            b"POST / HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
            (3, False, False),
        ),
    ],
)
def test_heads(head: bytes, expected: tuple[int, bool, bool]) -> None:
    parsed = parse_head(bytearray(head + b"body"), MAX_BODY)
    assert parsed is not None
    assert (parsed.length, parsed.keep_alive, parsed.expects_continue) == expected
    assert parsed.size == len(head)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400),  # a digit to str.isdigit
        (b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n", 400),
        (b"G\x00T / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: x\n\n\r\n\r\n", 400),  # bare LF: the head would end early
        (b"\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1), 413),
    ],
)
def test_refused_heads(head: bytes, status: int) -> None:
    with pytest.raises(RefusedError) as refused:
        parse_head(bytearray(head), MAX_BODY)
    assert refused.value.status == status


def test_an_incomplete_head_waits_for_more() -> None:
    assert parse_head(bytearray(b"GET / HTTP/1.1\r\nHost: w\r\n"), MAX_BODY) is None


def test_environ() -> None:
    head = parse_head(
        bytearray(
            b"POST /mutate%2Fx?timeout=10s HTTP/1.1\r\nHost: w\r\nContent-Type: application/json"
            b"\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\nX_A: spoofed\r\n\r\n"
        ),
        MAX_BODY,
    )
    assert head is not None
    env = environ(Request(head, b"{}"), ("0.0.0.0", 8443), ("10.0.0.7", 51000))
    assert env["REQUEST_METHOD"] == "POST"
    assert env["PATH_INFO"] == "/mutate/x"
    assert env["QUERY_STRING"] == "timeout=10s"
    assert env["CONTENT_TYPE"] == "application/json"
    assert env["CONTENT_LENGTH"] == "2"
    assert env["HTTP_X_A"] == "1,2"
    assert env["HTTP_HOST"] == "w"
    assert env["REMOTE_ADDR"] == "10.0.0.7"
    assert env["SERVER_PORT"] == "8443"
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert env["wsgi.url_scheme"] == "https"
    assert env["wsgi.input"].read() == b"{}"


def test_a_port_in_use_fails_the_start(app: Flask, tls: ServingTLS, server: Server) -> None:
    taken = replace(settings().server, port=server.port)
    with pytest.raises(OSError):
        https_server(app, tls, taken).start()


def test_server_processes_share_the_port(app: Flask, tls: ServingTLS, ca: KeyPair) -> None:
    """With several processes each server binds the port with SO_REUSEPORT (here two servers in
    one process, which the kernel treats alike)."""
    shared = replace(settings().server, processes=2)
    first = https_server(app, tls, shared).start()
    second = https_server(app, tls, replace(shared, port=first.port)).start()
    try:
        for running in (first, second):
            assert running.port == first.port
        conn = connect(second, ca)
        try:
            assert mutate(conn, "web-0")["uid"] == "uid-web-0"
        finally:
            conn.close()
    finally:
        second.stop()
        first.stop()
