"""Device taints and tolerations (Kubernetes DRA, KEP-5055), as pure values.

A DRA driver taints a device in its ResourceSlice (NVIDIA's driver writes
`gpu.nvidia.com/xid=<code>:NoSchedule` after an XID), and an administrator taints devices with a
DeviceTaintRule. In dra enforcement a declared device with a NoSchedule or NoExecute taint that
its slot does not tolerate is not served, as an unhealthy GPU is not; `None` taints only inform.
Matching follows Kubernetes' device tolerations, so a map's toleration means what the same
toleration in a ResourceClaim would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"  # also evicts pods already running (kube-controller-manager)
    NONE = "None"  # informs only: neither scheduling nor eviction heed it


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


#: The effects that keep a device from new allocations.
BLOCKING = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str  # a TaintEffect, or an effect newer than this code (read as blocking)

    @property
    def blocks(self) -> bool:
        # An effect this code does not know is treated as keeping the device away, the safe side.
        return self.effect != TaintEffect.NONE

    def describe(self) -> str:
        """`key=value:Effect`, as kubectl prints taints."""
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A slot's device toleration: an empty key with `Exists` tolerates every taint; no effect
    means every effect."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None

    def tolerates(self, taint: DeviceTaint) -> bool:
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator is TolerationOperator.EXISTS:
            return True
        return bool(self.key) and self.value == taint.value

    def to_api(self) -> dict[str, str]:
        """The toleration as a ResourceClaim's request and allocation result write it."""
        out = {"operator": self.operator.value}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect.value
        return out

    def encode(self) -> list[str]:
        return [self.key, self.operator.value, self.value, self.effect.value if self.effect else ""]

    @classmethod
    def decode(cls, row: Iterable[Any]) -> Toleration:
        key, operator, value, effect = (str(v) for v in row)
        return cls(
            key, TolerationOperator(operator), value, TaintEffect(effect) if effect else None
        )


def untolerated(
    taints: Iterable[DeviceTaint], tolerations: Iterable[Toleration]
) -> tuple[DeviceTaint, ...]:
    """The taints that keep a device from the slot: blocking and tolerated by none."""
    held = tuple(tolerations)
    return tuple(t for t in taints if t.blocks and not any(tol.tolerates(t) for tol in held))


def read_taint(obj: Mapping[str, Any]) -> DeviceTaint | None:
    key = obj.get("key")
    if not isinstance(key, str) or not key:
        return None
    return DeviceTaint(key, str(obj.get("value") or ""), str(obj.get("effect") or ""))


def read_taints(device: Mapping[str, Any]) -> tuple[DeviceTaint, ...]:
    """A ResourceSlice device's `taints`."""
    found = (read_taint(t) for t in device.get("taints") or () if isinstance(t, Mapping))
    return tuple(t for t in found if t is not None)


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A DeviceTaintRule (`resource.k8s.io/v1alpha3`): one taint for the devices its selector
    picks. Its `deviceClassName` and CEL `selectors` (older API versions) are not evaluated: such a
    rule taints every device its driver, pool and device fields admit, so a device it may mean is
    never handed out."""

    name: str
    taint: DeviceTaint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


def read_taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """The rule, or None when it selects nothing (no `deviceSelector`, as Kubernetes reads it)
    or has no usable taint."""
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector")
    taint = read_taint(spec.get("taint") or {})
    if not isinstance(selector, Mapping) or taint is None:
        return None

    def field(name: str) -> str | None:
        value = selector.get(name)
        return str(value) if value else None

    name = str((obj.get("metadata") or {}).get("name", ""))
    return TaintRule(name, taint, field("driver"), field("pool"), field("device"))
