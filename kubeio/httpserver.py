"""`/healthz`, `/readyz` and `/metrics` for the controller and the agent (the webhook has its own
server), on a bounded server (kubeio/boundedserver.py)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kubeio.boundedserver import BoundedServer, Limits, Request, Response, ServerMetrics

#: Probes and scrapes: short heads, a couple of requests at a time.
OPS_LIMITS = Limits(connections=64, threads=2, head_bytes=8192)


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        healthy: Callable[[], bool] = lambda: True,
        metrics: ServerMetrics | None = None,
        limits: Limits = OPS_LIMITS,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.healthy = healthy
        #: The process's refusal counter; pass it to the process's other bounded servers.
        self.metrics = metrics or ServerMetrics(registry)
        self.server = BoundedServer("ops", host, port, self.answer, self.metrics, limits)
        self.port = self.server.port

    def answer(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"GET only\n", headers=(("Allow", "GET, HEAD"),))
        if request.path == "/metrics":
            return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if request.path == "/healthz":
            ok = self.healthy()
            return Response(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
        if request.path == "/readyz":
            ok = self.ready()
            return Response(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
        return Response(404, b"not found\n")

    def start(self) -> OpsServer:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
