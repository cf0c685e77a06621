"""One slot's devices against its node's inventory: the GPUs an entry names, found or not, healthy
or not, matching its requirement or not; and the devices a `count` entry picks among free ones."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from placement.devices import DeclaredDevices
from placement.inventory import GpuDevice, NodeInventory, device_problems
from placement.maps import DeclaredSlot
from placement.model import CompiledSlot
from placement.reasons import Reason
from placement.types import NodeName


def select_devices(candidates: Iterable[GpuDevice], count: int) -> tuple[GpuDevice, ...] | None:
    """Picks `count` devices close together: within one NUMA node if possible (the fullest one that
    fits, to keep larger groups free), adjacent by PCI bus id. Deterministic for the same input."""
    pool = sorted(candidates, key=lambda d: (d.pci_bus_id, d.index))
    if len(pool) < count:
        return None
    groups: dict[int | None, list[GpuDevice]] = defaultdict(list)
    for device in pool:
        groups[device.numa_node].append(device)
    fitting = [g for g in groups.values() if len(g) >= count]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0].pci_bus_id))
        return tuple(best[:count])
    return tuple(pool[:count])


def resolve_named(
    slot: DeclaredSlot, node: NodeName, inventory: NodeInventory | None
) -> tuple[CompiledSlot, list[str]]:
    """An entry that names its devices (NVML indices or UUIDs); with the problems found."""
    declared = DeclaredDevices(slot.devices)
    if inventory is None:
        indices = tuple(d for d in slot.devices if isinstance(d, int))
        uuids = tuple(d for d in slot.devices if not isinstance(d, int))
        # Without an inventory we know what was written: indices, or UUIDs, not both.
        return CompiledSlot(
            slot.index,
            node,
            devices=uuids if len(uuids) == len(slot.devices) else (),
            device_indices=indices if len(indices) == len(slot.devices) else (),
            declared=declared,
        ), []
    found: list[GpuDevice] = []
    for ref in slot.devices:
        device = inventory.find(ref)
        if device is None or not device.healthy or not device.satisfies(slot.require):
            break
        found.append(device)
    else:
        # Every device present, healthy and matching: the common case, kept cheap.
        return CompiledSlot(
            slot.index,
            node,
            tuple([d.uuid for d in found]),
            tuple([d.index for d in found]),
            declared,
        ), []
    return _with_problems(slot, node, inventory, declared)


def _with_problems(
    slot: DeclaredSlot,
    node: NodeName,
    inventory: NodeInventory,
    declared: DeclaredDevices,
) -> tuple[CompiledSlot, list[str]]:
    where = f"index {slot.index} on node {node}"
    problems: list[str] = []
    missing: list[str] = []
    found: list[GpuDevice] = []
    for ref in slot.devices:
        device = inventory.find(ref)
        if device is None:
            missing.append(
                f"{where}: device {ref} not found (node has {len(inventory.devices)} GPUs)"
            )
            problems.append(missing[-1])
            continue
        problems += (f"{where}: {m}" for _, m in device_problems(device, slot.require, str(ref)))
        found.append(device)
    if missing:
        message = "; ".join(missing)
        return CompiledSlot(
            slot.index, node, declared=declared, blocked=Reason.DEVICE_MISSING, message=message
        ), problems
    return CompiledSlot(
        slot.index, node, tuple(d.uuid for d in found), tuple(d.index for d in found), declared
    ), problems


def no_inventory_to_pick(slot: DeclaredSlot, node: NodeName) -> tuple[CompiledSlot, list[str]]:
    """A `count` entry on a node that has reported no inventory yet."""
    return CompiledSlot(
        slot.index,
        node,
        declared=DeclaredDevices(count=slot.count),
        blocked=Reason.INSUFFICIENT_DEVICES,
        message=f"no inventory for node {node} yet",
    ), [
        f"index {slot.index} on node {node}: no inventory for node {node} to pick "
        f"{slot.count} devices from"
    ]


def picked(
    slot: DeclaredSlot, node: NodeName, usable: list[GpuDevice], free: list[GpuDevice]
) -> tuple[CompiledSlot, list[str]]:
    """A `count` entry's pick among the `free` ones of its `usable` devices."""
    assert slot.count is not None
    declared = DeclaredDevices(count=slot.count)
    chosen = select_devices(free, slot.count)
    if chosen is None:
        want = slot.require.describe() if slot.require else "any GPU"
        message = (
            f"index {slot.index} on node {node}: needs {slot.count} free healthy devices "
            f"({want}), {len(free)} available"
        )
        return CompiledSlot(
            slot.index,
            node,
            declared=declared,
            blocked=Reason.INSUFFICIENT_DEVICES,
            message=message,
        ), [message]
    return CompiledSlot(
        slot.index, node, tuple(d.uuid for d in chosen), tuple(d.index for d in chosen), declared
    ), []
