"""The production WSGI server (cheroot) serving the Flask app over TLS, stopped gracefully."""

from __future__ import annotations

import logging
import select
import threading
import time

from cheroot import wsgi
from cheroot.server import HTTPConnection
from flask import Flask

from webhook.settings import ServerSettings
from webhook.state import state_of
from webhook.tls import ServingTLS

log = logging.getLogger(__name__)

#: How long a worker waits on the connection it just answered for that connection's next request
#: before handing it back to cheroot's selector thread. The apiserver keeps one connection per
#: concurrent admission and sends the next create's review on it within milliseconds during a
#: burst; answering it on the same thread skips a register/select/unregister/queue round trip
#: through the selector thread (two thread switches and their GIL hand-overs) per admission.
INLINE_KEEP_ALIVE_SECONDS = 0.005
#: The wait is cut into slices, so that a connection queued for a worker meanwhile waits at most
#: one slice for this one.
INLINE_SLICE_SECONDS = 0.001


class _Server(wsgi.Server):
    """cheroot's server, serving a kept-alive connection's next request on the worker that
    answered the last one while no other connection waits for a worker."""

    def put_conn(self, conn: HTTPConnection) -> None:
        while self._next_request_within(conn, INLINE_KEEP_ALIVE_SECONDS):
            try:
                keep_open = conn.communicate()  # type: ignore[no-untyped-call]
            except Exception as exc:
                # Logged and dropped as cheroot's worker does: raised from here (its `finally`), it
                # would end the worker thread.
                log.info("dropped a kept-alive connection: %r", exc)
                keep_open = False
            if not keep_open:
                conn.close()
                return
        super().put_conn(conn)

    def _next_request_within(self, conn: HTTPConnection, seconds: float) -> bool:
        if conn.rfile.has_data():
            return self.ready
        sock = conn.socket
        pending = getattr(sock, "pending", None)  # TLS records the ssl module already decrypted
        if pending is not None and pending() > 0:
            return self.ready
        waited = 0.0
        while waited < seconds and self.ready and self.requests.qsize == 0:
            try:
                readable, _, _ = select.select([sock], [], [], INLINE_SLICE_SECONDS)
            except (OSError, ValueError):  # closed meanwhile: cheroot's selector drops it
                return False
            if readable:
                return True
            waited += INLINE_SLICE_SECONDS
        return False


class WebhookServer:
    def __init__(self, app: Flask, tls: ServingTLS, settings: ServerSettings) -> None:
        self._app = app
        self._settings = settings
        self._server = _Server(
            (settings.host, settings.port),
            app,
            numthreads=settings.threads,
            server_name="gpuplace-webhook",
            shutdown_timeout=settings.shutdown_timeout_seconds,
            # Several processes bind the same port; the kernel spreads connections over them.
            reuse_port=settings.processes > 1,
        )
        self._server.ssl_adapter = tls.adapter
        # Refuse oversized bodies from the Content-Length, before reading them.
        self._server.max_request_body_size = settings.max_body_bytes
        # No limit on idle keep-alive connections (cheroot's default is 10): past a limit cheroot
        # answers "Connection: close" and each admission pays a new TCP and TLS handshake. With
        # no limit cheroot also skips counting its connections under the selector's lock on
        # every response, a lock its selector thread holds while it works.
        self._server.keep_alive_conn_limit = None  # type: ignore[assignment]  # typed int only
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
