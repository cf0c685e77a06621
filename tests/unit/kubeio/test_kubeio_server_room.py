"""No client holds a port of the one server (`kubeio.server`): which connection makes room for a
new one, the cap on each client address, the kubelet's probes under a flood, and heads the parser
fails on. Plain HTTP on loopback; each loopback address (127.0.0.x) is a client of its own.
Assertions are on which connection closed and on counts, never on times."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry

from kubeio import serverconn
from kubeio.bounds import Bounds, small_bounds
from kubeio.httpserver import PROBE_PATHS, OpsServer, ServerMetrics, answer, small_server
from tests.unit.kubeio.test_kubeio_httpserver import (
    WAIT,
    connect,
    eventually,
    exchange,
    get,
    read_all,
    refused,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
#: Bounds of a small port whose connections stay open between requests.
KEPT = replace(small_bounds(connections=3, head_bytes=8192), keep_alive=True)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (it sends nothing unasked)."""
    return read_all(sock) == b""


def answered(sock: socket.socket) -> bytes:
    """One whole answer to a request sent on a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "closed before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    """Sockets a test opens, closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


@contextmanager
def ops(registry: CollectorRegistry, bounds: Bounds) -> Iterator[OpsServer]:
    server = OpsServer("127.0.0.1", 0, registry, ready=lambda: True, bounds=bounds).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_full_port_closes_the_connection_idle_the_longest_answered_or_not(
    registry: CollectorRegistry, opened: list[socket.socket]
) -> None:
    with ops(registry, replace(KEPT, max_connections_per_client=3)) as server:
        answered_first = connect(server.port)
        opened.append(answered_first)
        answered_first.sendall(GET)
        assert answered(answered_first).startswith(b"HTTP/1.1 200 ")
        never_used = connect(server.port)
        opened.append(never_used)
        assert eventually(lambda: server.server.connections == 2)
        half_head = connect(server.port)
        opened.append(half_head)
        half_head.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert eventually(lambda: server.server.buffered_bytes > 0)

        # Full: the answered connection has been idle the longest.
        newer = connect(server.port)
        opened.append(newer)
        assert closed(answered_first)
        assert refused(registry, "evicted") == 1
        # Then the one never used; the new one idles too, but for less long.
        probe = connect(server.port)
        opened.append(probe)
        assert closed(never_used)
        # Idle ones go before a request half sent, however old that one is.
        last = connect(server.port)
        opened.append(last)
        assert closed(newer)
        assert refused(registry, "evicted") == 3
        # The half-sent request goes once nothing idles: every other one is mid-request.
        for sock in (probe, last):
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert eventually(lambda: server.server.buffered_bytes == 3 * 23)
        assert get(server.port) == (200, b"ok\n")
        assert closed(half_head)
        assert refused(registry, "evicted") == 4
        assert refused(registry, "connections") == 0
        assert server.server.peak_connections == 3


def test_a_client_at_its_cap_gives_up_its_own_connection_never_another_clients(
    registry: CollectorRegistry, opened: list[socket.socket]
) -> None:
    bounds = replace(small_bounds(connections=8, head_bytes=8192), max_connections_per_client=2)
    with ops(registry, bounds) as server:
        other = [connect(server.port, "127.0.0.3") for _ in range(2)]
        opened.extend(other)
        flood = [connect(server.port, "127.0.0.2") for _ in range(6)]
        opened.extend(flood)
        # Each past the second closes the flood's own oldest; the port never fills.
        assert eventually(lambda: refused(registry, "evicted") == 4)
        assert all(closed(sock) for sock in flood[:4])
        # The sixth connection is counted just after the eviction it caused.
        assert eventually(lambda: server.server.connections == 4)
        assert server.server.peak_connections == 4
        for sock in other:  # the other client's connections were never touched
            sock.sendall(GET)
            assert read_all(sock).endswith(b"ok\n")


def test_a_full_port_closes_a_connection_of_the_client_holding_the_most_never_a_quiet_ones(
    registry: CollectorRegistry, opened: list[socket.socket]
) -> None:
    """The apiserver's case: one connection kept alive between admissions, idle longer than any
    of a flood's, which comes from a few addresses and keeps opening new connections."""
    kept = replace(small_bounds(connections=5, head_bytes=8192), keep_alive=True)
    bounds = replace(kept, max_connections_per_client=2)
    with ops(registry, bounds) as server:
        quiet = connect(server.port, "127.0.0.5")
        opened.append(quiet)
        quiet.sendall(GET)
        assert answered(quiet).startswith(b"HTTP/1.1 200 ")
        first = [connect(server.port, client) for client in ("127.0.0.2", "127.0.0.2")]
        second = [connect(server.port, client) for client in ("127.0.0.3", "127.0.0.3")]
        opened.extend(first + second)
        assert eventually(lambda: server.server.connections == 5)
        # Full. The quiet connection has waited the longest, but its client holds the fewest:
        # each newcomer closes the longest-waiting of the clients holding the most (the first
        # flood's oldest, then the second's, which holds more by then), then, at the newcomer's
        # own cap, the newcomer's own.
        third = []
        for n in range(1, 5):
            third.append(connect(server.port, "127.0.0.4"))
            opened.append(third[-1])
            assert eventually(lambda n=n: refused(registry, "evicted") == n)
        assert all(closed(sock) for sock in (first[0], second[0], *third[:2]))
        for sock in (quiet, first[1], second[1], *third[2:]):
            sock.sendall(GET)
            assert answered(sock).startswith(b"HTTP/1.1 200 ")
        assert refused(registry, "connections") == 0
        assert server.server.peak_connections == 5


def test_a_client_at_its_cap_whose_connections_are_all_answered_is_refused_a_new_one(
    registry: CollectorRegistry, opened: list[socket.socket]
) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/slow":
            entered.release()
            release.wait(WAIT)
        return answer(start_response, 200, b"done\n")

    bounds = replace(small_bounds(connections=8, head_bytes=8192), max_connections_per_client=1)
    server = small_server("ops", app, "127.0.0.1", 0, ServerMetrics(registry), bounds, 2).start()
    try:
        slow = connect(server.port, "127.0.0.2")
        opened.append(slow)
        slow.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.acquire(timeout=WAIT)
        sock = connect(server.port, "127.0.0.2")
        opened.append(sock)
        assert closed(sock)
        assert refused(registry, "client_connections") == 1
        assert refused(registry, "evicted") == 0
        assert exchange(server.port, GET).endswith(b"done\n")  # another client is served
        release.set()
        assert read_all(slow).endswith(b"done\n")
    finally:
        release.set()
        server.stop()


def test_probes_are_answered_under_a_flood_of_every_kind(
    registry: CollectorRegistry, opened: list[socket.socket]
) -> None:
    """Tenants on four addresses hold every connection of the port: one byte of a head each
    (renewed as they are closed), requests that keep both pool threads busy, and more queued
    behind them; every fresh probe is answered all the same, on the loop."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ["PATH_INFO"]
        if path == "/slow":
            entered.release()
            release.wait(WAIT)
        return answer(start_response, 200, b"ok\n")

    bounds = small_bounds(connections=16, head_bytes=8192)  # 4 connections a client
    server = small_server(
        "ops", app, "127.0.0.1", 0, ServerMetrics(registry), bounds, 2, on_loop=PROBE_PATHS
    ).start()
    tenants = [f"127.0.0.{n}" for n in range(2, 6)]
    try:
        for client in tenants[:2]:  # 8 requests: 2 on the threads, 6 queued behind them
            for _ in range(4):
                sock = connect(server.port, client)
                opened.append(sock)
                sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(2):
            assert entered.acquire(timeout=WAIT)
        for round_ in range(10):
            for client in tenants[2:]:  # one byte a connection, the rest of the port
                for _ in range(4):
                    sock = connect(server.port, client)
                    opened.append(sock)
                    sock.sendall(b"G")
            assert eventually(lambda: server.connections == 16)
            assert get(server.port, "/healthz") == (200, b"ok\n"), round_
            assert get(server.port, "/readyz") == (200, b"ok\n"), round_
        assert refused(registry, "connections") == 0
        assert server.peak_connections == 16
    finally:
        release.set()
        server.stop()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",  # a digit to str.isdigit
        b"GET /healthz HTTP/1.1\r\nContent-Length: \xb2\xb3\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nContent-Length: \xd9\xa3\r\n\r\n",  # Arabic-Indic 3, UTF-8
    ],
)
def test_a_malformed_content_length_is_answered_400_and_counted(
    registry: CollectorRegistry, head: bytes
) -> None:
    with ops(registry, small_bounds(connections=8, head_bytes=8192)) as server:
        assert exchange(server.port, head).startswith(b"HTTP/1.1 400 ")
        assert refused(registry, "malformed") == 1
        assert get(server.port) == (200, b"ok\n")


def test_a_head_the_parser_fails_on_is_answered_400_and_counted(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: object) -> None:
        raise ValueError("invalid literal for int() with base 10: '\xb2'")

    with ops(registry, small_bounds(connections=8, head_bytes=8192)) as server:
        with monkeypatch.context() as patched:
            patched.setattr(serverconn, "parse_head", failing)
            answer_ = exchange(server.port, GET)
        assert answer_.startswith(b"HTTP/1.1 400 ")
        assert b"malformed request head" in answer_
        assert refused(registry, "malformed") == 1
        assert get(server.port) == (200, b"ok\n")
