"""What a map's status says of its pods, each count read from the room that keeps it: the slot cache
(bound), the drift tracker, the rollouts, the renumbering tracker, the trust report and the gangs.
The status writer is given these readers when it is built and reaches into none of those rooms;
each reader takes its room's lock or reads one value (docs/architecture.md, The controller)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.rollout import RolloutState
from placement.status import GangStatus
from placement.types import MapKey


@dataclass(frozen=True, slots=True)
class MapCounts:
    bound: Callable[[MapKey], int]
    drifted: Callable[[MapKey], int]
    #: What the map's rollout is doing; None while it does nothing.
    rollout: Callable[[MapKey], RolloutState | None]
    renumbered: Callable[[MapKey], int]
    #: Pods bound under a key the ring no longer holds.
    unverifiable: Callable[[MapKey], int]
    #: The map's gang while it waits.
    gang: Callable[[MapKey], GangStatus | None]
    #: Slots bound, and pods drifted, over every map (the slot gauges).
    bound_total: Callable[[], int]
    drifted_total: Callable[[], int]
