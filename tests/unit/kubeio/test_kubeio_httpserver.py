"""The one server (`kubeio.server`) behind the controller's and agent's own ports, plain HTTP on
127.0.0.1 with a small port's bounds: connection floods, slow and oversized heads, bodies, stuck
readers and the thread cap. Assertions are on counts; waits are generous and only wait for
something the server is bound to do."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry

from kubeio import server as loop
from kubeio.bounds import Bounds, small_bounds
from kubeio.httpserver import OPS_BOUNDS, OpsServer, ServerMetrics, answer, small_server
from kubeio.server import Server

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

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


def connect(port: int, client: str = "127.0.0.1") -> socket.socket:
    """A connection from `client`, a loopback address: each one is a client of its own."""
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT, source_address=(client, 0))


def exchange(port: int, data: bytes) -> bytes:
    """Sends data, then reads until the server closes the connection (b"" if it closed it
    without an answer, before or after the data arrived)."""
    with connect(port) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b""
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


@pytest.fixture
def short_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timeouts are checked every 0.05 s instead of every second."""
    monkeypatch.setattr(loop, "TICK_SECONDS", 0.05)


def ops(registry: CollectorRegistry, bounds: Bounds = OPS_BOUNDS) -> OpsServer:
    return OpsServer("127.0.0.1", 0, registry, ready=lambda: True, bounds=bounds).start()


Handler = Callable[[], bytes]


def all_busy(server: Server) -> bool:
    """Whether the server is answering on every open connection (none may make room)."""
    try:
        return all(conn.busy for conn in list(server._acceptor.connections))
    except RuntimeError:  # the loop's thread changed the set meanwhile: look again
        return False


def serve(registry: CollectorRegistry, handler: Handler, bounds: Bounds, threads: int) -> Server:
    """`handler`'s body, 200, on a small port's server."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return answer(start_response, 200, handler())

    return small_server(
        "ops", app, "127.0.0.1", 0, ServerMetrics(registry), bounds, threads
    ).start()


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
        assert b"Content-Length: 3\r\n" in head
        # One request a connection: an HTTP/1.1 client is told, so none idles between requests.
        assert b"Connection: close\r\n" in head
    finally:
        server.stop()


def test_an_idle_flood_stays_under_the_cap_and_healthz_is_answered(
    registry: CollectorRegistry,
) -> None:
    bounds = replace(small_bounds(connections=8, head_bytes=8192), max_connections_per_client=8)
    server = ops(registry, bounds)
    flood = [connect(server.port) for _ in range(40)]
    try:
        # Each connection past the eighth closes the oldest idle one.
        assert eventually(lambda: refused(registry, "evicted") == 32)
        assert server.server.connections == 8
        assert get(server.port) == (200, b"ok\n")
        assert refused(registry, "evicted") == 33
        assert server.server.peak_connections == 8
        assert refused(registry, "connections") == 0
        assert all(read_all(sock) == b"" for sock in flood[:33])  # closed, nothing sent
    finally:
        for sock in flood:
            sock.close()
        server.stop()


def test_a_full_house_of_requests_in_progress_closes_a_new_connection() -> None:
    registry = CollectorRegistry()
    release = threading.Event()
    entered = threading.Semaphore(0)

    def handler() -> bytes:
        entered.release()
        release.wait(WAIT)
        return b"done\n"

    server = serve(registry, handler, small_bounds(connections=2, head_bytes=8192), threads=1)
    busy = [connect(server.port, client) for client in ("127.0.0.2", "127.0.0.3")]
    try:
        for sock in busy:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.acquire(timeout=WAIT)
        # The second is queued for the pool's one thread: being answered, so not evictable either.
        assert eventually(lambda: server.connections == 2 and all_busy(server))
        assert exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        assert refused(registry, "connections") == 1
        release.set()
        for sock in busy:
            assert read_all(sock).endswith(b"done\n")
        assert server.peak_connections == 2
    finally:
        release.set()
        for sock in busy:
            sock.close()
        server.stop()


@pytest.mark.usefixtures("short_tick")
def test_a_slow_head_is_cut(registry: CollectorRegistry) -> None:
    server = ops(registry, replace(OPS_BOUNDS, head_timeout_seconds=0.5))
    try:
        assert exchange(server.port, b"GET /healthz HTTP/1.1\r\n") == b""
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
                cut = read_all(sock) == b""
            assert cut
        assert eventually(lambda: refused(registry, "head_timeout") == 2)
        assert get(server.port) == (200, b"ok\n")
    finally:
        server.stop()


def test_an_oversized_head_a_body_and_garbage_are_refused(registry: CollectorRegistry) -> None:
    server = ops(registry, small_bounds(connections=64, head_bytes=4096))
    try:
        big = b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 8192 + b"\r\n\r\n"
        assert exchange(server.port, big).startswith(b"HTTP/1.1 431 ")
        post = b"POST /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        assert exchange(server.port, post).startswith(b"HTTP/1.1 413 ")
        chunked = b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        assert exchange(server.port, chunked).startswith(b"HTTP/1.1 411 ")
        assert exchange(server.port, b"\x16\x03\x01 hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert refused(registry, "head_too_large") == 1
        assert refused(registry, "body") == 2
        assert refused(registry, "malformed") == 1
        assert get(server.port) == (200, b"ok\n")
    finally:
        server.stop()


@pytest.mark.usefixtures("short_tick")
def test_a_reader_that_stops_reading_is_cut() -> None:
    registry = CollectorRegistry()
    body = b"x" * (64 << 20)
    server = serve(registry, lambda: body, replace(OPS_BOUNDS, write_timeout_seconds=0.5), 2)
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(WAIT)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert eventually(lambda: refused(registry, "write_timeout") == 1)
            assert eventually(lambda: server.connections == 0)
    finally:
        server.stop()


def test_requests_are_answered_by_a_fixed_pool() -> None:
    registry = CollectorRegistry()
    release = threading.Event()
    lock = threading.Lock()
    inside = [0, 0]  # now, most at once
    threads: set[str] = set()

    def handler() -> bytes:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
            threads.add(threading.current_thread().name)
        release.wait(WAIT)
        with lock:
            inside[0] -= 1
        return b"ok\n"

    server = serve(registry, handler, OPS_BOUNDS, threads=2)
    clients = [connect(server.port) for _ in range(10)]
    try:
        for sock in clients:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # Every request is complete and waits for the pool before any is released.
        assert eventually(lambda: server.connections == 10 and all_busy(server))
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
        taken = OpsServer("127.0.0.1", server.port, CollectorRegistry(), ready=lambda: True)
        with pytest.raises(OSError):
            taken.start()
    finally:
        server.stop()
