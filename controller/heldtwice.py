"""A GPU held by two bound pods that may not share it: said out loud, never recorded silently."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from controller.metrics import ControllerMetrics
from controller.slotcache import Conflict, SlotCache
from kubeio.events import WARNING, EventRecorder
from kubeio.pod import Pod
from placement.reasons import EventReason

log = logging.getLogger(__name__)


class HeldTwice:
    """Reports the conflicts the slot cache found when it added a bound pod (binder's threads);
    the Events leave on the binder's side threads (`off_loop`)."""

    def __init__(
        self,
        cache: SlotCache,
        metrics: ControllerMetrics,
        events: EventRecorder,
        off_loop: Callable[..., Any],
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.events = events
        self._off_loop = off_loop

    def report(self, pod: Pod, conflicts: list[Conflict]) -> None:
        """A bound pod holds a GPU that another bound pod holds and neither may share: both run
        there, so both hold it (no third pod is bound onto it), and it is said out loud, in the
        log, an Event on the pod and `gpuplace_gpus_held_twice`, never recorded silently."""
        self.metrics.gpus_held_twice.set(len(self.cache.conflicts()))
        for conflict in conflicts:
            others = [
                f"pod {held.pod} (uid {uid})" if (held := self.cache.holding(uid)) else uid
                for uid in conflict.holders
                if uid != pod.uid
            ]
            message = (
                f"GPU {conflict.gpu} on node {conflict.node} is also held by {', '.join(others)}: "
                "their bindings both name it and neither may share it; delete one of the pods"
            )
            log.warning("GPU held twice: %s", message, extra={"pod": pod.key})
            self._off_loop(self.events.emit, pod.ref, WARNING, EventReason.GPU_HELD_TWICE, message)
