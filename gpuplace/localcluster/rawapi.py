"""Plain JSON-over-HTTPS calls to the apiserver, for what the generated client handles badly.

The official client cannot decode some responses (``pods/binding`` returns a Status where it
expects a Binding) and builds a model object for every response, which dominates bulk work such as
creating thousands of nodes. `ApiConnection` keeps one TLS connection alive across requests.
"""

from __future__ import annotations

import http.client
import json
import ssl
from types import TracebackType
from typing import Any, Self

_PATCH_CONTENT_TYPE = "application/merge-patch+json"


class ApiConnection:
    """One keep-alive HTTPS connection to the apiserver; JSON in, (status, decoded JSON) out.

    Not thread-safe: use one per thread. PATCH bodies are sent as JSON merge patches.
    """

    def __init__(self, server: str, context: ssl.SSLContext, *, timeout: float = 30.0) -> None:
        host, port = server.removeprefix("https://").rsplit(":", 1)
        self._host = host
        self._port = int(port)
        self._context = context
        self._timeout = timeout
        self._connection: http.client.HTTPSConnection | None = None
        self._used = False

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = (
                _PATCH_CONTENT_TYPE if method == "PATCH" else "application/json"
            )
        reused = self._used
        try:
            status, data = self._send(method, path, payload, headers)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # The server closed an idle keep-alive connection before reading this request.
            if not reused:
                raise
            status, data = self._send(method, path, payload, headers)
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode(errors="replace")
        return status, decoded

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._used = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _send(
        self, method: str, path: str, payload: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        if self._connection is None:
            self._connection = http.client.HTTPSConnection(
                self._host, self._port, context=self._context, timeout=self._timeout
            )
        try:
            self._connection.request(method, path, body=payload, headers=headers)
            response = self._connection.getresponse()
            data = response.read()
        except BaseException:
            self.close()
            raise
        self._used = True
        if response.will_close:
            self.close()
        return response.status, data
