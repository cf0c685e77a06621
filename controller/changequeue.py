"""The model keeper's inbox of typed changes (`controller.changes`): informer threads `put`, and each
put adds the model queue's one key, so that one pass applies everything queued since the last in
order (the changes are data in order, not keys: a node's deletion must not pass its last update)."""

from __future__ import annotations

import threading
from typing import Final

from controller.changes import Change
from controller.workqueue import WorkQueue

#: The model queue's one key: every change is compiled into one model.
MODEL: Final = "model"


class ChangeQueue:
    """`put` from any thread; the model keeper takes them all at once (`take`) holding `lock`,
    which also orders a pass against a leadership's start-up."""

    def __init__(self, work: WorkQueue[str]) -> None:
        self.lock = threading.RLock()
        self.work = work
        self._pending: list[Change] = []
        self._pending_lock = threading.Lock()

    def put(self, change: Change) -> None:
        with self._pending_lock:
            self._pending.append(change)
        self.work.add(MODEL)

    def take(self) -> list[Change]:
        """Everything queued so far."""
        with self._pending_lock:
            batch, self._pending = self._pending, []
        return batch
