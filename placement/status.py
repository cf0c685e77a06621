"""The `gpuplace.io/status` annotation on each source ConfigMap."""

from __future__ import annotations

import functools
import json
import operator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from placement.errors import MAX_MESSAGE, Diagnostic, cap

#: Moduli and multipliers of `data_hash`: primes below 2**31, so that every intermediate value
#: stays below 2**40 and the Lua health check (float64 numbers, no bit operations) computes the
#: same digits exactly.
_HASHES = ((2147483647, 257), (2147483629, 263))


def data_hash(text: str) -> str:
    """A fingerprint of a map's text that argocd/health/configmap.lua can compute too.

    The status records the fingerprint of the text the controller validated; the health check
    compares it with the text in the object it is shown, so a map whose new content the
    controller has not seen yet reads Progressing, not the verdict on its previous content.
    Not cryptographic: it only has to tell versions of one map apart."""
    data = text.encode()
    parts = [f"{_polynomial(data, modulus, multiplier)}" for modulus, multiplier in _HASHES]
    return f"{len(data)}-{parts[0]}-{parts[1]}"


#: Bytes of the text `_polynomial` takes at a time.
_BLOCK = 4096


@functools.cache
def _powers(modulus: int, multiplier: int) -> tuple[int, ...]:
    """multiplier**(_BLOCK - 1 - i) % modulus for each i of a block."""
    return tuple(pow(multiplier, _BLOCK - 1 - i, modulus) for i in range(_BLOCK))


def _polynomial(data: bytes, modulus: int, multiplier: int) -> int:
    """The script's loop, `h = (h * multiplier + byte + 1) % modulus` over every byte: the sum
    of (byte + 1) * multiplier**(bytes after it), modulo `modulus`. Each block's share is summed
    by `sum(map(...))` in C: 0.21 s a MiB of map text for both moduli on two cores, where the
    loop a byte at a time took 0.34 s."""
    powers = _powers(modulus, multiplier)
    h = 0
    for start in range(0, len(data), _BLOCK):
        block = data[start : start + _BLOCK]
        weights = powers[_BLOCK - len(block) :]  # the last ones: the block's end has power 0
        value = sum(map(operator.mul, block, weights)) + sum(weights)
        h = (h * pow(multiplier, len(block), modulus) + value) % modulus
    return h


#: The message of a valid map the controller has read but not compiled yet.
COMPILING = "compiling"


class Phase(StrEnum):
    VALID = "Valid"
    INVALID = "Invalid"
    CONFLICT = "Conflict"
    DEGRADED = "Degraded"


@dataclass(frozen=True, slots=True)
class SlotCounts:
    total: int = 0
    served: int = 0
    bound: int = 0
    blocked: int = 0
    drifted: int = 0  # bound pods whose binding the map's current slot no longer matches
    renumbered: int = 0  # bound pods whose NVML indices now name other GPUs than they were bound to
    unverifiable: int = 0  # bound pods signed with a key the key ring no longer holds


@dataclass(frozen=True, slots=True)
class GangStatus:
    """How a gang map's gang stands, as the binder last decided it (placement/gang.py).

    `waiting` is empty once the gang is bound (or while none of its pods exists); otherwise it
    names the slots that keep the gang from binding, as `(slot, reason)`, the reason empty for a
    slot that has no pod yet."""

    ranks: int  # the gang's slots
    ready: int = 0  # slots whose pod could be bound now
    waiting: tuple[tuple[int, str], ...] = ()
    stuck: bool = False  # waiting past its timeoutSeconds
    timeout_seconds: int = 0

    #: How many waiting slots `describe` names (the rest are counted).
    SHOWN = 3

    def describe(self) -> str:
        """`gang: 3 of 4 ranks ready; slot 3 waits DeviceBusy`, as a person reads it."""
        if not self.waiting:
            return f"gang of {self.ranks} ranks: not waiting"
        slots = [
            f"slot {index} waits {reason}" if reason else f"slot {index} has no pod"
            for index, reason in self.waiting[: self.SHOWN]
        ]
        if len(self.waiting) > self.SHOWN:
            slots.append(f"and {len(self.waiting) - self.SHOWN} more")
        head = "gang stuck" if self.stuck else "gang"
        late = f" (past its timeoutSeconds {self.timeout_seconds})" if self.stuck else ""
        return f"{head}: {self.ready} of {self.ranks} ranks ready; {'; '.join(slots)}{late}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "ready": self.ready,
            "waiting": [{"slot": i, "reason": r} for i, r in self.waiting],
            "stuck": self.stuck,
            "timeoutSeconds": self.timeout_seconds,
        }

    @classmethod
    def from_json(cls, data: Any) -> GangStatus | None:
        """The gang of a status as written by `to_json`; None when `data` is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("ranks"), int):
            return None
        waiting = data.get("waiting") if isinstance(data.get("waiting"), list) else []
        assert isinstance(waiting, list)
        return cls(
            ranks=data["ranks"],
            ready=int(data.get("ready") or 0),
            waiting=tuple(
                (int(w.get("slot", 0)), str(w.get("reason") or ""))
                for w in waiting
                if isinstance(w, dict)
            ),
            stuck=bool(data.get("stuck")),
            timeout_seconds=int(data.get("timeoutSeconds") or 0),
        )


@dataclass(frozen=True, slots=True)
class MapStatus:
    phase: Phase
    observed_generation: int = 0  # model generation that reflects this status
    observed_version: str = ""  # digest of the placement.yaml that was read
    message: str = ""
    errors: tuple[Diagnostic, ...] = ()
    slots: SlotCounts = field(default_factory=SlotCounts)
    serving_version: str = ""  # digest of the version in service (the last valid one)
    warnings: tuple[Diagnostic, ...] = ()  # of the version in service, e.g. legacy lines sharing
    observed_data_hash: str = ""  # data_hash of the placement.yaml that was read
    revision: str = ""  # git revision of the content in service, when its source stamps one
    rollout: str = ""  # how drifted pods move (set while any is drifted)
    gang: GangStatus | None = None  # a gang map's gang while it waits (placement/gang.py)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "phase": self.phase.value,
            "observedGeneration": self.observed_generation,
            "observedVersion": self.observed_version,
            "servingVersion": self.serving_version,
            "observedDataHash": self.observed_data_hash,
            "revision": self.revision,
            "rollout": self.rollout,
            "message": cap(self.message, MAX_MESSAGE * 2),
            "errors": [d.to_json() for d in self.errors],
            "slots": {
                "total": self.slots.total,
                "served": self.slots.served,
                "bound": self.slots.bound,
                "blocked": self.slots.blocked,
                "drifted": self.slots.drifted,
            },
        }
        if self.slots.renumbered:
            data["slots"]["renumbered"] = self.slots.renumbered
        if self.slots.unverifiable:
            data["slots"]["unverifiable"] = self.slots.unverifiable
        if self.warnings:
            data["warnings"] = [d.to_json() for d in self.warnings]
        if self.gang is not None:
            data["gang"] = self.gang.to_json()
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MapStatus:
        data = json.loads(text)
        slots = data.get("slots", {})
        return cls(
            phase=Phase(data["phase"]),
            observed_generation=int(data.get("observedGeneration", 0)),
            observed_version=str(data.get("observedVersion", "")),
            message=str(data.get("message", "")),
            errors=tuple(Diagnostic.from_json(e) for e in data.get("errors", [])),
            slots=SlotCounts(
                int(slots.get("total", 0)),
                int(slots.get("served", 0)),
                int(slots.get("bound", 0)),
                int(slots.get("blocked", 0)),
                int(slots.get("drifted", 0)),
                int(slots.get("renumbered", 0)),
                int(slots.get("unverifiable", 0)),
            ),
            serving_version=str(data.get("servingVersion", "")),
            warnings=tuple(Diagnostic.from_json(w) for w in data.get("warnings", [])),
            observed_data_hash=str(data.get("observedDataHash", "")),
            revision=str(data.get("revision", "")),
            rollout=str(data.get("rollout", "")),
            gang=GangStatus.from_json(data.get("gang")),
        )
