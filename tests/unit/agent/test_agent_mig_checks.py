"""The agent's checks of slots that name MIG devices (pure): they exist when their GPU lists
them, and they are as healthy as that GPU."""

from __future__ import annotations

import dataclasses

from agent.checks import check_slot
from placement.devices import DeclaredDevices
from placement.inventory import DeviceCheck, GpuDevice, MigInstance, NodeInventory
from placement.maps import DeclaredSlot, Requirement
from placement.model import CompiledSlot
from placement.reasons import Reason
from placement.types import GpuUuid, MapKey, NodeName

NODE = NodeName("gpu-a-01")
KEY = MapKey("inference", "llm")
H100 = "NVIDIA H100 80GB HBM3"
PARENT = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00")
PLAIN = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e01")
BIG = GpuUuid("MIG-4f1b6c2a-8d3e-5a7b-9c0d-1e2f3a4b5c60")
SMALL = GpuUuid("MIG-4f1b6c2a-8d3e-5a7b-9c0d-1e2f3a4b5c62")
GONE = GpuUuid("MIG-4f1b6c2a-8d3e-5a7b-9c0d-1e2f3a4b5c6f")

MIG_GPU = GpuDevice(
    0,
    PARENT,
    H100,
    81559,
    "00000000:18:00.0",
    mig_mode=True,
    mig_instances=(
        MigInstance(BIG, "3g.40gb", 0, 0, 4, 40320),
        MigInstance(SMALL, "1g.10gb", 2, 6, 1, 9856),
    ),
)
WHOLE_GPU = GpuDevice(1, PLAIN, H100, 81559, "00000000:2A:00.0")


def node(*devices: GpuDevice) -> NodeInventory:
    return NodeInventory(NODE, devices, "550.54.15", "12.4")


def mig_slot(uuid: GpuUuid, index: int = 0) -> CompiledSlot:
    return CompiledSlot(index, NODE, (uuid,), (0,), DeclaredDevices((uuid,)))


def check(
    inventory: NodeInventory, slot: CompiledSlot, decl: DeclaredSlot | None = None
) -> DeviceCheck:
    return check_slot(inventory, KEY, slot, decl)


def test_present_mig_device_on_a_healthy_gpu_passes() -> None:
    result = check(node(MIG_GPU, WHOLE_GPU), mig_slot(BIG))
    assert result.ok, result
    assert result.message == (
        f"device {BIG} (3g.40gb on GPU 0 ({PARENT})) present and healthy on node {NODE}"
    )


def test_mig_device_no_gpu_lists_is_missing() -> None:
    result = check(node(MIG_GPU), mig_slot(GONE))
    assert (result.ok, result.reason) == (False, Reason.DEVICE_MISSING)
    assert result.message == (
        f"MIG device {GONE} not found on node {NODE} (2 MIG devices, none with this UUID)"
    )


def test_mig_device_on_a_node_without_mig_is_missing() -> None:
    result = check(node(WHOLE_GPU), mig_slot(BIG))
    assert (result.ok, result.reason) == (False, Reason.DEVICE_MISSING)
    assert "no GPU of it has MIG devices" in result.message


def test_mig_device_of_an_unhealthy_gpu_is_unhealthy() -> None:
    sick = dataclasses.replace(MIG_GPU, healthy=False, health_reason="XID 79")
    result = check(node(sick), mig_slot(SMALL))
    assert (result.ok, result.reason) == (False, Reason.DEVICE_UNHEALTHY)
    assert result.message == f"device {SMALL} (1g.10gb on GPU 0 ({PARENT})) is unhealthy: XID 79"


def test_mig_device_of_a_gpu_out_of_mig_mode_is_missing() -> None:
    off = dataclasses.replace(MIG_GPU, mig_mode=False)
    result = check(node(off), mig_slot(BIG))
    assert (result.ok, result.reason) == (False, Reason.DEVICE_MISSING)
    assert result.message.endswith("GPU 0 is not in MIG mode")


def test_mig_device_maybe_on_an_unidentified_gpu_is_unhealthy() -> None:
    lost = GpuDevice(0, GpuUuid(""), healthy=False, health_reason="GPU is lost")
    result = check(node(lost), mig_slot(BIG))
    assert (result.ok, result.reason) == (False, Reason.DEVICE_UNHEALTHY)
    assert "GPU 0 cannot be identified (GPU is lost) and may hold it" in result.message


def test_model_index_is_not_compared_for_mig_devices() -> None:
    # The env value of a MIG slot is its UUID: whatever index the model kept cannot misdirect.
    slot = CompiledSlot(0, NODE, (BIG,), (5,), DeclaredDevices((BIG,)))
    assert check(node(MIG_GPU), slot).ok


def test_memory_requirement_is_the_mig_devices_memory() -> None:
    decl = DeclaredSlot(0, NODE, (BIG,), require=Requirement(H100, min_memory_mib=20000))
    assert check(node(MIG_GPU), mig_slot(BIG), decl).ok
    small = check(node(MIG_GPU), mig_slot(SMALL), decl)
    assert (small.ok, small.reason) == (False, Reason.REQUIREMENT_MISMATCH)
    assert f"({H100}, 9856 MiB) does not match" in small.message


def test_product_requirement_is_the_parent_gpus_product() -> None:
    decl = DeclaredSlot(0, NODE, (BIG,), require=Requirement("NVIDIA H200"))
    result = check(node(MIG_GPU), mig_slot(BIG), decl)
    assert (result.ok, result.reason) == (False, Reason.REQUIREMENT_MISMATCH)


def test_slot_the_compiler_left_empty_checks_a_declared_mig_uuid() -> None:
    slot = CompiledSlot(0, NODE, declared=DeclaredDevices((GONE,)))
    result = check(node(MIG_GPU), slot)
    assert (result.ok, result.reason) == (False, Reason.DEVICE_MISSING)


def test_mig_and_whole_gpu_problems_are_reported_together() -> None:
    slot = CompiledSlot(0, NODE, (BIG, PLAIN), (0, 1), DeclaredDevices((BIG, PLAIN)))
    sick = dataclasses.replace(WHOLE_GPU, healthy=False, health_reason="XID 48")
    result = check(node(dataclasses.replace(MIG_GPU, mig_mode=False), sick), slot)
    assert result.reason == Reason.DEVICE_MISSING  # the more severe of the two
    assert "not in MIG mode" in result.message and "XID 48" in result.message
