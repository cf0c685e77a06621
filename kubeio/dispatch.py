"""How `kubeio.server.Server` answers the requests it reads: the app called on the loop's thread,
or on a fixed pool of threads for the requests an `Offload` policy (`kubeio.pool`) sends there,
so that those never hold up the others; their connection reads nothing more until the answer is
back.

Threads: `serve` runs on the server's loop thread. A pool thread only calls the app and hands
`(connection, answer)` back through `_finished` (under `_lock`) and `wake`; the loop's thread
takes them with `take_finished`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from kubeio.bounds import Bounds
from kubeio.http11 import RefusedError, Request, call, environ
from kubeio.pool import Job, Offload
from kubeio.serverconn import OUT_HIGH_WATER, Connection, RequestReader

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger(__name__)


class Dispatch:
    """Answers the requests of a server named `name` serving `app` at `host`:`port()`.
    `refused(reason)` counts each refusal; `wake()` tells the loop's thread an answer is back;
    once `stopping` is set every answer closes its connection."""

    def __init__(
        self,
        name: str,
        app: WSGIApplication,
        host: str,
        port: Callable[[], int],
        scheme: str,
        bounds: Bounds,
        reader: RequestReader,
        *,
        offload: Offload | None,
        multiprocess: bool,
        refused: Callable[[str], None],
        draining: threading.Event,
        wake: Callable[[], None],
    ) -> None:
        self.name = name
        self._app = app
        self._host = host
        self._port = port
        self._scheme = scheme
        self._bounds = bounds
        self._reader = reader
        self._offload = offload
        self._multiprocess = multiprocess
        self._refused = refused
        self._draining = draining  # set: every answer closes its connection
        self._wake = wake
        threads = offload.threads if offload is not None else 0
        self.workers = [
            threading.Thread(target=self._work, name=f"{name}-pool-{n}", daemon=True)
            for n in range(threads)
        ]
        self._lock = threading.Lock()
        self._finished: collections.deque[tuple[Connection, bytes]] = collections.deque()

    # -- the loop's thread ---------------------------------------------------------------------
    def serve(self, conn: Connection) -> None:
        """Answers the complete requests in the inbox, in order (the answers are queued on the
        connection, not written)."""
        reader = self._reader
        answered = False
        while not conn.busy and len(conn.out) < OUT_HIGH_WATER and conn.inbox:
            try:
                request = reader.next_request(conn)
            except RefusedError as refusal:
                log.info("%s: refused a request from %s: %s", self.name, conn.remote[0], refusal)
                if refusal.refusal is not None:
                    self._refused(refusal.refusal)
                conn.answered(refusal.answer())
                reader.drop(conn)
                conn.head = None
                conn.closing = True
                break
            if request is None:
                break
            close = (
                not request.head.keep_alive
                or not self._bounds.keep_alive
                or self._draining.is_set()
            )
            conn.closing = conn.closing or close
            key = self._offload.key(request) if self._offload is not None else None
            if key is not None:
                if self._offloaded(conn, key, request, close):
                    break  # queued: the rest waits for its answer
            else:
                conn.answered(self._answer(request, conn.remote, close))
                reader.release(conn)
            answered = True
            if close:
                reader.drop(conn)
                break
        if answered:  # the next request's time starts now, also when it is already arriving
            conn.since = time.monotonic()
        conn.in_request = bool(conn.inbox) or conn.head is not None

    def _offloaded(self, conn: Connection, key: str, request: Request, close: bool) -> bool:
        """Queues the request for the pool under `key` (True), or answers at once what the
        policy answers a request its queue refuses (by default 503, then closed)."""
        assert self._offload is not None
        job = Job(request, conn.remote, close, partial(self._finish, conn))
        full = self._offload.queue.put(key, job)
        if full is None:
            conn.busy = True
            return True
        self._refused(full.reason)
        self._reader.release(conn)
        answer = self._offload.refused(request, full, close)
        if answer is None:
            conn.answered(RefusedError(503, "the server is busy; send again shortly").answer())
            self._reader.drop(conn)  # framing is fine, but nothing more is read after a 503
            conn.closing = True
        else:
            conn.answered(answer)
        return False

    def take_finished(self) -> list[tuple[Connection, bytes]]:
        """The pool's answers since the last call, each with its connection."""
        with self._lock:
            finished = list(self._finished)
            self._finished.clear()
        return finished

    # -- any thread ----------------------------------------------------------------------------
    def _answer(self, request: Request, remote: tuple[str, int], close: bool) -> bytes:
        env = environ(request, (self._host, self._port()), remote, self._scheme)
        env["wsgi.multiprocess"] = self._multiprocess
        try:
            return call(self._app, env, close)
        except Exception:
            # Flask answers the app's own failures with 500; this is a failure around it.
            log.exception(
                "%s: %s %s failed", self.name, request.head.method, request.head.target[:200]
            )
            return RefusedError(500, "the server failed to answer").answer()

    def _work(self) -> None:
        """A pool thread: answers queued requests until the queue is closed."""
        assert self._offload is not None
        queue = self._offload.queue
        while (taken := queue.get()) is not None:
            key, job = taken
            try:
                answer = self._answer(job.request, job.remote, job.close)
            finally:
                queue.done(key)
            job.reply(answer)

    def _finish(self, conn: Connection, answer: bytes) -> None:
        """Hands a pool thread's answer to the loop's thread."""
        with self._lock:
            self._finished.append((conn, answer))
        self._wake()
