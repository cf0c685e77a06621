"""A thin JSON client for the Kubernetes API.

The official `kubernetes` package loads the configuration (kubeconfig, in-cluster service account
with token refresh); requests go out on keep-alive http.client connections (watches through
urllib3, which streams) and return plain dicts. Typed models are
skipped on purpose: deserializing every watched object into generated classes costs more than the
rest of a bind, and the Binding response cannot be deserialized by that client at all.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from kubeio.errors import APIError, APITransportError, FencedError, error_for
from kubeio.requests import (
    APPLY_PATCH,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    Request,
    decode,
    prepare,
)

__all__ = [
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ClientSettings",
    "Kube",
    "Obj",
    "Response",
    "json_lines",
    "obj_key",
]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    kubeconfig: str | None = None  # None: $KUBECONFIG / ~/.kube/config, else in-cluster
    context: str | None = None
    qps_pool: int = 64  # concurrent connections kept open
    timeout_seconds: float = 30.0
    user_agent: str = "gpuplace"


#: What sending on a keep-alive connection the server has closed raises (the close raced the
#: check in `_dropped`).
_CLOSED_WHILE_IDLE = (
    http.client.RemoteDisconnected,
    BrokenPipeError,
    ConnectionResetError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether the server closed an idle connection: it is readable (EOF) while no request is
    outstanding (urllib3 checks the same before reusing a pooled connection)."""
    sock = connection.sock
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


#: A connection idle for less than this is reused without asking the kernel whether the server
#: closed it (the apiserver closes idle connections after tens of seconds); should it have, the
#: send fails before an answer and is retried once on another connection, as below.
_FRESH_SECONDS = 1.0


def _close_all(idle: list[tuple[http.client.HTTPConnection, float]]) -> None:
    for connection, _since in idle:
        connection.close()


class _HTTPSConnection(http.client.HTTPSConnection):
    """With the kubeconfig's `tls-server-name`, when it has one, for SNI and the name check."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        server_name: str | None,
        timeout: float,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name

    def connect(self) -> None:
        if self._server_name is None:
            super().connect()
            return
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            self.sock, server_hostname=self._server_name
        )


@dataclass(frozen=True, slots=True)
class Response:
    """An answer of the apiserver, whatever its status."""

    status: int
    data: bytes

    def json(self) -> Any:
        """The decoded body (None when empty); text when it is not JSON (an error page)."""
        try:
            return decode("", "", self.data)
        except ValueError:
            return self.data.decode(errors="replace")


def _put_request(
    connection: http.client.HTTPConnection, request: Request, headers: Mapping[str, str]
) -> None:
    """The request line and headers, buffered by http.client until `endheaders` writes them with
    the body: what `HTTPConnection.request` does for a body of bytes, without the write."""
    connection.putrequest(request.method, request.target)
    if "Content-Length" not in headers and (
        request.body is not None or request.method in ("POST", "PUT", "PATCH")
    ):
        connection.putheader("Content-Length", str(len(request.body or b"")))
    for name, value in headers.items():
        connection.putheader(name, value)


class Kube:
    """Sends requests to one apiserver: the one HTTP client of gpuplace. Thread-safe; keeps up to
    `ClientSettings.qps_pool` connections alive."""

    def __init__(self, configuration: k8s_client.Configuration, settings: ClientSettings) -> None:
        self._config = configuration
        self._settings = settings
        self.host = str(configuration.host).rstrip("/")
        ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if not configuration.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            ctx.load_cert_chain(configuration.cert_file, configuration.key_file)
        # Watches: urllib3 streams the chunked body.
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=settings.qps_pool,
            block=False,
            ssl_context=ctx,
            server_hostname=configuration.tls_server_name or None,
            retries=False,
        )
        # Everything else: http.client on pooled keep-alive connections, about half the CPU of
        # urllib3's pool per request (a Binding is one such request per pod).
        url = urlsplit(self.host)
        self._scheme, self._address = url.scheme, url.hostname or "localhost"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ctx
        self._sni = configuration.tls_server_name or None
        #: Idle keep-alive connections with the monotonic time each was released, the most
        #: recently used last (reused first, so few stay open and they stay warm); a connection
        #: is used by one request at a time.
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        weakref.finalize(self, _close_all, self._idle)  # as urllib3 closes its pools
        self._lock = threading.Lock()

    @property
    def configuration(self) -> k8s_client.Configuration:
        """What the client was built from (read by whoever opens more clients like it)."""
        return self._config

    @property
    def settings(self) -> ClientSettings:
        return self._settings

    @classmethod
    def connect(cls, settings: ClientSettings | None = None) -> Kube:
        settings = settings or ClientSettings()
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=settings.kubeconfig,
                context=settings.context,
                client_configuration=configuration,
            )
        except (k8s_config.ConfigException, FileNotFoundError, TypeError):
            if settings.kubeconfig:
                raise
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        return cls(configuration, settings)

    @classmethod
    def with_client_certificate(
        cls,
        server: str,
        ca_file: Path,
        cert_file: Path,
        key_file: Path,
        settings: ClientSettings | None = None,
    ) -> Kube:
        """A client that authenticates with a certificate (the local cluster's admin)."""
        configuration = k8s_client.Configuration()
        configuration.host = server
        configuration.ssl_ca_cert = str(ca_file)
        configuration.cert_file = str(cert_file)
        configuration.key_file = str(key_file)
        return cls(configuration, settings or ClientSettings())

    def close(self) -> None:
        self._pool.clear()
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
        _close_all(idle)

    def _acquire(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection the server has not closed (and whether it was used before), or a
        new, unconnected one."""
        while True:
            with self._lock:
                connection, since = self._idle.pop() if self._idle else (None, 0.0)
            if connection is None:
                if self._scheme == "https":
                    return (
                        _HTTPSConnection(self._address, self._port, self._ssl, self._sni, timeout),
                        False,
                    )
                return http.client.HTTPConnection(self._address, self._port, timeout=timeout), False
            if time.monotonic() - since >= _FRESH_SECONDS and _dropped(connection):
                connection.close()
                continue
            if connection.timeout != timeout:  # settimeout costs more than a comparison
                if connection.sock is not None:
                    connection.sock.settimeout(timeout)
                connection.timeout = timeout
            return connection, True

    def _release(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self._settings.qps_pool:
                self._idle.append((connection, time.monotonic()))
                return
        connection.close()

    def endpoint(self) -> tuple[str, str, int, ssl.SSLContext | None, str | None]:
        """(scheme, host, port, TLS context, TLS server name) of the apiserver, for clients that
        open connections of their own (`kubeio.loop`)."""
        context = self._ssl if self._scheme == "https" else None
        return self._scheme, self._address, self._port, context, self._sni

    def headers(self, content_type: str | None) -> dict[str, str]:
        """The headers every request carries now (the token as refreshed last)."""
        return self._headers(content_type)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self._settings.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        with self._lock:  # the refresh hook rewrites the token in place
            # kubernetes>=35 keeps kubeconfig and service-account tokens under "BearerToken";
            # older releases used "authorization".
            token = self._config.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

    def send(
        self,
        request: Request,
        *,
        timeout: float | None = None,
        guard: Callable[[], bool] | None = None,
    ) -> Response:
        """Sends one request and returns the answer, whatever its status; raises only when there
        is none (APITransportError) or the guard stopped it (FencedError).

        `guard`, when given, is called immediately before the request is written to the
        connection; if it returns False nothing is sent. A keep-alive connection the server
        closed while idle is replaced and the request sent once more (the guard asked again)."""
        headers = self._headers(request.content_type)
        headers.update(request.headers)
        seconds = timeout or self._settings.timeout_seconds
        for attempt in (1, 2):
            connection, reused = self._acquire(seconds)
            try:
                if connection.sock is None:
                    # Connected (TCP, TLS) before the guard: a process paused during a
                    # handshake must not send on resuming without asking the guard again.
                    connection.connect()
                if guard is not None and not guard():
                    self._release(connection)
                    raise FencedError(0, "Fenced", f"{request.describe()}: not sent, guard failed")
                _put_request(connection, request, headers)
                if guard is not None and not guard():
                    # Asked again with the request built: only the one write below follows, so
                    # a process paused between the answer and the write (its threads waiting
                    # for the interpreter lock) has the least time left to be paused in.
                    connection.close()  # a request was started on it
                    raise FencedError(0, "Fenced", f"{request.describe()}: not sent, guard failed")
                connection.endheaders(request.body)  # headers and body in one sendall
                response = connection.getresponse()
                data = response.read()
            except _CLOSED_WHILE_IDLE as exc:
                connection.close()
                if reused and attempt == 1:
                    continue  # closed by the server while idle, before it answered this request
                raise APITransportError(0, "Transport", f"{request.describe()}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise APITransportError(0, "Transport", f"{request.describe()}: {exc}") from exc
            if response.will_close:
                connection.close()
            else:
                self._release(connection)
            return Response(response.status, data)
        raise AssertionError("unreachable")  # pragma: no cover

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        guard: Callable[[], bool] | None = None,
        shape: Callable[[bytes], Obj] | None = None,
    ) -> Obj:
        """Sends one request; returns the decoded JSON body ({} when empty); raises APIError for
        an error status (see `send` for the guard). `shape` decodes a successful answer's body in
        place of the whole JSON (`kubeio.shapes.Shape.page`)."""
        request = prepare(method, path, body=body, query=query, content_type=content_type)
        response = self.send(request, timeout=timeout, guard=guard)
        if response.status >= 300:
            raise error_for(response.status, response.data)
        try:
            if shape is not None and response.data:
                return shape(response.data)
            decoded = decode(method, path, response.data)
        except ValueError as exc:
            raise APIError(response.status, "BadResponse", str(exc)) from exc
        return decoded if decoded is not None else {}

    def get(self, path: str, **query: Any) -> Obj:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Obj, guard: Callable[[], bool] | None = None) -> Obj:
        return self.request("POST", path, body=body, guard=guard)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH, **query: Any) -> Obj:
        return self.request("PATCH", path, body=body, content_type=content_type, query=query)

    def apply(self, path: str, body: Obj, field_manager: str) -> Obj:
        """Server-side apply of `body` (the object's item path): creates it or makes the fields
        `field_manager` owns what `body` says, taking over fields another manager set (force);
        fields that others own and `body` leaves out stay theirs."""
        return self.patch(path, body, APPLY_PATCH, fieldManager=field_manager, force=True)

    def put(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body=body)

    def delete(self, path: str, **query: Any) -> Obj:
        return self.request("DELETE", path, query=query)

    def stream(
        self,
        path: str,
        query: Mapping[str, Any],
        timeout: float,
        shape: Callable[[bytes], Obj] | None = None,
    ) -> Iterator[Obj]:
        """Opens a watch and returns its events (one JSON object a line) until the server ends
        it. The watch is open when this returns: what changes from then on is in the events.
        `shape` decodes each line in place of the whole JSON (`kubeio.shapes.Shape.event`)."""
        target = prepare("GET", path, query={**query, "watch": True}).target
        try:
            response = self._pool.request(
                "GET",
                self.host + target,
                headers=self._headers(None),
                timeout=urllib3.Timeout(connect=10.0, read=timeout),
                preload_content=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise APITransportError(0, "Transport", f"WATCH {path}: {exc}") from exc
        if response.status >= 300:
            try:
                raise error_for(response.status, response.read())
            finally:
                response.release_conn()
        return _events(response, path, shape or orjson.loads)


def _events(
    response: urllib3.BaseHTTPResponse, path: str, decode_line: Callable[[bytes], Obj]
) -> Iterator[Obj]:
    try:
        yield from json_lines(response.stream(64 * 1024, decode_content=True), decode_line)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise APITransportError(0, "Transport", f"WATCH {path}: {exc}") from exc
    finally:
        response.release_conn()


def json_lines(
    chunks: Iterable[bytes], decode_line: Callable[[bytes], Obj] = orjson.loads
) -> Iterator[Obj]:
    """The JSON objects of a stream with one a line (a watch), however the chunks split it; an
    unfinished last line (the connection was cut) is dropped, and the watch resumes before it."""
    pending = b""  # the start of a line whose end is in a later chunk
    for chunk in chunks:
        # One split per chunk: splitting off one line at a time would copy the rest of the
        # chunk again for every event in it.
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yield decode_line(line)


def obj_key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
