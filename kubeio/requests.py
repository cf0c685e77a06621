"""Requests to the apiserver built without I/O, as lightkube's `prepare_request` does.

JSON is read and written with orjson: decoding watch events and lists is most of what a
component spends on the API. `prepare("PATCH", path, body=..., query=...)` decides everything that goes on the wire (the target
with its query string, the encoded body, its content type); `Kube.send` only carries it out. So the
request half of every API call is tested without a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
#: Server-side apply: the body is the whole intent of one field manager (JSON is YAML).
APPLY_PATCH = "application/apply-patch+yaml"

_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    content_type: str | None = None
    #: Headers beyond those every request carries (accept, authorization, content type).
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def target(self) -> str:
        """The path with its query string, as sent after the host."""
        return f"{self.path}?{urlencode(self.query)}" if self.query else self.path

    def describe(self) -> str:
        """`METHOD path` for error messages (no query: it may hold a continue token)."""
        return f"{self.method} {self.path}"


def _query_value(value: Any) -> str:
    # Go's strconv.ParseBool takes "true"; Python's str(True) is "True", which some fields refuse.
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def prepare(
    method: str,
    path: str,
    *,
    body: Any = None,
    query: Mapping[str, Any] | None = None,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Request:
    """The request for `method path`: None and empty query values are left out (an unset
    option), a body that is not bytes is JSON; PATCH defaults to a JSON merge patch."""
    if method not in _METHODS:
        raise ValueError(f"{method!r}: not an HTTP method the API serves")
    if not path.startswith("/"):
        raise ValueError(f"{path!r}: an API path starts with /")
    pairs = tuple(
        (key, _query_value(value))
        for key, value in (query or {}).items()
        if value is not None and value != ""
    )
    data: bytes | None = None
    if body is not None:
        data = (
            body if isinstance(body, bytes) else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        )
        content_type = content_type or (MERGE_PATCH if method == "PATCH" else JSON)
    return Request(method, path, pairs, data, content_type, tuple((headers or {}).items()))


def decode(method: str, path: str, data: bytes) -> Any:
    """A response body: its JSON, None when empty; ValueError when it is not JSON."""
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{method} {path}: the response is not JSON") from exc
