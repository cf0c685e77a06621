"""Optimistic concurrency, once: read, decide, write with the resourceVersion that was read, and on a
write conflict (someone wrote in between, or created the object first) do it all again."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kubeio.errors import APIConflictError

T = TypeVar("T")

ATTEMPTS = 5


def on_conflict(
    attempt: Callable[[], T],
    what: str,
    *,
    attempts: int = ATTEMPTS,
    retrying: Callable[[], None] = lambda: None,
) -> T:
    """`attempt()` until it returns without a write conflict (`retrying()` before each new try);
    after `attempts` conflicts in a row raises APIConflictError naming `what`."""
    for tried in range(attempts):
        if tried:
            retrying()
        try:
            return attempt()
        except APIConflictError:
            continue
    raise APIConflictError(409, "Conflict", f"{what}: kept conflicting ({attempts} attempts)")
