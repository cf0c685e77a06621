"""The agent's checks of model entries against its node's inventory (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.checks import check_maps, check_node, check_slot
from placement.devices import DeclaredDevices
from placement.inventory import DeviceCheck, GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import CompiledMap, CompiledSlot
from placement.reasons import Reason
from placement.types import DeviceRef, GpuUuid, MapKey, NodeName
from placement.validate import parse_map

NODE = NodeName("gpu-a-01")
OTHER = NodeName("gpu-b-01")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
KEY = MapKey("inference", "llm")

DEVICE_MISSING, DEVICE_UNHEALTHY, REQUIREMENT_MISMATCH = (
    Reason.DEVICE_MISSING,
    Reason.DEVICE_UNHEALTHY,
    Reason.REQUIREMENT_MISMATCH,
)


def uuid(index: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000000-0000-0000-0000-{index:012d}")


def gpu(index: int, *, name: str = H100, memory: int = 81559, reason: str = "") -> GpuDevice:
    return GpuDevice(
        index,
        uuid(index),
        name,
        memory,
        f"00000000:{0x18 + index:02X}:00.0",
        healthy=not reason,
        health_reason=reason,
    )


def node(*devices: GpuDevice, name: NodeName = NODE) -> NodeInventory:
    return NodeInventory(name, devices, "550.54.15", "12.4")


FOUR = node(gpu(0), gpu(1), gpu(2), gpu(3))


def by_uuid(index: int, *devices: int, node_name: NodeName = NODE) -> CompiledSlot:
    """A slot the compiler resolved against an inventory: UUIDs and their indices."""
    return CompiledSlot(
        index, node_name, tuple(uuid(d) for d in devices), devices, DeclaredDevices(devices)
    )


def by_index(index: int, *devices: int, node_name: NodeName = NODE) -> CompiledSlot:
    """A slot compiled before the node had an inventory, declared by NVML index."""
    return CompiledSlot(index, node_name, (), devices, DeclaredDevices(devices))


def compiled(*slots: CompiledSlot, key: MapKey = KEY) -> CompiledMap:
    return CompiledMap(key, {s.index: s for s in slots})


def declared(*slots: DeclaredSlot, key: MapKey = KEY) -> dict[MapKey, PlacementMap]:
    return {key: PlacementMap(key, slots)}


def check(
    inventory: NodeInventory, slot: CompiledSlot, decl: DeclaredSlot | None = None
) -> DeviceCheck:
    return check_slot(inventory, KEY, slot, decl)


# -- present and healthy ---------------------------------------------------------------------
def test_resolved_slot_with_present_healthy_devices_passes() -> None:
    result = check(FOUR, by_uuid(0, 0, 1))
    assert result == DeviceCheck(
        "inference/llm",
        0,
        True,
        message=f"devices 0 ({uuid(0)}), 1 ({uuid(1)}) present and healthy on node {NODE}",
    )


@pytest.mark.parametrize(
    "slot",
    [
        by_index(3, 2),
        CompiledSlot(
            3, NODE, (uuid(2),), (), DeclaredDevices((uuid(2),))
        ),  # declared by UUID, no inventory yet
    ],
    ids=["by-index", "by-uuid"],
)
def test_slot_compiled_without_inventory_is_checked_by_what_it_names(slot: CompiledSlot) -> None:
    result = check(FOUR, slot)
    assert result.ok, result
    assert result.message == f"device 2 ({uuid(2)}) present and healthy on node {NODE}"


# -- DeviceMissing -----------------------------------------------------------------------------
def test_index_beyond_the_node_is_missing() -> None:
    result = check(FOUR, by_index(2, 7))
    assert (result.ok, result.reason) == (False, DEVICE_MISSING)
    assert result.message == f"device 7 not found on node {NODE} (4 GPUs, indices 0-3)"


def test_uuid_not_on_the_node_is_missing() -> None:
    slot = CompiledSlot(1, NODE, (uuid(9),), (9,), DeclaredDevices((9,)))
    result = check(node(gpu(0)), slot)
    assert (result.ok, result.reason) == (False, DEVICE_MISSING)
    assert result.message == f"device {uuid(9)} not found on node {NODE} (1 GPU, index 0)"


def test_empty_node_is_named_as_such() -> None:
    result = check(node(), by_index(0, 0))
    assert result.message == f"device 0 not found on node {NODE} (no GPUs)"


def test_slot_the_compiler_left_empty_is_checked_by_its_declared_text() -> None:
    # The compiler empties a slot whose devices the inventory lacks; `declared` still says "7".
    slot = CompiledSlot(2, NODE, declared=DeclaredDevices((0, 7)))
    result = check(FOUR, slot)
    assert (result.ok, result.reason) == (False, DEVICE_MISSING)
    assert result.message == f"device 7 not found on node {NODE} (4 GPUs, indices 0-3)"


def test_uuid_that_moved_to_another_index_is_missing_at_the_modelled_index() -> None:
    # After a reboot the GPU the model calls index 1 is index 3: CUDA_VISIBLE_DEVICES=1 would
    # give the pod another GPU.
    moved = node(gpu(0), dataclasses.replace(gpu(1), index=3), gpu(2))
    result = check(moved, by_uuid(0, 1))
    assert (result.ok, result.reason) == (False, DEVICE_MISSING)
    assert result.message == f"device {uuid(1)} is index 3 on node {NODE}, the model says 1"


# -- DeviceUnhealthy ---------------------------------------------------------------------------
def test_unhealthy_device_fails_with_its_reason() -> None:
    sick = node(gpu(0), gpu(1, reason="XID 79 (GPU has fallen off the bus)"))
    result = check(sick, by_uuid(4, 0, 1))
    assert (result.ok, result.reason) == (False, DEVICE_UNHEALTHY)
    assert result.message == (
        f"device 1 ({uuid(1)}) is unhealthy: XID 79 (GPU has fallen off the bus)"
    )


def test_uuid_possibly_held_by_an_unidentifiable_gpu_is_unhealthy_not_missing() -> None:
    lost = GpuDevice(
        1,
        GpuUuid(""),
        healthy=False,
        health_reason="NVML cannot query the device (nvmlDeviceGetHandleByIndex: GPU is lost)",
    )
    result = check(
        node(gpu(0), lost), CompiledSlot(0, NODE, (uuid(1),), (), DeclaredDevices((uuid(1),)))
    )
    assert (result.ok, result.reason) == (False, DEVICE_UNHEALTHY)
    assert result.message == (
        f"device {uuid(1)} not found on node {NODE}; GPU 1 cannot be identified (NVML cannot "
        "query the device (nvmlDeviceGetHandleByIndex: GPU is lost)) and may be it"
    )


def test_index_of_an_unidentifiable_gpu_is_unhealthy() -> None:
    lost = GpuDevice(1, GpuUuid(""), healthy=False, health_reason="gone")
    result = check(node(gpu(0), lost), by_index(0, 1))
    assert (result.ok, result.reason) == (False, DEVICE_UNHEALTHY)


# -- RequirementMismatch -----------------------------------------------------------------------
def test_requirement_is_checked_when_the_declared_map_is_given() -> None:
    mixed = node(gpu(0), gpu(1, name=A100, memory=40960))
    decl = DeclaredSlot(0, NODE, (0, 1), require=Requirement(product=H100))
    result = check(mixed, by_uuid(0, 0, 1), decl)
    assert (result.ok, result.reason) == (False, REQUIREMENT_MISMATCH)
    assert result.message == (
        f"device 1 ({uuid(1)}) ({A100}, 40960 MiB) does not match product '{H100}'"
    )
    # Without the declared map the model alone cannot know the requirement.
    assert check(mixed, by_uuid(0, 0, 1)).ok


def test_memory_requirement() -> None:
    decl = DeclaredSlot(0, NODE, (0,), require=Requirement(min_memory_mib=80000))
    small = node(gpu(0, name=A100, memory=40960))
    result = check(small, by_uuid(0, 0), decl)
    assert (result.ok, result.reason) == (False, REQUIREMENT_MISMATCH)
    assert result.message.endswith("does not match >= 80000 MiB")
    assert check(FOUR, by_uuid(0, 0), decl).ok


def test_the_most_serious_reason_wins_and_every_problem_is_listed() -> None:
    inventory = node(gpu(0, name=A100, reason="XID 48 (double-bit ECC error)"), gpu(1))
    decl = DeclaredSlot(0, NODE, (0, 5), require=Requirement(product=H100))
    result = check(inventory, CompiledSlot(0, NODE, declared=DeclaredDevices((0, 5))), decl)
    assert result.reason == DEVICE_MISSING
    assert result.message.split("; ") == [
        f"device 5 not found on node {NODE} (2 GPUs, indices 0-1)",
        f"device 0 ({uuid(0)}) is unhealthy: XID 48 (double-bit ECC error)",
        f"device 0 ({uuid(0)}) ({A100}, 81559 MiB) does not match product '{H100}'",
    ]
    without_missing = check(inventory, by_uuid(0, 0), decl)
    assert without_missing.reason == DEVICE_UNHEALTHY


# -- `count` entries not yet resolved -------------------------------------------------------------
@pytest.mark.parametrize(
    ("inventory", "count", "ok", "reason", "message"),
    [
        (
            FOUR,
            2,
            True,
            "",
            f"count=2: 4 GPUs on node {NODE} healthy and matching product '{H100}'",
        ),
        (node(gpu(0)), 2, False, DEVICE_MISSING, f"needs 2 GPUs, node {NODE} has 1 GPU, index 0"),
        (
            node(gpu(0), gpu(1, name=A100)),
            2,
            False,
            REQUIREMENT_MISMATCH,
            f"needs 2 GPUs matching product '{H100}', node {NODE} has 1",
        ),
        (
            node(gpu(0), gpu(1, reason="XID 79 (GPU has fallen off the bus)")),
            2,
            False,
            DEVICE_UNHEALTHY,
            f"needs 2 GPUs healthy and matching product '{H100}', node {NODE} has 1 "
            f"(1 ({uuid(1)}): XID 79 (GPU has fallen off the bus))",
        ),
    ],
    ids=["enough", "too-few-gpus", "wrong-product", "unhealthy"],
)
def test_unresolved_count_entry(
    inventory: NodeInventory, count: int, ok: bool, reason: str, message: str
) -> None:
    decl = DeclaredSlot(5, NODE, count=count, require=Requirement(product=H100))
    slot = CompiledSlot(
        5, NODE, declared=DeclaredDevices(count=count), blocked=Reason.INSUFFICIENT_DEVICES
    )
    result = check(inventory, slot, decl)
    assert (result.ok, result.reason, result.message) == (ok, reason, message)


def test_unresolved_count_entry_without_the_declared_map_uses_the_model_text() -> None:
    slot = CompiledSlot(
        5, NODE, declared=DeclaredDevices(count=8), blocked=Reason.INSUFFICIENT_DEVICES
    )
    result = check(FOUR, slot)
    assert (result.ok, result.reason) == (False, DEVICE_MISSING)
    assert result.message == f"needs 8 GPUs, node {NODE} has 4 GPUs, indices 0-3"


def test_slot_with_nothing_declared_passes_with_a_note() -> None:
    result = check(FOUR, CompiledSlot(5, NODE))
    assert (result.ok, result.message) == (True, "no devices declared")


# -- check_node --------------------------------------------------------------------------------
def test_only_entries_on_this_node_are_checked_in_map_and_index_order() -> None:
    other_map = MapKey("batch", "train")
    maps = [
        compiled(by_uuid(2, 2), by_index(0, 7), by_uuid(1, 0, node_name=OTHER)),
        compiled(by_uuid(9, 3), key=other_map),
    ]
    results = check_node(FOUR, maps)
    assert [(c.map, c.index, c.ok) for c in results] == [
        ("batch/train", 9, True),
        ("inference/llm", 0, False),
        ("inference/llm", 2, True),
    ]


def test_declared_maps_supply_requirements_per_entry() -> None:
    mixed = node(gpu(0), gpu(1, name=A100, memory=40960))
    decl = declared(
        DeclaredSlot(0, NODE, (0,), require=Requirement(product=H100)),
        DeclaredSlot(1, NODE, (1,), require=Requirement(product=H100)),
    )
    results = check_node(mixed, [compiled(by_uuid(0, 0), by_uuid(1, 1))], decl)
    assert [(c.index, c.ok, c.reason) for c in results] == [
        (0, True, ""),
        (1, False, REQUIREMENT_MISMATCH),
    ]


def test_node_without_entries_has_no_checks() -> None:
    assert check_node(FOUR, [compiled(by_uuid(0, 0, node_name=OTHER))]) == ()
    assert check_node(FOUR, []) == ()


# -- check_maps: compile the declared maps against this node, then check ------------------------
MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {{name: llm, namespace: inference}}
spec:
  placements:
    - {{index: 0, node: gpu-a-01, devices: [0, 1]}}
    - {{index: 1, node: gpu-a-01, devices: [{device}]}}
    - {{index: 2, node: gpu-a-01, count: 2, require: {{product: "{product}"}}}}
    - {{index: 3, node: gpu-b-01, devices: [0]}}
"""


def parsed(device: DeviceRef, product: str = H100) -> PlacementMap:
    return parse_map(MAP.format(device=device, product=product), "llm.yaml")


def test_check_maps_finds_the_missing_device_and_passes_once_fixed() -> None:
    results = check_maps(FOUR, [parsed(7)])
    assert [(c.index, c.ok, c.reason) for c in results] == [
        (0, True, ""),
        (1, False, DEVICE_MISSING),
        (2, True, ""),
    ]
    assert results[1].message == f"device 7 not found on node {NODE} (4 GPUs, indices 0-3)"
    assert all(c.ok for c in check_maps(FOUR, [parsed(3)]))
    assert all(c.ok for c in check_maps(FOUR, [parsed(uuid(3))]))


def test_check_maps_checks_count_entries_after_the_compiler_picked_devices() -> None:
    results = check_maps(FOUR, [parsed(3, product=A100)])
    assert [(c.index, c.ok, c.reason) for c in results] == [
        (0, True, ""),
        (1, True, ""),
        (2, False, REQUIREMENT_MISMATCH),
    ]
    assert results[2].message == f"needs 2 GPUs matching product '{A100}', node {NODE} has 0"


def test_check_maps_reports_unhealthy_devices() -> None:
    sick = node(gpu(0), gpu(1), gpu(2), gpu(3, reason="XID 79 (GPU has fallen off the bus)"))
    results = check_maps(sick, [parsed(3)])
    assert [(c.index, c.ok, c.reason) for c in results] == [
        (0, True, ""),
        (1, False, DEVICE_UNHEALTHY),
        (2, True, ""),
    ]
