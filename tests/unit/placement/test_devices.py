"""How slots name GPUs: declared devices keep their fields; held GPUs are UUIDs or NVML indices."""

from __future__ import annotations

import pytest

from placement.devices import UNDECLARED, DeclaredDevices, GpuId, gpu_ids
from placement.inventory import GpuDevice, device_problems
from placement.maps import Requirement
from placement.reasons import Reason
from placement.types import GpuUuid

UUID = GpuUuid("GPU-5c1d0c3e-0000-4000-8000-000000000001")


@pytest.mark.parametrize(
    ("declared", "text"),
    [
        (DeclaredDevices((0, 1)), "0,1"),
        (DeclaredDevices((UUID,)), UUID),
        (DeclaredDevices((3, UUID)), f"3,{UUID}"),
        (DeclaredDevices(count=2), "count=2"),
        (UNDECLARED, ""),
    ],
)
def test_declared_devices_render_and_parse_back(declared: DeclaredDevices, text: str) -> None:
    assert str(declared) == text
    assert DeclaredDevices.parse(text) == declared


def test_parse_reads_what_earlier_versions_wrote_leniently() -> None:
    assert DeclaredDevices.parse(" 0 , 1 ,") == DeclaredDevices((0, 1))
    assert DeclaredDevices.parse("count=x") == UNDECLARED


def test_a_gpu_is_held_by_uuid_or_by_nvml_index() -> None:
    assert GpuId.of_uuid(UUID) == UUID and GpuId.of_uuid(UUID).nvml_index is None
    assert GpuId.of_index(3) == "#3" and GpuId.of_index(3).nvml_index == 3
    assert (GpuId.of(2), GpuId.of(UUID)) == (GpuId.of_index(2), GpuId.of_uuid(UUID))
    assert GpuId("#7").nvml_index == 7


def test_a_slot_holds_its_uuids_once_known_else_its_indices() -> None:
    assert gpu_ids((UUID,), (0,)) == (UUID,)
    assert gpu_ids((), (0, 2)) == ("#0", "#2")
    assert all(isinstance(g, GpuId) for g in gpu_ids((), (1,)))


# -- the one device check ----------------------------------------------------------------------
H100 = GpuDevice(0, UUID, "NVIDIA H100 80GB HBM3", 81559)
SICK = GpuDevice(0, UUID, "NVIDIA A100", 40960, healthy=False, health_reason="XID 79")
WANT_H100 = Requirement(product="NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize(
    ("device", "require", "problems"),
    [
        (H100, None, []),
        (H100, WANT_H100, []),
        (H100, Requirement(min_memory_mib=90000), [Reason.REQUIREMENT_MISMATCH]),
        (SICK, None, [Reason.DEVICE_UNHEALTHY]),
        (SICK, WANT_H100, [Reason.DEVICE_UNHEALTHY, Reason.REQUIREMENT_MISMATCH]),
    ],
)
def test_a_present_device_is_checked_for_health_then_requirement(
    device: GpuDevice, require: Requirement | None, problems: list[Reason]
) -> None:
    found = device_problems(device, require, "0")
    assert [reason for reason, _ in found] == problems
    assert all(message.startswith("device 0 ") for _, message in found)


def test_an_unhealthy_device_without_a_reason_says_unknown() -> None:
    device = GpuDevice(1, UUID, healthy=False)
    assert device_problems(device, None, "1") == [
        (Reason.DEVICE_UNHEALTHY, "device 1 is unhealthy: unknown")
    ]
