"""`/healthz`, `/readyz` and `/metrics` for the controller and the agent, a WSGI app on the
components' one server (`kubeio.server`), and what the small ports share: their bounds, their
refusal counter and plain answers.

Any pod that can reach such a port can open connections to it, so each one is bounded
(`kubeio.bounds.small_bounds`): 64 connections, 16 of them to one client address (past either
cap a new connection closes the one that has waited the longest on its client, so no client
locks out the kubelet's probe), an 8 KiB head, no request body (413 before it is read), one
request a connection, and 10 seconds for the head, for the answer to be read and for a connection
that sends nothing. Requests are answered by a fixed pool of threads (`EveryRequest`): a scrape or
a handler that blocks holds a pool thread, never the loop; the probes (`PROBE_PATHS`) are
answered on the loop, behind no scrape. Every refusal is counted in
`gpuplace_http_refused_total{server, reason}`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from kubeio.bounds import Bounds, Refusal, small_bounds
from kubeio.pool import EveryRequest
from kubeio.server import Server

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

#: Why a connection or request was refused: the `reason` label's only values.
REASONS: Final = (
    *(refusal.value for refusal in Refusal),
    "busy",  # the handler lacked capacity for the request (e.g. token reviews in flight): 503
)

#: Probes and scrapes: short heads, a couple of requests at a time.
OPS_BOUNDS = small_bounds(connections=64, head_bytes=8192)
OPS_THREADS = 2
#: What the kubelet asks; their handlers read a few fields, so they are answered on the loop.
PROBE_PATHS: Final = frozenset({"/healthz", "/readyz"})


class ServerMetrics:
    """The refusal counter of every small port of a process (one per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "gpuplace_http_refused_total",
            "Connections and requests refused by a component's own HTTP ports, by server and "
            f"reason ({', '.join(REASONS)})",
            ["server", "reason"],
            registry=registry,
        )

    def refuse(self, server: str, reason: str) -> None:
        assert reason in REASONS, reason
        self.refused.labels(server, reason).inc()


def small_server(
    name: str,
    app: WSGIApplication,
    host: str,
    port: int,
    metrics: ServerMetrics,
    bounds: Bounds,
    threads: int,
    on_loop: frozenset[str] = frozenset(),
) -> Server:
    """A small port's server (not started): every request on `threads` threads but GET and
    HEAD of `on_loop` paths, its refusals counted under `server=name`."""
    return Server(
        f"{name}-http",
        app,
        host,
        port,
        bounds,
        offload=EveryRequest(threads, bounds.max_connections, on_loop),
        refused=partial(metrics.refuse, name),
    )


def answer(
    start_response: StartResponse,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """A whole answer of a WSGI app: `status` with its phrase, the body and its type."""
    start_response(f"{status} {_phrase(status)}", [("Content-Type", content_type), *headers])
    return [body]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def ops_app(
    registry: CollectorRegistry, ready: Callable[[], bool], healthy: Callable[[], bool]
) -> WSGIApplication:
    metrics = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            return answer(start_response, 405, b"GET only\n", headers=[("Allow", "GET, HEAD")])
        path = environ["PATH_INFO"]
        if path == "/metrics":
            # The server leaves the body out of an answer to HEAD; prometheus_client knows GET.
            result: Iterable[bytes] = metrics(dict(environ, REQUEST_METHOD="GET"), start_response)
            return result
        if path == "/healthz":
            ok = healthy()
            return answer(start_response, 200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
        if path == "/readyz":
            ok = ready()
            return answer(start_response, 200 if ok else 503, b"ok\n" if ok else b"not ready\n")
        return answer(start_response, 404, b"not found\n")

    return app


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        healthy: Callable[[], bool] = lambda: True,
        metrics: ServerMetrics | None = None,
        bounds: Bounds = OPS_BOUNDS,
        threads: int = OPS_THREADS,
    ) -> None:
        self.registry = registry
        #: The process's refusal counter; pass it to the process's other small ports.
        self.metrics = metrics or ServerMetrics(registry)
        app = ops_app(registry, ready, healthy)
        self.server = small_server(
            "ops", app, host, port, self.metrics, bounds, threads, on_loop=PROBE_PATHS
        )

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> OpsServer:
        """Binds and serves; a port in use raises OSError here."""
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
