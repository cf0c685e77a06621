"""The gang decision: a map marked `gang` binds all its slots at once or none of them.

Pure: the binder gathers, for a gang that holds no slot, the decision `plan` made for each of its
waiting pods, and this module says whether they all go now or all wait, and why. A gang binds only
when every slot has its pod and every slot is servable; until then no slot is assumed, so no GPU of
the gang is held while NCCL would wait for a missing rank. Once any slot of the gang is held (the
gang was bound), a pod of it is decided alone: a rank that restarts takes its slot back without
unbinding the others (`gang_is_bound`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from placement.binding import Code, Placement, SlotView, Status
from placement.model import CompiledMap
from placement.reasons import Reason
from placement.status import GangStatus
from placement.types import SlotKey
from placement.wake import WakeKey

#: How many waiting slots a GangWaiting message names (the rest are counted).
_SHOWN = 3


@dataclass(frozen=True, slots=True)
class Member:
    """One waiting pod of the gang and what `plan` decided for it alone."""

    uid: str
    index: int | None  # its rank (None: the pod has none)
    outcome: Placement | Status


@dataclass(frozen=True, slots=True)
class GangVerdict:
    """Either every slot's pod is bound now (`bind`, one per slot), or every member waits with
    `status` (GangWaiting, or GangStuck past the timeout). Never both, never part."""

    bind: tuple[tuple[str, Placement], ...] = ()
    status: Status | None = None
    ready: int = 0
    total: int = 0
    stuck: bool = False
    #: The slots that keep the gang waiting, in slot order: (slot, reason; "" for no pod).
    waits: tuple[tuple[int, str], ...] = ()

    def standing(self, cmap: CompiledMap) -> GangStatus:
        """The gang as its map's status shows it (`waiting` empty once it binds)."""
        assert cmap.gang is not None
        return GangStatus(
            ranks=len(cmap.slots),
            ready=self.ready,
            waiting=self.waits,
            stuck=self.stuck,
            timeout_seconds=cmap.gang.timeout_seconds,
        )


def gang_is_bound(cmap: CompiledMap, slots: SlotView) -> bool:
    """Whether any slot of the gang is held: the gang was bound (and a pod of it is a restarted
    rank, decided alone) or is being bound."""
    return any(slots.slot_holder(SlotKey(cmap.key, i)) is not None for i in cmap.sorted_indices)


def unranked(cmap: CompiledMap) -> Status:
    """Why a pod without a rank of its own is not placed in a gang map: a gang is a set of ranks,
    and a pod that could take any slot would make 'every slot has its pod' meaningless."""
    return Status(
        Code.UNRESOLVABLE,
        Reason.GANG_UNRANKED,
        f"map {cmap.key} is a gang: its pods need a rank (an Indexed Job, JobSet, "
        "LeaderWorkerSet, Kueue pod group, StatefulSet, gpuplace.io/index or the map's "
        "indexLabel), and this pod has none",
        frozenset({WakeKey.model()}),
    )


def decide(
    cmap: CompiledMap,
    members: Iterable[Member],
    waited_seconds: float,
) -> GangVerdict:
    """All of the gang's slots bound now, or all of its pods waiting, with why.

    `members` are the gang's waiting pods, in the order they came (the first pod of a rank is its
    member; a second pod of the same rank waits like the rest). `waited_seconds`: how long the
    gang has waited so far; past `timeoutSeconds` it is reported stuck, and still waits."""
    assert cmap.gang is not None
    by_slot: dict[int, Member] = {}
    for member in members:
        if member.index is not None and member.index in cmap.slots:
            by_slot.setdefault(member.index, member)
    total = len(cmap.slots)
    ready = {i: m for i, m in by_slot.items() if isinstance(m.outcome, Placement)}
    if len(ready) == total:
        bind = tuple((m.uid, m.outcome) for _, m in sorted(ready.items()))
        return GangVerdict(bind=bind, ready=total, total=total)  # type: ignore[arg-type]
    return _waiting(cmap, by_slot, len(ready), waited_seconds)


def _waiting(
    cmap: CompiledMap, by_slot: Mapping[int, Member], ready: int, waited_seconds: float
) -> GangVerdict:
    assert cmap.gang is not None
    total = len(cmap.slots)
    waits: set[WakeKey] = {WakeKey.map(cmap.key), WakeKey.model()}
    lines: list[str] = []
    slots: list[tuple[int, str]] = []
    for index in cmap.sorted_indices:
        member = by_slot.get(index)
        if member is None:
            lines.append(f"slot {index} has no pod")
            slots.append((index, ""))
            continue
        outcome = member.outcome
        if isinstance(outcome, Status):
            waits.update(outcome.waits_for)
            lines.append(f"slot {index} waits {outcome.reason}: {outcome.message}")
            slots.append((index, str(outcome.reason)))
    shown = "; ".join(lines[:_SHOWN])
    more = f"; and {len(lines) - _SHOWN} more" if len(lines) > _SHOWN else ""
    stuck = waited_seconds >= cmap.gang.timeout_seconds
    reason = Reason.GANG_STUCK if stuck else Reason.GANG_WAITING
    late = (
        f" (waiting {int(waited_seconds)}s, over its timeoutSeconds {cmap.gang.timeout_seconds}; "
        "no rank is bound until all can be)"
        if stuck
        else ""
    )
    message = f"map {cmap.key} gang: {ready} of {total} ranks ready; {shown}{more}{late}"
    status = Status(Code.UNSCHEDULABLE, reason, message, frozenset(waits))
    return GangVerdict(status=status, ready=ready, total=total, stuck=stuck, waits=tuple(slots))
