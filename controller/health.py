"""The controller's /healthz and /readyz answers, from what the manager runs: built before the ops
port that asks them, so that the port needs no callback into the manager."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.binder import Binder
from controller.informers import SharedInformers
from controller.settings import ControllerSettings
from controller.workqueue import Workers
from kubeio.leader import LeaderElector

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Health:
    settings: ControllerSettings
    informers: SharedInformers
    elector: LeaderElector
    binder: Binder
    leading: threading.Event
    #: Set once this replica's leadership published its first model.
    published: threading.Event
    workers: Sequence[Workers[Any]]

    def problems(self) -> list[str]:
        """What makes this replica unhealthy: an informer failing to list or watch, a queue's
        worker stuck on one batch or dead, a leader-election loop that stopped trying, a dead
        binder."""
        grace = max(30.0, 4 * self.settings.lease_seconds)
        now = time.monotonic()
        problems = [
            f"informer {name} has been failing for over {grace:.0f}s"
            for name in self.informers.failing(grace)
        ]
        for workers in self.workers:
            if not workers.started:
                continue
            if not workers.alive():
                problems.append(f"a worker of the {workers.queue.name} queue is not running")
            elif stuck := workers.stuck(grace):
                problems.append(f"{workers.queue.name} queue: one batch running for {stuck:.0f}s")
        if now - self.elector.last_attempt > grace and not self._starting_to_lead():
            problems.append(
                f"leader election made no attempt for {now - self.elector.last_attempt:.0f}s"
            )
        if self.leading.is_set() and not self.binder.alive():
            problems.append("binder thread or its request loop is not running")
        return problems

    def _starting_to_lead(self) -> bool:
        # Between winning the lease and leading, the elector waits for the informers to sync;
        # those have their own check.
        return self.elector.is_leader.is_set() and not self.leading.is_set()

    def healthy(self) -> bool:
        problems = self.problems()
        for problem in problems:
            log.error("unhealthy: %s", problem)
        return not problems

    def ready(self) -> bool:
        """Ready once the leader published its first model; a standby is ready at once."""
        return self.published.is_set() or not self.elector.is_leader.is_set()
