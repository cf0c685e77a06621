"""One slot's devices against its node's inventory: the GPUs an entry names, found or not, healthy
or not, matching its requirement or not; the devices a `count` entry picks among free ones; and
the MIG instance a `mig` entry gets."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Literal

from placement.devices import DeclaredDevices
from placement.inventory import (
    GpuDevice,
    MigInstance,
    NodeInventory,
    device_problems,
    taint_problem,
    untolerated_taints,
)
from placement.maps import DeclaredSlot
from placement.migprofiles import product_problem
from placement.model import CompiledSlot, MigSlot
from placement.reasons import Reason
from placement.remedies import move_command
from placement.spares import with_spares
from placement.types import GpuUuid, NodeName


def select_devices(
    candidates: Iterable[GpuDevice], count: int, *, nvlink: bool = False
) -> tuple[GpuDevice, ...] | None:
    """Picks `count` devices close together, the closest kind first: all joined to each other by
    NVLink, then all under one PCIe switch, then within one NUMA node (the fullest one that fits,
    to keep larger groups free), adjacent by PCI bus id. With `nvlink` only the first kind will
    do (None otherwise). Deterministic for the same input."""
    pool = sorted(candidates, key=lambda d: (d.pci_bus_id, d.index))
    if len(pool) < count:
        return None
    if count == 1:
        # One GPU is trivially joined to itself: the NUMA rule below keeps larger groups free.
        return _by_numa(pool, count)
    by_index = sorted(pool, key=lambda d: d.index)
    linked = joined_set(by_index, count, lambda d: d.nvlink_peers)
    if linked is not None or nvlink:
        return linked
    switched = joined_set(by_index, count, lambda d: d.pcie_switch_peers)
    if switched is not None:
        return switched
    return _by_numa(pool, count)


def _by_numa(pool: list[GpuDevice], count: int) -> tuple[GpuDevice, ...]:
    groups: dict[int | None, list[GpuDevice]] = defaultdict(list)
    for device in pool:
        groups[device.numa_node].append(device)
    fitting = [g for g in groups.values() if len(g) >= count]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0].pci_bus_id))
        return tuple(best[:count])
    return tuple(pool[:count])


def joined_set(
    devices: list[GpuDevice], count: int, peers: Callable[[GpuDevice], tuple[GpuUuid, ...]]
) -> tuple[GpuDevice, ...] | None:
    """The first `count` of `devices` (in their order) that are pairwise peers, or None. A link
    reported by either end counts. Backtracking: nodes have at most a few dozen GPUs."""
    if count == 1:
        return (devices[0],) if devices else None
    links = {d.uuid: set(peers(d)) for d in devices}
    for d in devices:
        for p in links[d.uuid]:
            if p in links:
                links[p].add(d.uuid)
    # A device with fewer peers than the set needs cannot be in it.
    eligible = [d for d in devices if len(links[d.uuid]) >= count - 1]
    chosen: list[GpuDevice] = []

    def extend(start: int) -> bool:
        if len(chosen) == count:
            return True
        for i in range(start, len(eligible) - (count - len(chosen)) + 1):
            device = eligible[i]
            if all(c.uuid in links[device.uuid] for c in chosen):
                chosen.append(device)
                if extend(i + 1):
                    return True
                chosen.pop()
        return False

    return tuple(chosen) if extend(0) else None


def all_joined(devices: Iterable[GpuDevice]) -> bool:
    """Whether the devices are pairwise joined by NVLink (as reported by either end)."""
    group = list(devices)
    return joined_set(group, len(group), lambda d: d.nvlink_peers) is not None if group else True


def resolve_named(
    slot: DeclaredSlot,
    node: NodeName,
    inventory: NodeInventory | None,
    spare_free: Callable[[GpuDevice], bool] = lambda _: True,
) -> tuple[CompiledSlot, list[str]]:
    """An entry that names its devices (NVML indices or UUIDs); with the problems found. Its
    spares stand in for missing, unhealthy or (DRA) tainted ones where `spare_free` says they
    are free."""
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
        if (
            device is None
            or not device.healthy
            or device.mig_mode
            or not device.satisfies(slot.require)
            or device.blocked_by(slot.tolerations)
        ):
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
    if slot.fallback:
        spared = with_spares(slot, node, inventory, spare_free)
        if spared is not None:
            return spared
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
        problems += (
            f"{where}: {m}"
            for _, m in device_problems(
                device, slot.require, str(ref), tolerations=slot.tolerations
            )
        )
        found.append(device)
    failed = [d.uuid for d in found if not d.healthy]
    if failed:
        # No spare covers it: name the edit that re-places the slot, for the map's status and
        # its Event (the operator runs it against the map repository).
        problems.append(
            f"{where}: no spare for a failed GPU; re-place it: {move_command(gpus=failed)}"
        )
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
    nvlink = slot.require is not None and slot.require.nvlink
    chosen = select_devices(free, slot.count, nvlink=nvlink)
    if chosen is None and nvlink and len(free) >= slot.count:
        message = (
            f"index {slot.index} on node {node}: needs {slot.count} free healthy devices joined "
            f"to each other by NVLink; no such set among the {len(free)} free ones (indices "
            f"{','.join(str(d.index) for d in sorted(free, key=lambda d: d.index))})"
        )
        return CompiledSlot(
            slot.index, node, declared=declared, blocked=Reason.NO_NVLINK_SET, message=message
        ), [message]
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


def resolve_mig(
    slot: DeclaredSlot,
    node: NodeName,
    inventory: NodeInventory | None,
    taken: Callable[[str], bool],
) -> tuple[CompiledSlot, list[str]]:
    """A `mig` entry: the free instance of its profile on its parent GPU with the lowest placement
    start (`taken` says which instances other slots hold); blocked when there is none."""
    assert slot.mig is not None
    request = slot.mig
    where = f"index {slot.index} on node {node}"

    def blocked(
        reason: Reason, why: str, parent: GpuUuid | Literal[""] = ""
    ) -> tuple[CompiledSlot, list[str]]:
        message = f"{where}: MIG {request}: {why}"
        return CompiledSlot(
            slot.index, node, mig=MigSlot(request, parent), blocked=reason, message=message
        ), [message]

    if inventory is None:
        return blocked(Reason.DEVICE_MISSING, f"no inventory for node {node} yet")
    parent = inventory.find(request.gpu)
    if parent is None:
        return blocked(
            Reason.DEVICE_MISSING,
            f"GPU {request.gpu} not found (node has {len(inventory.devices)} GPUs)",
        )
    if not parent.mig_mode:
        return blocked(Reason.DEVICE_MISSING, f"GPU {request.gpu} is not in MIG mode", parent.uuid)
    wrong_product = product_problem(request.profile, parent.name)
    if wrong_product is not None:
        return blocked(Reason.REQUIREMENT_MISMATCH, wrong_product, parent.uuid)
    same = sorted(
        (m for m in parent.mig_instances if m.profile == request.profile),
        key=lambda m: (m.start, m.index, m.uuid),
    )
    free = [m for m in same if not taken(m.uuid)]
    if not free:
        has = f"all {len(same)} taken by other slots" if same else "none exist"
        return blocked(
            Reason.DEVICE_MISSING,
            f"no free {request.profile} instance on GPU {request.gpu} ({has})",
            parent.uuid,
        )
    # An instance whose DRA device is tainted serves only if no untainted one is free.
    clean = [m for m in free if not untolerated_taints(m.taints, slot.tolerations)]
    return mig_slot(slot, node, parent, (clean or free)[0])


def mig_slot(
    slot: DeclaredSlot, node: NodeName, parent: GpuDevice, instance: MigInstance
) -> tuple[CompiledSlot, list[str]]:
    """The compiled slot of one MIG instance, with what keeps it from serving: its parent's
    problems, and its own DRA device's taints."""
    assert slot.mig is not None
    shown = f"{parent.index} ({parent.uuid})"
    found = device_problems(parent, slot.require, shown, whole=False)
    tainted = taint_problem(instance.taints, slot.tolerations, f"MIG {instance.uuid}")
    if tainted is not None:
        found.append(tainted)
    problems = [f"index {slot.index} on node {node}: {m}" for _, m in found]
    return CompiledSlot(
        slot.index,
        node,
        (GpuUuid(instance.uuid),),
        (parent.index,),
        mig=MigSlot(slot.mig, parent.uuid),
    ), problems
