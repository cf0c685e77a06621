"""`/healthz`, `/readyz` and `/metrics` for the controller and the agent (the webhook has Flask)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = outer.healthy()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
                elif path == "/readyz":
                    ok = outer.ready()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.registry = registry
        self.ready = ready
        self.healthy = healthy
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="ops", daemon=True)

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
