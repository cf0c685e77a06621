"""RFC 6901 pointers and the RFC 6902 operations the webhook emits."""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]


def escape(token: str) -> str:
    """One pointer segment: `~` first, so the `~` of an escaped `/` is not escaped again."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(t)) for t in tokens)


def add(path: str, value: Any) -> Operation:
    """`add` inserts into arrays and sets (or replaces) object members."""
    return {"op": "add", "path": path, "value": value}


def remove(path: str) -> Operation:
    return {"op": "remove", "path": path}
