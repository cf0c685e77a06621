"""The webhook's app on the components' one server (`kubeio.server`), over TLS, within this
process's share of the `ServerSettings` caps (`ServerSettings.per_process`), with map validations on a pool of threads shared fairly between
namespaces (`ValidationPool`).

Pod admissions take tens of microseconds and are answered on the server's loop; a placement map's
validation takes seconds for a large map, so it waits for one of `validation_threads` threads in a
queue of its namespace (`webhook.fairqueue`), and past its caps is denied at once with 429.
"""

from __future__ import annotations

import time

import orjson
from flask import Flask

from kubeio.bounds import Bounds, Refusal
from kubeio.http11 import Request, encode
from kubeio.pool import Full, Job
from kubeio.server import ContextSource, Server
from webhook.fairqueue import FairQueue, QueueRefusal
from webhook.review import Verdict, peek, render_response
from webhook.settings import CONNECTION_SHARE_BYTES, ServerSettings
from webhook.state import state_of

#: (method, path) answered on the pool: map validation takes seconds for a 1 MiB map.
SLOW_ROUTES = frozenset({("POST", "/validate")})
#: The request line and headers together; past this: 431.
MAX_HEAD_BYTES = 64 * 1024


class ValidationPool:
    """Map validations on `threads` threads, queued per namespace (`FairQueue`), within this
    process's share of the caps."""

    def __init__(self, settings: ServerSettings) -> None:
        caps = settings.per_process()
        self.threads = caps.validation_threads
        self._fair: FairQueue[Job] = FairQueue(
            caps.validation_queue_per_namespace, caps.validation_queue
        )
        self.queue = self._fair

    def key(self, request: Request) -> str | None:
        """The review's namespace for a map validation ("" when cluster-scoped or unreadable);
        None for everything else, answered on the loop."""
        if (request.head.method, request.head.target.partition("?")[0]) not in SLOW_ROUTES:
            return None
        seen = peek(request.body)
        return seen[1] if seen else ""

    def held(self, namespace: str) -> int:
        """Map validations of `namespace` queued or running now."""
        return self._fair.held(namespace)

    def refused(self, request: Request, full: Full, close: bool) -> bytes | None:
        """A denied review, which kubectl and ArgoCD show as it is; None (503, then closed) when
        the body is no review: nothing to deny."""
        seen = peek(request.body)
        return None if seen is None else _busy(seen[0], seen[1], full, close)


#: The wait a busy denial asks for (`Retry-After`): kubectl and ArgoCD send the map again after it.
BUSY_RETRY_AFTER_SECONDS = 1


def _busy(uid: str, namespace: str, full: Full, close: bool) -> bytes:
    """The review answering `uid` that the validator is busy: denied with 429, nothing stored."""
    if full.reason == QueueRefusal.NAMESPACE:
        held = f"{full.cap} placement maps of namespace {namespace or '(cluster)'}"
    else:
        held = f"{full.cap} placement maps"
    verdict = Verdict.deny(
        f"gpuplace: the placement-map validator is busy with {held}, the most it queues; nothing "
        f"was changed: apply again in a few seconds",
        code=429,
        reason="TooManyRequests",
        retry_after_seconds=BUSY_RETRY_AFTER_SECONDS,
    )
    body = orjson.dumps(render_response(uid, verdict))
    return encode("200 OK", [("Content-Type", "application/json")], body, close=close)


def bounds_of(settings: ServerSettings) -> Bounds:
    """This process's bounds: its share of the server's caps, and every timeout."""
    caps = settings.per_process()
    return Bounds(
        max_connections=caps.max_connections,
        max_connections_per_client=caps.max_connections_per_client,
        max_head_bytes=MAX_HEAD_BYTES,
        max_body_bytes=settings.max_body_bytes,
        connection_share_bytes=CONNECTION_SHARE_BYTES,
        max_buffered_bytes=caps.max_buffered_bytes,
        handshake_timeout_seconds=settings.handshake_timeout_seconds,
        head_timeout_seconds=settings.head_timeout_seconds,
        request_timeout_seconds=settings.request_timeout_seconds,
        idle_timeout_seconds=settings.idle_timeout_seconds,
        write_timeout_seconds=settings.write_timeout_seconds,
        shutdown_timeout_seconds=settings.shutdown_timeout_seconds,
    )


def https_server(
    app: Flask,
    tls: ContextSource,
    settings: ServerSettings,
    pool: ValidationPool | None = None,
) -> Server:
    """The server of `app` (not started); `pool`: the validation pool, made from `settings`
    when None. Its refusals count in `gpuplace_webhook_refused_total`, its load in the
    connection and buffered-bytes gauges."""
    metrics = state_of(app).metrics
    for reason in (*Refusal, *QueueRefusal):
        metrics.refused.labels(reason.value)  # every series from the start, at 0

    def refused(reason: str) -> None:
        metrics.refused.labels(reason).inc()

    def load(connections: int, buffered: int) -> None:
        metrics.connections.set(connections)
        metrics.buffered_bytes.set(buffered)

    return Server(
        "https",
        app,
        settings.host,
        settings.port,
        bounds_of(settings),
        tls=tls,
        offload=pool or ValidationPool(settings),
        refused=refused,
        load=load,
        reuse_port=settings.processes > 1,
    )


def drain(app: Flask, settings: ServerSettings, server: Server) -> None:
    """Fails /readyz and closes each kept-alive connection with its next answer, then waits
    the shutdown delay: endpoints drop this replica and the apiserver, whose pooled connections
    outlive the endpoint, retires them itself instead of writing on one `stop` closes."""
    state_of(app).draining.set()
    server.drain()
    time.sleep(settings.shutdown_delay_seconds)
