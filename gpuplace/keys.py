"""What `gpuplace key` decides: which keys bound pods use, which unverifiable pods can be re-adopted.

The pods are read once (every namespace: the administrator's view) and judged under the ring as the
controller judges them (placement/keyring.py); the functions here only plan, the command writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller import podfacts
from controller.slotcache import Holding
from kubeio.client import Obj
from kubeio.pod import Pod
from placement.keyring import Adoption, KeyRing, Trust, TrustView, Verdict, adoption
from placement.podmeta import has_binding
from placement.types import MapKey


@dataclass(frozen=True, slots=True)
class BoundPod:
    pod: Pod
    verdict: Verdict
    holding: Holding | None  # what it holds (None: forged, or no binding to decode)

    @property
    def name(self) -> str:
        return self.pod.key

    @property
    def uid(self) -> str:
        return self.pod.uid


def judge_all(pods: Iterable[Obj], view: TrustView) -> list[BoundPod]:
    """Every running bound pod with a gpuplace binding, judged under `view`."""
    out = []
    for obj in pods:
        pod = Pod.of(obj)
        if not pod.bound or pod.finished or not has_binding(pod):
            continue
        read = podfacts.BoundPod(pod, view)
        assert read.verdict is not None
        out.append(BoundPod(pod, read.verdict, read.holding(set())))
    return sorted(out, key=lambda b: b.name)


def keys_in_use(bound: Iterable[BoundPod]) -> dict[str, int]:
    """Key id -> how many bound pods' verified signatures it makes."""
    used: dict[str, int] = {}
    for b in bound:
        if b.verdict.trust is Trust.VERIFIED and b.verdict.key_id:
            used[b.verdict.key_id] = used.get(b.verdict.key_id, 0) + 1
    return used


def live_adoptions(records: Iterable[Adoption], bound: Iterable[BoundPod]) -> list[Adoption]:
    """The adoption records whose pod still runs (the others are dropped when the ring is written)."""
    uids = {b.uid for b in bound}
    return [a for a in records if a.uid in uids]


@dataclass(frozen=True, slots=True)
class AdoptionPlan:
    adopt: tuple[BoundPod, ...]
    refused: tuple[tuple[BoundPod, str], ...]  # and why


def _gpus(b: BoundPod) -> set[tuple[str, str]]:
    if b.holding is None:
        return set()
    return {(b.holding.node, gpu) for gpu in b.holding.gpus}


def _map(b: BoundPod) -> MapKey | None:
    return b.holding.slot.map if b.holding is not None else None


def plan_adoption(bound: Sequence[BoundPod], wanted: Sequence[str]) -> AdoptionPlan:
    """Which unverifiable pods to re-adopt: those named in `wanted` (namespace/name), or all when
    it is empty. A pod whose GPUs another holding pod of another map claims too, or whose slot
    another claims, is refused: re-adopting both would give one GPU twice (delete one first)."""
    by_name = {b.name: b for b in bound}
    refused: list[tuple[BoundPod, str]] = []
    candidates: list[BoundPod] = []
    if wanted:
        for name in wanted:
            b = by_name.get(name)
            if b is None:
                raise LookupError(f"pod {name}: not a running pod bound by gpuplace")
            if b.verdict.trust is not Trust.UNVERIFIABLE:
                raise LookupError(
                    f"pod {name}: its binding is {b.verdict.trust.value}, not unverifiable: "
                    "nothing to adopt"
                )
            candidates.append(b)
    else:
        candidates = [b for b in bound if b.verdict.trust is Trust.UNVERIFIABLE]
    holders = [b for b in bound if b.verdict.trust.holds and b.holding is not None]
    adopt: list[BoundPod] = []
    for c in candidates:
        if c.holding is None:
            refused.append((c, "its annotations name no binding to keep"))
            continue
        clash = next(
            (
                o
                for o in holders
                if o.uid != c.uid
                and (
                    (_gpus(o) & _gpus(c) and _map(o) != _map(c))
                    or (o.holding is not None and o.holding.slot == c.holding.slot)
                )
            ),
            None,
        )
        if clash is not None:
            refused.append(
                (
                    c,
                    f"pod {clash.name} ({clash.verdict.trust.value.lower()}) holds the same "
                    "GPU or slot: delete one of the two, then adopt the other",
                )
            )
            continue
        adopt.append(c)
    return AdoptionPlan(tuple(adopt), tuple(refused))


def adoption_records(
    ring: KeyRing, kept: Iterable[Adoption], adopt: Iterable[BoundPod], now: str
) -> tuple[Adoption, ...]:
    """The records to store: the kept ones re-signed with the ring's signing key, and one more
    for each pod adopted now."""
    records = {a.uid: a.signed(ring) for a in kept}
    for b in adopt:
        records[b.uid] = adoption(ring, b.uid, b.name, dict(b.pod.annotations), now)
    return tuple(records.values())
