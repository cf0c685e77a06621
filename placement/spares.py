"""Spare (fallback) devices: an entry that names its GPUs may list spares, used in order in place
of a declared GPU that is missing from the node's inventory, unhealthy, or carries a DRA taint
the slot does not tolerate. The slot then serves from
the spare until the declared GPU is back; a pod bound meanwhile holds the spare and reads as
drifted once the slot returns to its declared GPU (its map's rollout decides what happens)."""

from __future__ import annotations

from collections.abc import Callable

from placement.devices import DeclaredDevices
from placement.inventory import GpuDevice, NodeInventory, device_problems
from placement.maps import DeclaredSlot
from placement.model import CompiledSlot
from placement.types import NodeName

#: How a served slot's message begins when a spare stands in (map status, `gpuplace status`).
SERVING_FROM_FALLBACK = "serving from fallback"


def with_spares(
    slot: DeclaredSlot,
    node: NodeName,
    inventory: NodeInventory,
    free: Callable[[GpuDevice], bool],
) -> tuple[CompiledSlot, list[str]] | None:
    """The slot served with a spare for each declared GPU that is missing, unhealthy, in MIG mode
    or tainted (the first present, healthy, untainted, whole, matching and `free` spare not yet
    used), with the problems and substitutions found; None when the spares cannot cover every
    such GPU (the slot is then what its declared devices make it)."""
    where = f"index {slot.index} on node {node}"
    declared_uuids = {d.uuid for d in map(inventory.find, slot.devices) if d is not None}
    spares = [
        d
        for d in map(inventory.find, slot.fallback)
        if d is not None
        and d.healthy
        and not d.mig_mode
        and not d.blocked_by(slot.tolerations)
        and d.uuid not in declared_uuids
        and d.satisfies(slot.require)
        and free(d)
    ]
    served: list[GpuDevice] = []
    problems: list[str] = []
    substitutions: list[str] = []
    for ref in slot.devices:
        device = inventory.find(ref)
        tainted = device.blocked_by(slot.tolerations) if device is not None else ()
        if device is not None and device.healthy and not device.mig_mode and not tainted:
            served.append(device)
            problems += (
                f"{where}: {m}" for _, m in device_problems(device, slot.require, str(ref))
            )
            continue
        if not spares:
            return None
        spare = spares.pop(0)
        served.append(spare)
        if device is None:
            why = "not found"
        elif not device.healthy:
            why = f"unhealthy ({device.health_reason or 'unknown'})"
        elif tainted:
            why = "tainted " + ", ".join(t.describe() for t in tainted)
        else:
            why = "in MIG mode"
        substitutions.append(
            f"device {ref} {why}: fallback device {spare.index} ({spare.uuid}) stands in"
        )
    if not substitutions:
        return None
    message = f"{SERVING_FROM_FALLBACK}: " + "; ".join(substitutions)
    return CompiledSlot(
        slot.index,
        node,
        tuple(d.uuid for d in served),
        tuple(d.index for d in served),
        DeclaredDevices(slot.devices),
        message=message,
    ), [*problems, f"{where}: {message}"]


def serves_from_fallback(slot: CompiledSlot) -> bool:
    """Whether a served slot stands on a spare for a declared GPU."""
    return not slot.blocked and slot.message.startswith(SERVING_FROM_FALLBACK)
