"""The reconcile loop's inbox of typed changes (`controller.changes`)."""

from __future__ import annotations

import threading

from controller.changes import Change


class ChangeQueue:
    """Informer threads `put` changes and wake the loop; the reconcile loop waits and takes them
    all at once (`wait`, `take`) holding `lock`, which also orders a compile against them."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._ready = threading.Condition(self.lock)
        self._pending: list[Change] = []

    def put(self, change: Change) -> None:
        with self._ready:
            self._pending.append(change)
            self._ready.notify()

    def notify(self) -> None:
        """Wakes the loop with nothing queued (a map's status to write)."""
        with self._ready:
            self._ready.notify()

    def wait(self, timeout: float) -> None:
        """Until something is queued or notified, at most `timeout` (caller holds `lock`)."""
        if not self._pending:
            self._ready.wait(timeout)

    def take(self) -> list[Change]:
        """Everything queued so far (caller holds `lock`)."""
        batch, self._pending = self._pending, []
        return batch
