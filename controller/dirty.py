"""A set of maps that need work again (their status written, their pods judged for drift), filled
by any thread and taken whole by the reconcile loop."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from placement.types import MapKey


class DirtyMaps:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[MapKey] = set()

    def add(self, key: MapKey) -> None:
        with self._lock:
            self._keys.add(key)

    def update(self, keys: Iterable[MapKey]) -> None:
        with self._lock:
            self._keys.update(keys)

    def take(self) -> set[MapKey]:
        """Everything marked so far; the set starts empty again."""
        with self._lock:
            keys, self._keys = self._keys, set()
        return keys

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._keys)
