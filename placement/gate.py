"""The one gate: whether a pod may hold the GPUs it would get, by the grants.

Every way a pod comes to hold a GPU (a map's pod, a legacy line, a pre-bound pod, a `count` pick,
a fallback spare, a MIG instance, a DRA claim) is judged here, by `judge`, on what it actually
gets: the node the resolver picks (never the name as written: a logical name may equal another
node's name) and the devices as the node's inventory identifies them (a grant may list NVML
indices or UUIDs; a GPU is granted when either of its names is). A MIG instance is granted through
its parent GPU. The webhook calls it at pod create, the compiler on each compiled slot, and the
binder before a hold counts; what it refuses never holds anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from placement.grants import GrantView
from placement.inventory import NodeInventory
from placement.model import CompiledSlot
from placement.spares import serves_from_fallback
from placement.types import DeviceRef, GpuUuid


class Path(StrEnum):
    """How a pod comes to hold its GPUs (for the reason's wording and the tests' tables)."""

    MAP = "map"
    COUNT = "count"
    FALLBACK = "fallback"
    MIG = "mig"
    LEGACY = "legacy"
    PREBOUND = "prebound"
    DRA = "dra"


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as the inventory names it: its UUID and NVML index, either unknown (None) while
    the node's inventory does not list it. For a MIG instance: its parent GPU."""

    uuid: GpuUuid | None = None
    index: int | None = None

    def names(self) -> tuple[DeviceRef, ...]:
        return tuple(n for n in (self.index, self.uuid) if n is not None)

    def __str__(self) -> str:
        if self.index is not None and self.uuid is not None:
            return f"{self.index} ({self.uuid})"
        return str(self.index if self.index is not None else self.uuid)


def identify(
    inventory: NodeInventory | None, refs: Iterable[str | DeviceRef]
) -> tuple[Device, ...]:
    """The devices `refs` (NVML indices, GPU UUIDs, MIG UUIDs, PCI bus IDs, as a map, a line or a
    binding writes them) name on a node, as its inventory identifies them; a MIG instance as its
    parent GPU. A reference the inventory does not list keeps only the name it was written as."""
    out: list[Device] = []
    for written in refs:
        ref: DeviceRef = (
            int(written)
            if isinstance(written, str) and written.isdecimal()
            else written
            if isinstance(written, int)
            else GpuUuid(written)
        )
        found = inventory.find(ref) if inventory is not None else None
        if found is None and inventory is not None and isinstance(ref, str):
            found = inventory.mig_parent.get(ref)
        if found is not None:
            out.append(Device(found.uuid, found.index))
        elif isinstance(ref, int):
            out.append(Device(index=ref))
        else:
            out.append(Device(uuid=GpuUuid(ref)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the gate refuses: the namespace, the node and the devices, and the reason."""

    namespace: str
    node: str
    devices: tuple[Device, ...]
    path: Path
    reason: str

    def __str__(self) -> str:
        return self.reason


def judge(
    view: GrantView,
    namespace: str,
    path: Path,
    node: str | None,
    devices: Iterable[Device],
    *,
    written: str | None = None,
    bound_to: str | None = None,
) -> Refusal | None:
    """Whether `namespace` may hold `devices` on `node` (resolved; None: the name `written`
    resolves to no node). `bound_to`: the node a pod already runs on (a pre-bound pod): it holds
    nothing unless that is the node its line resolves to. None when the hold is allowed."""
    held = tuple(devices)
    where = node if node is not None else (written or "")
    shown = ", ".join(str(d) for d in held) or "none"

    def refuse(reason: str) -> Refusal:
        return Refusal(namespace, where, held, path, reason)

    if bound_to is not None and bound_to != node:
        line = f"node {written!r}" if written else "its line's node"
        resolved = f"node {node}" if node is not None else "no node"
        return refuse(
            f"pod of namespace {namespace} runs on node {bound_to}, but {line} resolves to "
            f"{resolved}: it holds no GPUs ({shown}) there"
        )
    if view.allows_everything:
        return None
    grants = view.namespaces.get(namespace)
    if grants is None:
        if not view.deny_by_default:
            return None
        return refuse(
            f"namespace {namespace} has no grant in the placement policy, and grants deny by "
            f"default: it may not hold GPU(s) {shown} of node {where}; ask a cluster admin to "
            f"grant it nodes in gpuplace-system/{view.origin}"
        )
    if node is None:
        return refuse(
            f"namespace {namespace}: node {written!r} resolves to no node, so no grant can give it"
        )
    if node not in grants:
        if namespace in view.unresolved:
            return None
        named = f" (written {written!r})" if written and written != node else ""
        return refuse(
            f"namespace {namespace} may not place on node {node}{named}: no grant in "
            f"gpuplace-system/{view.origin} gives it that node (GPU(s) {shown})"
        )
    allowed = grants[node]
    if allowed is None:
        return None
    outside = [d for d in held if not any(n in allowed for n in d.names())]
    if outside:
        granted = ", ".join(
            str(d) for d in sorted(allowed, key=lambda d: (isinstance(d, str), str(d)))
        )
        return refuse(
            f"namespace {namespace} may not use GPU(s) {', '.join(map(str, outside))} of node "
            f"{node}: its grant allows {granted}"
        )
    return None


def slot_devices(slot: CompiledSlot, inventory: NodeInventory | None) -> tuple[Device, ...]:
    """What a pod of a compiled slot holds, identified: its GPUs (a MIG instance's parent)."""
    if slot.mig is not None:
        parent = GpuUuid(slot.mig.parent) if slot.mig.parent else None
        index = slot.device_indices[0] if slot.device_indices else None
        if parent is None and index is None:
            return identify(inventory, (slot.mig.request.gpu,))
        return (Device(parent, index),)
    if slot.resolved:
        return tuple(Device(u, i) for u, i in zip(slot.devices, slot.device_indices, strict=True))
    if slot.devices or slot.device_indices:
        return identify(inventory, (*slot.devices, *slot.device_indices))
    return identify(inventory, slot.declared.refs)


def slot_path(slot: CompiledSlot) -> Path:
    if slot.mig is not None:
        return Path.MIG
    if slot.declared.count is not None:
        return Path.COUNT
    if serves_from_fallback(slot):
        return Path.FALLBACK
    return Path.MAP


def judge_slot(
    view: GrantView,
    namespace: str,
    slot: CompiledSlot,
    inventory: NodeInventory | None,
    written: str | None = None,
) -> Refusal | None:
    """`judge` for the pods of a compiled slot (its node resolved, its devices as compiled)."""
    if view.allows_everything:
        return None
    return judge(
        view,
        namespace,
        slot_path(slot),
        slot.node,
        slot_devices(slot, inventory),
        written=written,
    )
