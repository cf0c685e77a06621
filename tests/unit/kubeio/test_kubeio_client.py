"""The client's connection handling against a local HTTP server: keep-alive reuse, a connection
the server closed while idle, a guard that stops a request before it is written, and watches."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client

from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIGoneError, APINotFoundError, APITransportError, FencedError
from kubeio.requests import prepare


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, close_after_each: bool) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.close_after_each = close_after_each
        self.requests: list[str] = []
        self.traceparents: list[str | None] = []
        self.connections = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _watch(self) -> None:
        """Chunked watch events, one flushed per chunk, as the apiserver writes them; `split`
        cuts one event across two chunks, `cut` drops the connection inside a chunk."""
        if "gone" in self.path:
            body = b'{"kind":"Status","reason":"Expired","code":410}'
            self.send_response(410)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [
            b'{"type":"ADDED","object":{"n":1}}\n',
            b'{"type":"MODIF',
            b'IED","object":{"n":2}}\n',
        ]
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        if "cut" in self.path:
            self.wfile.write(b'40\r\n{"type":')
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")

    def _answer(self) -> None:
        if "watch=true" in self.path:
            self._watch()
            return
        self.server.traceparents.append(self.headers.get("traceparent"))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests.append(f"{self.command} {self.path}")
        status, body = (
            (404, b'{"kind":"Status","reason":"NotFound"}')
            if "missing" in self.path
            else (200, b'{"ok":true}')
        )
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_after_each:
            # Closed while idle, without a "Connection: close": as a server's idle timeout does.
            self.close_connection = True

    do_GET = do_POST = _answer  # noqa: N815 - http.server dispatches on these names

    def log_message(self, *args: object) -> None:
        pass


def serve(close_after_each: bool) -> Iterator[tuple[Server, Kube]]:
    server = Server(close_after_each)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    kube = Kube(configuration, ClientSettings())
    try:
        yield server, kube
    finally:
        kube.close()
        server.shutdown()
        server.server_close()


def test_requests_one_after_another_share_one_connection(keeps: tuple[Server, Kube]) -> None:
    server, kube = keeps
    for _ in range(5):
        assert kube.get("/api/v1/namespaces/a") == {"ok": True}
    assert server.connections == 1


@pytest.mark.parametrize(
    "fresh_seconds",
    [0.0, 60.0],
    ids=["found-closed-before-reuse", "send-fails-and-is-retried"],
)
def test_a_connection_the_server_closed_while_idle_is_replaced_not_an_error(
    closes: tuple[Server, Kube], monkeypatch: pytest.MonkeyPatch, fresh_seconds: float
) -> None:
    # A connection idle for long is checked before reuse; a recently used one is reused at once,
    # and its send fails on the closed socket before any answer, so it is sent once more.
    monkeypatch.setattr("kubeio.client._FRESH_SECONDS", fresh_seconds)
    server, kube = closes
    for i in range(5):
        assert kube.create(f"/api/v1/namespaces/a/configmaps?n={i}", {"n": i}) == {"ok": True}
    assert server.requests == [f"POST /api/v1/namespaces/a/configmaps?n={i}" for i in range(5)]
    assert server.connections == 5


def test_an_error_status_raises_and_the_connection_is_reused(keeps: tuple[Server, Kube]) -> None:
    server, kube = keeps
    with pytest.raises(APINotFoundError):
        kube.get("/api/v1/namespaces/missing")
    assert kube.get("/api/v1/namespaces/a") == {"ok": True}
    assert server.connections == 1


def test_a_failing_guard_sends_nothing_and_keeps_the_connection(keeps: tuple[Server, Kube]) -> None:
    server, kube = keeps
    kube.get("/api/v1/namespaces/a")
    with pytest.raises(FencedError):
        kube.create("/api/v1/namespaces/a/configmaps", {}, guard=lambda: False)
    kube.create("/api/v1/namespaces/a/configmaps", {}, guard=lambda: True)
    assert server.requests == ["GET /api/v1/namespaces/a", "POST /api/v1/namespaces/a/configmaps"]
    assert server.connections == 1


def test_concurrent_requests_each_get_a_connection_and_leave_it_for_reuse(
    keeps: tuple[Server, Kube],
) -> None:
    server, kube = keeps
    barrier = threading.Barrier(4)
    results: list[object] = []

    def worker() -> None:
        barrier.wait()
        results.append(kube.get("/api/v1/namespaces/a"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [{"ok": True}] * 4
    opened = server.connections
    for _ in range(10):
        kube.get("/api/v1/namespaces/a")
    assert server.connections == opened  # the idle ones were reused


def test_a_watch_yields_each_event_however_the_chunks_split_them(
    keeps: tuple[Server, Kube],
) -> None:
    _server, kube = keeps
    events = list(kube.stream("/api/v1/pods", {"resourceVersion": "7"}, timeout=10))
    assert events == [
        {"type": "ADDED", "object": {"n": 1}},
        {"type": "MODIFIED", "object": {"n": 2}},
    ]


def test_a_watch_cut_inside_an_event_ends_with_a_transport_error(
    keeps: tuple[Server, Kube],
) -> None:
    _server, kube = keeps
    seen = []
    with pytest.raises(APITransportError):
        for event in kube.stream("/api/v1/pods/cut", {}, timeout=10):
            seen.append(event["object"]["n"])
    assert seen == [1, 2]  # the events before the cut were delivered


def test_a_watch_refused_raises_the_status_error(keeps: tuple[Server, Kube]) -> None:
    _server, kube = keeps
    with pytest.raises(APIGoneError):
        kube.stream("/api/v1/pods/gone", {"resourceVersion": "1"}, timeout=10)


def test_a_request_carries_its_own_headers_beside_the_usual_ones(
    keeps: tuple[Server, Kube],
) -> None:
    server, kube = keeps
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    request = prepare("POST", "/api/v1/namespaces/a/pods", body={}, headers={"traceparent": parent})
    assert kube.send(request).status == 200
    kube.get("/api/v1/namespaces/a")
    assert server.traceparents == [parent, None]
