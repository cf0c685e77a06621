"""The agent's verdict on every model entry that targets its node.

For each slot of the compiled model on this node: do the GPUs it names exist here (by UUID, or by
NVML index), are they healthy, and do they match what the map requires (when the declared map is
at hand: the compiled model does not carry `require`). A device named by a `MIG-` UUID is a MIG
device: it exists when a GPU of the node lists it among its MIG devices, and it is as healthy as
that GPU, which must be in MIG mode. Pure functions of the inventory and the model; the agent
publishes the results and the controller folds them into map status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from placement.compile import Compiler
from placement.inventory import DeviceCheck, GpuDevice, NodeInventory, device_problems
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import CompiledMap, CompiledSlot
from placement.reasons import Reason
from placement.types import DeviceRef, MapKey

#: When a slot has several problems, the check names the one that matters most to its pod.
_SEVERITY = {Reason.DEVICE_MISSING: 0, Reason.DEVICE_UNHEALTHY: 1, Reason.REQUIREMENT_MISMATCH: 2}

Problem = tuple[Reason, str]  # (reason, message)
_MIG_PREFIX = "MIG-"


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """A device a slot names, as `device_problems` judges it (a MIG device: its parent GPU with
    the MIG device's memory), and how messages name it."""

    device: GpuDevice
    shown: str
    whole: bool = True  # False for a MIG device (then `device` is its parent)


def check_node(
    inventory: NodeInventory,
    maps: Iterable[CompiledMap],
    declared: Mapping[MapKey, PlacementMap] | None = None,
) -> tuple[DeviceCheck, ...]:
    """One check per slot on `inventory.node`, ordered by map and index. `declared` supplies each
    map's `require` and `count` where the caller has the source maps."""
    checks: list[DeviceCheck] = []
    for cmap in sorted(maps, key=lambda m: m.key):
        pmap = declared.get(cmap.key) if declared else None
        for index in cmap.sorted_indices:
            slot = cmap.slots[index]
            if slot.node != inventory.node:
                continue
            declared_slot = pmap.by_index.get(index) if pmap is not None else None
            checks.append(check_slot(inventory, cmap.key, slot, declared_slot))
    return tuple(checks)


def check_slot(
    inventory: NodeInventory,
    key: MapKey,
    slot: CompiledSlot,
    declared: DeclaredSlot | None = None,
) -> DeviceCheck:
    requirement = declared.require if declared is not None else None
    problems: list[Problem] = []
    if slot.devices or slot.device_indices:
        found = _find_compiled(inventory, slot, problems)
    else:
        # The compiler leaves a slot empty when its devices were not found or not yet picked;
        # what the map declared is then the only thing to check.
        refs, count = _declared_refs(slot, declared)
        if count is not None:
            return _check_count(inventory, key, slot, count, requirement)
        if not refs:
            return DeviceCheck(str(key), slot.index, True, message="no devices declared")
        found = [d for d in (_find(inventory, ref, problems) for ref in refs) if d is not None]
    for item in found:
        problems.extend(device_problems(item.device, requirement, item.shown, whole=item.whole))
    return _verdict(inventory, key, slot, found, problems)


def check_maps(
    inventory: NodeInventory,
    maps: Iterable[PlacementMap],
    node_labels: Mapping[str, str] | None = None,
) -> tuple[DeviceCheck, ...]:
    """Compiles `maps` against this node alone and checks its slots: a first look on a node
    before the maps are committed (`gpuplace agent --once --print --map FILE`)."""
    declared = {m.key: m for m in maps}
    compiler = Compiler()
    compiler.set_node(inventory.node, node_labels or {})
    compiler.set_inventory(inventory)
    for pmap in declared.values():
        compiler.set_map(pmap)
    model, _ = compiler.build()
    return check_node(inventory, model.maps.values(), declared)


# -- helpers ---------------------------------------------------------------------------------
def _find_compiled(
    inventory: NodeInventory, slot: CompiledSlot, problems: list[Problem]
) -> list[_Found]:
    found: list[_Found] = []
    if not slot.devices:
        for index in slot.device_indices:
            by_index = _find(inventory, index, problems)
            if by_index is not None:
                found.append(by_index)
        return found
    for position, uuid in enumerate(slot.devices):
        item = _find(inventory, uuid, problems)
        if item is None:
            continue
        device = item.device
        expected = slot.device_indices[position] if position < len(slot.device_indices) else None
        # A MIG device reaches its pod by UUID in every envMode: no index to compare.
        if expected is not None and not uuid.startswith(_MIG_PREFIX) and expected != device.index:
            # CUDA_VISIBLE_DEVICES carries the index: a pod started now would get another GPU.
            problems.append(
                (
                    Reason.DEVICE_MISSING,
                    f"device {uuid} is index {device.index} on node {inventory.node}, the model "
                    f"says {expected}",
                )
            )
        found.append(item)
    return found


def _find(inventory: NodeInventory, ref: DeviceRef, problems: list[Problem]) -> _Found | None:
    if isinstance(ref, str) and ref.startswith(_MIG_PREFIX):
        return _find_mig(inventory, ref, problems)
    device = inventory.find(ref)
    if device is not None:
        return _Found(device, _show(device))
    unidentified = [d for d in inventory.devices if not d.uuid]
    if not isinstance(ref, int) and unidentified:
        # A GPU lost before the agent ever read its UUID may be the one the map names.
        which = ", ".join(str(d.index) for d in unidentified)
        problems.append(
            (
                Reason.DEVICE_UNHEALTHY,
                f"device {ref} not found on node {inventory.node}; GPU {which} cannot be "
                f"identified ({unidentified[0].health_reason}) and may be it",
            )
        )
        return None
    problems.append(
        (
            Reason.DEVICE_MISSING,
            f"device {ref} not found on node {inventory.node} ({_count(inventory)})",
        )
    )
    return None


def _find_mig(inventory: NodeInventory, uuid: str, problems: list[Problem]) -> _Found | None:
    instance = inventory.mig_by_uuid.get(uuid)
    unidentified = [d for d in inventory.devices if not d.uuid]
    if instance is None and unidentified:
        which = ", ".join(str(d.index) for d in unidentified)
        problems.append(
            (
                Reason.DEVICE_UNHEALTHY,
                f"MIG device {uuid} not found on node {inventory.node}; GPU {which} cannot be "
                f"identified ({unidentified[0].health_reason}) and may hold it",
            )
        )
        return None
    if instance is None:
        problems.append(
            (
                Reason.DEVICE_MISSING,
                f"MIG device {uuid} not found on node {inventory.node} ({_mig_count(inventory)})",
            )
        )
        return None
    parent = inventory.mig_parent[uuid]
    shown = f"{uuid} ({instance.profile or 'MIG'} on GPU {_show(parent)})"
    if not parent.mig_mode:
        problems.append(
            (Reason.DEVICE_MISSING, f"MIG device {shown}: GPU {parent.index} is not in MIG mode")
        )
        return None
    # `require.minMemoryMiB` asks what the pod gets: the MIG device's memory, not the GPU's.
    return _Found(dataclasses.replace(parent, memory_mib=instance.memory_mib), shown, whole=False)


def _mig_count(inventory: NodeInventory) -> str:
    n = len(inventory.mig_by_uuid)
    if n == 0:
        return "no GPU of it has MIG devices"
    return f"{n} MIG device{'' if n == 1 else 's'}, none with this UUID"


def _declared_refs(
    slot: CompiledSlot, declared: DeclaredSlot | None
) -> tuple[tuple[DeviceRef, ...], int | None]:
    if declared is not None:
        return declared.devices, declared.count
    return slot.declared.refs, slot.declared.count


def _check_count(
    inventory: NodeInventory,
    key: MapKey,
    slot: CompiledSlot,
    count: int,
    requirement: Requirement | None,
) -> DeviceCheck:
    want = requirement.describe() if requirement is not None else "any GPU"
    matching = [d for d in inventory.devices if d.satisfies(requirement)]
    healthy = [d for d in matching if d.healthy]
    node = inventory.node
    if len(inventory.devices) < count:
        reason = Reason.DEVICE_MISSING
        message = f"needs {_gpus(count)}, node {node} has {_count(inventory)}"
    elif len(matching) < count:
        reason = Reason.REQUIREMENT_MISMATCH
        message = f"needs {_gpus(count)} matching {want}, node {node} has {len(matching)}"
    elif len(healthy) < count:
        sick = ", ".join(f"{_show(d)}: {d.health_reason}" for d in matching if not d.healthy)
        reason = Reason.DEVICE_UNHEALTHY
        message = (
            f"needs {_gpus(count)} healthy and matching {want}, node {node} has "
            f"{len(healthy)} ({sick})"
        )
    else:
        message = f"count={count}: {_gpus(len(healthy))} on node {node} healthy and matching {want}"
        return DeviceCheck(str(key), slot.index, True, message=message)
    return DeviceCheck(str(key), slot.index, False, reason, message)


def _verdict(
    inventory: NodeInventory,
    key: MapKey,
    slot: CompiledSlot,
    found: Sequence[_Found],
    problems: Sequence[Problem],
) -> DeviceCheck:
    if not problems:
        shown = ", ".join(f.shown for f in found)
        noun = "device" if len(found) == 1 else "devices"
        message = f"{noun} {shown} present and healthy on node {inventory.node}"
        return DeviceCheck(str(key), slot.index, True, message=message)
    reason = min((r for r, _ in problems), key=_SEVERITY.__getitem__)
    return DeviceCheck(str(key), slot.index, False, reason, "; ".join(m for _, m in problems))


def _show(device: GpuDevice) -> str:
    return f"{device.index} ({device.uuid})" if device.uuid else str(device.index)


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _count(inventory: NodeInventory) -> str:
    n = len(inventory.devices)
    if n == 0:
        return "no GPUs"
    indices = sorted(inventory.by_index)
    span = f"index {indices[0]}" if n == 1 else f"indices {indices[0]}-{indices[-1]}"
    return f"{_gpus(n)}, {span}"
