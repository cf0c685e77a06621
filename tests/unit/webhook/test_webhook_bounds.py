"""The server's bounds under floods (real TLS on 127.0.0.1) and the validation queue's fairness.

Nothing here is timed: floods are small (tens of connections, a few MiB), and each assertion is on
counts and caps, after waiting generously for what must happen.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask, request

from kubeio.bounds import Refusal
from kubeio.server import Server
from tests.unit.webhook.test_webhook_server import WAIT, connect, context_for, mutate, settings
from tests.unit.webhook_builders import make_configmap, make_model, placement_yaml, review
from webhook.app import create_app
from webhook.certs import KeyPair, generate_ca, issue_serving
from webhook.fairqueue import FairQueue, QueueRefusal
from webhook.modelcache import StaticModel
from webhook.server import ValidationPool, https_server
from webhook.settings import CONNECTION_SHARE_BYTES
from webhook.state import state_of
from webhook.tls import ServingTLS

MiB = 1024 * 1024
#: Room in the pool for two bodies of `MAX_BODY` beyond their connections' shares.
CONNECTIONS, MAX_BODY = 16, 1 * MiB
BOUNDED = replace(
    settings().server,
    max_body_bytes=MAX_BODY,
    max_connections=CONNECTIONS,
    # The port's cap, not a client's, is what these tests fill from their one address.
    max_connections_per_client=CONNECTIONS,
    max_buffered_bytes=CONNECTIONS * CONNECTION_SHARE_BYTES
    + 2 * (MAX_BODY - CONNECTION_SHARE_BYTES),
)


@pytest.fixture
def ca() -> KeyPair:
    return generate_ca("test-ca", timedelta(days=365))


@pytest.fixture
def tls(ca: KeyPair) -> Iterator[ServingTLS]:
    serving = ServingTLS(issue_serving(ca, ["localhost"], ["127.0.0.1"], timedelta(days=1)))
    yield serving
    serving.close()


def refused(app: Flask, reason: Refusal | QueueRefusal) -> float:
    value = state_of(app).metrics.registry.get_sample_value(
        "gpuplace_webhook_refused_total", {"reason": reason.value}
    )
    return value or 0.0


def wait_for(what: Any) -> None:
    """Returns once `what()` is true; fails after a generous wait."""
    waited = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if what():
            return
        waited.wait(0.01)
    raise AssertionError("waited too long")


def open_tls(server: Server, ca: KeyPair) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    return context_for(ca).wrap_socket(sock, server_hostname="127.0.0.1")


def unfinished_body(server: Server, ca: KeyPair) -> ssl.SSLSocket | None:
    """A connection sending most of a body of `MAX_BODY`, never the rest; None if the server
    refused it (a 503, then closed) while it was being sent."""
    sock = open_tls(server, ca)
    try:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % MAX_BODY
        )
        sock.sendall(b"x" * (MAX_BODY - 64 * 1024))
    except OSError:
        sock.close()
        return None
    return sock


@pytest.fixture
def bounded(tls: ServingTLS) -> Iterator[tuple[Flask, Server]]:
    app = create_app(
        replace(settings(), server=BOUNDED), StaticModel(make_model().map("llm").obj())
    )
    server = https_server(app, tls, BOUNDED).start()
    try:
        yield app, server
    finally:
        server.stop()


def test_a_flood_of_bodies_and_idle_connections_stays_within_the_caps(
    bounded: tuple[Flask, Server], ca: KeyPair
) -> None:
    app, server = bounded
    bodies = [unfinished_body(server, ca) for _ in range(6)]
    # Two fit in the pool; the other four are answered 503 when their heads arrive.
    wait_for(lambda: refused(app, Refusal.BUFFER) == 4)
    idle = [open_tls(server, ca) for _ in range(3 * CONNECTIONS)]
    try:
        assert refused(app, Refusal.EVICTED) >= 2 * CONNECTIONS
        conn = connect(server, ca)  # a new connection, as the apiserver opens under load
        try:
            assert mutate(conn, "web-0")["uid"] == "uid-web-0"
            assert mutate(conn, "web-1")["uid"] == "uid-web-1"
        finally:
            conn.close()
        assert server.peak_connections <= CONNECTIONS
        assert server.peak_buffered_bytes <= BOUNDED.max_buffered_bytes
        # The two bodies that fit are still held (neither finished nor timed out).
        assert server.buffered_bytes >= 2 * (MAX_BODY - 64 * 1024)
    finally:
        for sock in [*idle, *bodies]:
            if sock is not None:
                sock.close()


def test_past_the_cap_a_half_sent_request_makes_room_for_a_new_connection(
    bounded: tuple[Flask, Server], ca: KeyPair
) -> None:
    app, server = bounded
    started = [open_tls(server, ca) for _ in range(CONNECTIONS)]
    try:
        half = b"GET /healthz HTTP/1.1\r\n"
        for n, sock in enumerate(started, 1):  # half a request each, the first the longest ago
            sock.sendall(half)
            wait_for(lambda n=n: server.buffered_bytes == n * len(half))
        conn = connect(server, ca)
        try:
            assert mutate(conn, "web-0")["uid"] == "uid-web-0"
        finally:
            conn.close()
        assert refused(app, Refusal.EVICTED) == 1
        assert refused(app, Refusal.CONNECTIONS) == 0
        assert started[0].recv(1) == b""  # the one that waited the longest was closed
        assert server.peak_connections == CONNECTIONS
    finally:
        for sock in started:
            sock.close()


# -- map validation shared fairly between namespaces ------------------------------------------


def validate_body(namespace: str, n: int) -> bytes:
    obj = make_configmap("llm", placement_yaml(namespace=namespace), namespace=namespace)
    return json.dumps(
        review(obj, kind="ConfigMap", resource="configmaps", uid=f"{namespace}-{n}")
    ).encode()


def send_validation(conn: http.client.HTTPSConnection, namespace: str, n: int) -> None:
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/validate", body=validate_body(namespace, n), headers=headers)


def answer(conn: http.client.HTTPSConnection) -> dict[str, Any]:
    response = conn.getresponse()
    assert response.status == 200
    result: dict[str, Any] = json.loads(response.read())["response"]
    return result


class Gate:
    """Holds the validations of namespace `flood` until permits are given."""

    def __init__(self, app: Flask) -> None:
        self.entered = threading.Semaphore(0)
        self.permits = threading.Semaphore(0)
        view = app.view_functions["validate.validate"]

        def gated() -> Any:
            if request.get_json()["request"]["namespace"] == "flood":
                self.entered.release()
                assert self.permits.acquire(timeout=WAIT * 3)
            return view()

        app.view_functions["validate.validate"] = gated


def test_a_namespace_flooding_validations_waits_on_its_own_queue(
    tls: ServingTLS, ca: KeyPair
) -> None:
    fair = replace(
        settings().server,
        validation_threads=2,
        validation_queue_per_namespace=4,
        validation_queue=16,
    )
    app = create_app(replace(settings(), server=fair), StaticModel(make_model().map("llm").obj()))
    gate = Gate(app)
    pool = ValidationPool(fair)
    server = https_server(app, tls, fair, pool).start()
    floods = [connect(server, ca) for _ in range(5)]
    other = connect(server, ca)
    try:
        for n, conn in enumerate(floods[:4]):
            send_validation(conn, "flood", n)
            if n < 2:  # both threads hold one of them; the next two queue
                assert gate.entered.acquire(timeout=WAIT)
        wait_for(lambda: pool.held("flood") == 4)
        send_validation(floods[4], "flood", 4)  # the namespace's fifth: refused at once
        busy = answer(floods[4])
        assert busy["allowed"] is False
        assert busy["status"]["code"] == 429
        # The apiserver turns this into `Retry-After: 1`, which client-go waits and retries on.
        assert busy["status"]["details"] == {"retryAfterSeconds": 1}
        assert "busy with 4 placement maps of namespace flood" in busy["status"]["message"]
        assert refused(app, QueueRefusal.NAMESPACE) == 1
        send_validation(other, "team-b", 0)
        wait_for(lambda: pool.held("team-b") == 1)
        # Two permits: one held validation ends and its thread takes the flood's next; that one
        # ends too, and the thread's next turn is team-b's, ahead of the flood's last.
        gate.permits.release(2)
        assert answer(other)["uid"] == "team-b-0"
        gate.permits.release(10)
        for n, conn in enumerate(floods[:4]):
            assert answer(conn) == {"uid": f"flood-{n}", "allowed": True}
    finally:
        gate.permits.release(10)
        for conn in [*floods, other]:
            conn.close()
        server.stop()


def test_the_queue_takes_namespaces_in_turn_within_their_caps() -> None:
    queue: FairQueue[str] = FairQueue(per_key=3, total=5)
    for item in ("a1", "a2", "a3"):
        assert queue.put("a", item) is None
    full = queue.put("a", "a4")
    assert full is not None and (full.reason, full.cap) == (QueueRefusal.NAMESPACE, 3)
    assert queue.put("b", "b1") is None
    assert queue.put("c", "c1") is None
    full = queue.put("d", "d1")
    assert full is not None and full.reason is QueueRefusal.QUEUE
    order = []
    for _ in range(5):
        taken = queue.get()
        assert taken is not None
        order.append(taken[1])
    assert order == ["a1", "b1", "c1", "a2", "a3"]
    assert queue.put("d", "d1") is not None  # taken, not done: still held
    queue.done("a")
    assert queue.held("a") == 2
    assert queue.put("d", "d1") is None
    queue.close()
    assert queue.get() is None


def test_the_queue_under_racing_producers_and_workers() -> None:
    """Every item queued is taken exactly once and every place is given back."""
    queue: FairQueue[int] = FairQueue(per_key=8, total=32)
    taken: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        while (got := queue.get()) is not None:
            with lock:
                taken.append(got[1])
            queue.done(got[0])

    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    queued: list[int] = []

    def produce(p: int) -> None:
        for i in range(500):
            item = p * 1000 + i
            while queue.put(f"ns-{p % 3}", item) is not None:
                threading.Event().wait(0.0005)
            with lock:
                queued.append(item)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(6)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(WAIT * 3)
    wait_for(lambda: len(taken) == len(queued) == 3000)
    queue.close()
    for worker in workers:
        worker.join(WAIT)
    assert sorted(taken) == sorted(queued)
    assert all(queue.held(f"ns-{k}") == 0 for k in range(3))
