"""A plain-HTTP server whose every resource is bounded, for the ports a component opens besides
the webhook's: `/healthz`, `/readyz`, `/metrics`, and the controller's web view.

Any pod that can reach such a port can open connections to it, so each one is capped:

- connections: at most `Limits.connections` open at once. At the cap a new connection closes the
  oldest one still waiting for its head (an idle or slow sender) to make room; only when every
  open connection is being answered is the new one answered 503 and closed. A flood of idle
  connections therefore never locks out the kubelet's probe.
- bytes: the head (request line and headers) is at most `Limits.head_bytes`; these endpoints
  take no body, so a request that announces one is refused (413) before anything is read.
- time: the head must arrive within `Limits.head_seconds` of the accept (a slow sender is cut,
  however it spreads its bytes), and the answer must be written within `Limits.write_seconds`.
  Each connection carries one request (`Connection: close`), so no connection idles between
  requests.
- threads: heads are read by one event-loop thread (asyncio, from the standard library), which
  holds idle connections without a thread each; complete requests are answered by a fixed pool of
  `Limits.threads` threads.

Every refusal is counted in `gpuplace_http_refused_total{server, reason}` (`REASONS`).

Threads: the event loop owns the connection table (`_open`, `_waiting`); only its thread reads or
writes it. The handler runs on the pool's threads and must be safe to call concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import Message
from http import HTTPStatus
from typing import Final

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

#: Why a connection or request was refused: the `reason` label's only values.
REASONS: Final = (
    "connections",  # the cap was reached and every open connection was being answered: 503
    "evicted",  # closed while waiting for its head, to make room for a new connection
    "head_timeout",  # the head did not arrive within head_seconds: 408
    "head_too_large",  # the head exceeded head_bytes: 431
    "body",  # the request announced a body: 413
    "malformed",  # not an HTTP/1.x request line and headers: 400
    "write_timeout",  # the answer could not be written within write_seconds
    "busy",  # the handler lacked capacity for the request (e.g. token reviews in flight): 503
)


@dataclass(frozen=True)
class Limits:
    connections: int = 64
    threads: int = 2
    head_bytes: int = 8192
    head_seconds: float = 10.0
    write_seconds: float = 10.0
    #: Connections the kernel queues before the event loop accepts them.
    backlog: int = 128


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    headers: Message


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]


class ServerMetrics:
    """The refusal counter of every bounded server of a process (one per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "gpuplace_http_refused_total",
            "Connections and requests refused by a component's own HTTP ports, by server and "
            "reason (connections, evicted, head_timeout, head_too_large, body, malformed, "
            "write_timeout, busy)",
            ["server", "reason"],
            registry=registry,
        )

    def refuse(self, server: str, reason: str) -> None:
        assert reason in REASONS, reason
        self.refused.labels(server, reason).inc()


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    #: Still counted in `_open` (an evicted connection is uncounted at once, not when it ends).
    counted: bool = True
    task: asyncio.Task[None] | None = field(default=None)


class _RefusedError(Exception):
    def __init__(self, reason: str, status: int | None, text: str = "") -> None:
        super().__init__(text or reason)
        self.reason = reason
        self.status = status


class BoundedServer:
    """Serves `handler` on host:port within `limits`; `name` is the metric's `server` label."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: Handler,
        metrics: ServerMetrics,
        limits: Limits | None = None,
    ) -> None:
        self.name = name
        self.handler = handler
        self.metrics = metrics
        self.limits = limits or Limits()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, so that a port in use fails the caller, not a background thread.
        self._sock = socket.create_server((host, port), family=family, backlog=self.limits.backlog)
        self.port: int = self._sock.getsockname()[1]
        self._pool = ThreadPoolExecutor(self.limits.threads, thread_name_prefix=f"{name}-http")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"{name}-http", daemon=True)
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        # Owned by the event loop's thread (see the module's docstring).
        self._open = 0
        self._waiting: dict[_Conn, None] = {}  # connections reading their head, oldest first
        self._conns: set[_Conn] = set()
        #: The most connections open at once since start (for tests and debugging).
        self.peak = 0

    def start(self) -> BoundedServer:
        self._thread.start()
        self._started.wait()
        return self

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
        else:
            self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def open_connections(self) -> int:
        return self._open

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve_forever())
        finally:
            self._loop.close()

    async def _serve_forever(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._connected, sock=self._sock, limit=self.limits.head_bytes
        )
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for conn in list(self._conns):
                conn.writer.transport.abort()
                if conn.task is not None:
                    conn.task.cancel()
            tasks = [c.task for c in self._conns if c.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer, counted=False, task=asyncio.current_task())
        self._conns.add(conn)
        if self._open >= self.limits.connections and not self._evict_oldest_waiting():
            self.metrics.refuse(self.name, "connections")
            try:
                await self._answer_and_close(writer, _plain(503, "too many connections\n"))
            finally:
                self._conns.discard(conn)
            return
        conn.counted = True
        self._open += 1
        self.peak = max(self.peak, self._open)
        self._waiting[conn] = None
        try:
            await self._serve(conn, reader)
        except asyncio.CancelledError:
            pass  # evicted or stopping
        except Exception:
            log.exception("%s: serving a connection failed", self.name)
        finally:
            self._waiting.pop(conn, None)
            self._conns.discard(conn)
            if conn.counted:
                self._open -= 1
            writer.transport.abort()

    def _evict_oldest_waiting(self) -> bool:
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        del self._waiting[oldest]
        oldest.counted = False
        self._open -= 1
        oldest.writer.transport.abort()
        if oldest.task is not None:
            oldest.task.cancel()
        self.metrics.refuse(self.name, "evicted")
        return True

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        try:
            request = await self._read_request(reader)
        except _RefusedError as refused:
            if refused.reason:
                self.metrics.refuse(self.name, refused.reason)
            self._waiting.pop(conn, None)
            if refused.status is not None:
                await self._answer_and_close(conn.writer, _plain(refused.status, f"{refused}\n"))
            return
        self._waiting.pop(conn, None)  # no longer idle: never evicted from here on
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(self._pool, self._call, request)
        await self._answer_and_close(conn.writer, response, head_only=request.method == "HEAD")

    async def _read_request(self, reader: asyncio.StreamReader) -> Request:
        try:
            async with asyncio.timeout(self.limits.head_seconds):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise _RefusedError(
                "head_timeout", 408, "the request took too long to arrive"
            ) from None
        except asyncio.LimitOverrunError:
            raise _RefusedError(
                "head_too_large", 431, "the request's headers are too large"
            ) from None
        except asyncio.IncompleteReadError as exc:
            # Closed before a whole head; an empty one is a TCP check, not a refusal.
            raise _RefusedError("malformed" if exc.partial else "", None) from None
        except ConnectionError:
            raise _RefusedError("", None) from None
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
            raise _RefusedError("malformed", 400, "not an HTTP/1.x request")
        try:
            headers = http.client.parse_headers(io.BytesIO(rest))
        except http.client.HTTPException:
            raise _RefusedError("malformed", 400, "malformed headers") from None
        if headers.get("Transfer-Encoding") or headers.get("Content-Length", "0").strip() != "0":
            raise _RefusedError("body", 413, "this endpoint takes no request body")
        return Request(parts[0], parts[1].split("?", 1)[0], headers)

    def _call(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return _plain(500, "internal error\n")

    async def _answer_and_close(
        self, writer: asyncio.StreamWriter, response: Response, head_only: bool = False
    ) -> None:
        phrase = _phrase(response.status)
        lines = [
            f"HTTP/1.1 {response.status} {phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in response.headers),
        ]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.transport.set_write_buffer_limits(high=0)  # drain() waits for the last byte
        try:
            async with asyncio.timeout(self.limits.write_seconds):
                writer.write(data if head_only else data + response.body)
                await writer.drain()
                writer.close()
                await writer.wait_closed()
        except TimeoutError:
            self.metrics.refuse(self.name, "write_timeout")
        except ConnectionError:
            pass  # the client went away
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()


def _plain(status: int, text: str) -> Response:
    return Response(status, text.encode())


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"
