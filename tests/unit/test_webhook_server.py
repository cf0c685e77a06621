"""The HTTPS server's handling of kept-alive connections: answered on the worker that has them,
never at the cost of other connections or of a worker thread."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from datetime import timedelta
from typing import BinaryIO

import pytest

from placement.annotations import MAP_LABEL
from tests.unit.webhook_builders import make_model, make_pod, review
from webhook.app import create_app
from webhook.certs import KeyPair, generate_ca, issue_serving
from webhook.modelcache import StaticModel
from webhook.server import WebhookServer
from webhook.settings import ServerSettings, WebhookSettings
from webhook.tls import ServingTLS

THREADS = 2


@pytest.fixture
def ca() -> KeyPair:
    return generate_ca("test-ca", timedelta(days=365))


@pytest.fixture
def server(ca: KeyPair) -> Iterator[WebhookServer]:
    settings = WebhookSettings(
        server=ServerSettings(host="127.0.0.1", port=0, threads=THREADS, shutdown_delay_seconds=0)
    )
    app = create_app(settings, StaticModel(make_model().map("llm").obj()))
    tls = ServingTLS(issue_serving(ca, ["localhost"], ["127.0.0.1"], timedelta(days=1)))
    running = WebhookServer(app, tls, settings.server).start()
    try:
        yield running
    finally:
        running.stop()
        tls.close()


def connect(server: WebhookServer, ca: KeyPair) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)


def mutate(conn: http.client.HTTPSConnection, name: str) -> dict[str, object]:
    pod = make_pod(name).label(MAP_LABEL, "llm").obj()
    body = json.dumps(review(pod, uid=f"uid-{name}")).encode()
    conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    answer: dict[str, object] = json.loads(response.read())["response"]
    return answer


def test_more_kept_alive_connections_than_workers_are_all_answered(
    server: WebhookServer, ca: KeyPair
) -> None:
    """Three connections, two workers, requests in turn: a worker waiting on its connection's next
    request must not leave another connection's request unanswered."""
    conns = [connect(server, ca) for _ in range(THREADS + 1)]
    try:
        for round_ in range(5):
            for i, conn in enumerate(conns):
                answer = mutate(conn, f"web-{round_}-{i}")
                assert answer["uid"] == f"uid-web-{round_}-{i}"
                assert answer["patchType"] == "JSONPatch"
    finally:
        for conn in conns:
            conn.close()


def test_pipelined_requests_are_answered_in_order(server: WebhookServer, ca: KeyPair) -> None:
    """Requests already waiting on a connection (in cheroot's buffer or the TLS layer's) are
    answered, in order, without waiting for more bytes."""
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    paths = [b"/healthz", b"/missing"] * 4
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(b"".join(b"GET %s HTTP/1.1\r\nHost: webhook\r\n\r\n" % p for p in paths))
        stream = sock.makefile("rb")
        statuses = [read_status(stream) for _ in paths]
    assert statuses == [200, 404] * 4


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


def test_connections_closed_by_the_client_leave_every_worker_serving(
    server: WebhookServer, ca: KeyPair
) -> None:
    """A connection closed while a worker waits on it, or half-way through a request, costs no
    worker: if one died, the last request would never be answered."""
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    for i in range(THREADS * 3):
        conn = connect(server, ca)
        mutate(conn, f"web-{i}")
        conn.close()
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\nPOST /mutate HTT")
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
    conns = [connect(server, ca) for _ in range(THREADS)]
    try:
        for i, conn in enumerate(conns):
            assert mutate(conn, f"after-{i}")["uid"] == f"uid-after-{i}"
    finally:
        for conn in conns:
            conn.close()


def test_garbage_after_an_answered_request_gets_a_400_and_the_server_goes_on(
    server: WebhookServer, ca: KeyPair
) -> None:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\nnot http at all\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 ") < 2:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 400" in received
    conn = connect(server, ca)
    try:
        assert mutate(conn, "web-0")["uid"] == "uid-web-0"
    finally:
        conn.close()
