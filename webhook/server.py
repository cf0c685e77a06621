"""The production WSGI server (cheroot) serving the Flask app over TLS, stopped gracefully."""

from __future__ import annotations

import logging
import threading
import time

from cheroot import wsgi
from flask import Flask

from webhook.settings import ServerSettings
from webhook.state import state_of
from webhook.tls import ServingTLS

log = logging.getLogger(__name__)

#: Idle keep-alive connections cheroot keeps open (its default is 10). Every apiserver opens one
#: connection per concurrent admission; past the limit cheroot answers "Connection: close", and
#: each admission then pays a new TCP and TLS handshake: at 16 concurrent pod creates that made
#: the apiserver-side p50 ten times the webhook's own.
KEEP_ALIVE_CONNECTIONS = 1024


class WebhookServer:
    def __init__(self, app: Flask, tls: ServingTLS, settings: ServerSettings) -> None:
        self._app = app
        self._settings = settings
        self._server = wsgi.Server(
            (settings.host, settings.port),
            app,
            numthreads=settings.threads,
            server_name="gpuplace-webhook",
            shutdown_timeout=settings.shutdown_timeout_seconds,
        )
        self._server.ssl_adapter = tls.adapter
        # Refuse oversized bodies from the Content-Length, before reading them.
        self._server.max_request_body_size = settings.max_body_bytes
        self._server.keep_alive_conn_limit = KEEP_ALIVE_CONNECTIONS
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    def start(self) -> WebhookServer:
        self._server.prepare()  # binds now, so `port` is known and errors surface here
        self._thread = threading.Thread(target=self._server.serve, name="https", daemon=True)
        self._thread.start()
        log.info("serving HTTPS on %s:%d", self._settings.host, self.port)
        return self

    def drain(self) -> None:
        """Fails /readyz, then waits the shutdown delay so endpoints drop this replica first."""
        state_of(self._app).draining.set()
        time.sleep(self._settings.shutdown_delay_seconds)

    def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (up to the shutdown timeout)."""
        self._server.stop()
        if self._thread is not None:
            self._thread.join(self._settings.shutdown_timeout_seconds + 1)
