"""The bounded server behind the controller's and agent's own ports, on 127.0.0.1: connection
floods, slow and oversized heads, bodies, stuck readers and the thread cap. Assertions are on
counts; waits are generous and only wait for something the server is bound to do."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from kubeio.boundedserver import BoundedServer, Limits, Request, Response, ServerMetrics
from kubeio.httpserver import OpsServer

WAIT = 30.0


def eventually(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def refused(registry: CollectorRegistry, reason: str, server: str = "ops") -> float:
    value = registry.get_sample_value(
        "gpuplace_http_refused_total", {"server": server, "reason": reason}
    )
    return value or 0.0


def get(port: int, path: str = "/healthz", method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT)


def exchange(port: int, data: bytes) -> bytes:
    """Sends data, then reads until the server closes the connection."""
    with connect(port) as sock:
        sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def ops(registry: CollectorRegistry, **limits: float) -> OpsServer:
    return OpsServer("127.0.0.1", 0, registry, ready=lambda: True, limits=Limits(**limits)).start()


def test_probes_and_metrics(registry: CollectorRegistry) -> None:
    server = OpsServer("127.0.0.1", 0, registry, ready=lambda: False, healthy=lambda: True).start()
    try:
        assert get(server.port) == (200, b"ok\n")
        assert get(server.port, "/readyz") == (503, b"not ready\n")
        assert get(server.port, "/nope")[0] == 404
        assert get(server.port, "/healthz", method="DELETE")[0] == 405
        status, body = get(server.port, "/metrics?x=1")
        assert status == 200 and b"gpuplace_http_refused_total" in body
        head = exchange(server.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    finally:
        server.stop()


def test_an_idle_flood_stays_under_the_cap_and_healthz_is_answered(
    registry: CollectorRegistry,
) -> None:
    server = ops(registry, connections=8)
    flood = [connect(server.port) for _ in range(40)]
    try:
        # Each connection past the eighth closes the oldest idle one.
        assert eventually(lambda: refused(registry, "evicted") == 32)
        assert server.server.open_connections == 8
        assert get(server.port) == (200, b"ok\n")
        assert refused(registry, "evicted") == 33
        assert server.server.peak == 8
        assert refused(registry, "connections") == 0
        assert all(read_all(sock) == b"" for sock in flood[:33])  # closed, nothing sent
    finally:
        for sock in flood:
            sock.close()
        server.stop()


def test_a_full_house_of_requests_in_progress_answers_503() -> None:
    registry = CollectorRegistry()
    release = threading.Event()
    entered = threading.Semaphore(0)

    def handler(request: Request) -> Response:
        entered.release()
        release.wait(WAIT)
        return Response(200, b"done\n")

    server = BoundedServer(
        "ops", "127.0.0.1", 0, handler, ServerMetrics(registry), Limits(connections=2, threads=1)
    ).start()
    busy = [connect(server.port) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.acquire(timeout=WAIT)
        # The second waits for the pool's one thread: complete, so not evictable either.
        assert eventually(lambda: server.open_connections == 2 and not server._waiting)
        answer = exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert refused(registry, "connections") == 1
        release.set()
        for sock in busy:
            assert read_all(sock).endswith(b"done\n")
        assert server.peak == 2
    finally:
        release.set()
        for sock in busy:
            sock.close()
        server.stop()


def test_a_slow_head_is_cut(registry: CollectorRegistry) -> None:
    server = ops(registry, head_seconds=0.5)
    try:
        answer = exchange(server.port, b"GET /healthz HTTP/1.1\r\n")
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert refused(registry, "head_timeout") == 1
        # A sender that trickles bytes is cut as well: the deadline is for the whole head.
        with connect(server.port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            cut = False
            for _ in range(1000):
                try:
                    sock.sendall(b"X-Drip: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                    break
                time.sleep(0.02)
            if not cut:
                cut = read_all(sock).startswith(b"HTTP/1.1 408 ")
            assert cut
        assert eventually(lambda: refused(registry, "head_timeout") == 2)
        assert get(server.port) == (200, b"ok\n")
    finally:
        server.stop()


def test_an_oversized_head_a_body_and_garbage_are_refused(registry: CollectorRegistry) -> None:
    server = ops(registry, head_bytes=4096)
    try:
        big = b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 8192 + b"\r\n\r\n"
        assert exchange(server.port, big).startswith(b"HTTP/1.1 431 ")
        post = b"POST /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        assert exchange(server.port, post).startswith(b"HTTP/1.1 413 ")
        chunked = b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        assert exchange(server.port, chunked).startswith(b"HTTP/1.1 413 ")
        assert exchange(server.port, b"\x16\x03\x01 hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert refused(registry, "head_too_large") == 1
        assert refused(registry, "body") == 2
        assert refused(registry, "malformed") == 1
        assert get(server.port) == (200, b"ok\n")
    finally:
        server.stop()


def test_a_reader_that_stops_reading_is_cut() -> None:
    registry = CollectorRegistry()
    body = b"x" * (64 << 20)
    server = BoundedServer(
        "ops",
        "127.0.0.1",
        0,
        lambda request: Response(200, body),
        ServerMetrics(registry),
        Limits(write_seconds=0.5),
    ).start()
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(WAIT)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert eventually(lambda: refused(registry, "write_timeout") == 1)
            assert eventually(lambda: server.open_connections == 0)
    finally:
        server.stop()


def test_requests_are_answered_by_a_fixed_pool() -> None:
    registry = CollectorRegistry()
    release = threading.Event()
    lock = threading.Lock()
    inside = [0, 0]  # now, most at once
    threads: set[str] = set()

    def handler(request: Request) -> Response:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
            threads.add(threading.current_thread().name)
        release.wait(WAIT)
        with lock:
            inside[0] -= 1
        return Response(200, b"ok\n")

    server = BoundedServer(
        "ops", "127.0.0.1", 0, handler, ServerMetrics(registry), Limits(threads=2)
    ).start()
    clients = [connect(server.port) for _ in range(10)]
    try:
        for sock in clients:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # Every request is complete and waits for the pool before any is released.
        assert eventually(lambda: server.open_connections == 10 and not server._waiting)
        release.set()
        assert all(read_all(sock).endswith(b"ok\n") for sock in clients)
        assert inside[1] == 2
        assert len(threads) <= 2
    finally:
        release.set()
        for sock in clients:
            sock.close()
        server.stop()


def test_a_port_in_use_fails_the_caller(registry: CollectorRegistry) -> None:
    server = ops(registry)
    try:
        with pytest.raises(OSError):
            OpsServer("127.0.0.1", server.port, CollectorRegistry(), ready=lambda: True)
    finally:
        server.stop()
