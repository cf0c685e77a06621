"""API errors: one hierarchy, each chaining the transport error; nobody else catches urllib3's."""

from __future__ import annotations

import json
from typing import Any


class APIError(Exception):
    """A request the apiserver answered with an error status (or that never got an answer)."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


class APITransportError(APIError):
    """No HTTP answer: connection refused, TLS failure, timeout."""


class FencedError(APIError):
    """Not sent: the request's guard (a leader's lease check) failed just before it left."""


class APIClientError(APIError):
    """4xx."""


class APIBadRequestError(APIClientError):
    pass


class APIUnauthorizedError(APIClientError):
    pass


class APIForbiddenError(APIClientError):
    pass


class APINotFoundError(APIClientError):
    pass


class APIConflictError(APIClientError):
    pass


class APIGoneError(APIClientError):
    """410: a watch's resourceVersion is too old; list again."""


class APIInvalidError(APIClientError):
    """422: the object failed validation."""


class APITooManyRequestsError(APIClientError):
    pass


class APIServerError(APIError):
    """5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: APIBadRequestError,
    401: APIUnauthorizedError,
    403: APIForbiddenError,
    404: APINotFoundError,
    409: APIConflictError,
    410: APIGoneError,
    422: APIInvalidError,
    429: APITooManyRequestsError,
}


def error_for(status: int, raw: bytes) -> APIError:
    """Builds the error for a non-2xx answer from its Status body."""
    body: Any = None
    reason = ""
    message = raw[:500].decode("utf-8", "replace")
    try:
        body = json.loads(raw)
        if isinstance(body, dict):
            reason = str(body.get("reason", ""))
            message = str(body.get("message", message))
    except ValueError:
        pass
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = APIServerError if status >= 500 else APIClientError
    return cls(status, reason, message, body)


def status_error(obj: dict[str, Any]) -> APIError:
    """The error a watch stream reports as an ERROR event carrying a Status object."""
    code = int(obj.get("code", 0) or 0)
    return error_for(code, json.dumps(obj).encode())
