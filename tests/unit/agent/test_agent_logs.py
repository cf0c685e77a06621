"""What the agent logs when a node's GPUs change: every GPU named by its UUID, not by its index."""

from __future__ import annotations

import logging

import pytest

from agent.runner import log_health_changes
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, NodeName


def _uuid(n: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{n:012x}")


def _inventory(*devices: tuple[int, int, bool]) -> NodeInventory:
    """(NVML index, UUID number, healthy) per GPU."""
    return NodeInventory(
        NodeName("gpu-node-1"),
        tuple(
            GpuDevice(index, _uuid(n), healthy=ok, health_reason="" if ok else "Xid 79")
            for index, n, ok in devices
        ),
    )


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agent.runner"]


def test_removing_gpu_0_logs_gpu_0_gone_and_the_others_renumbered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _inventory((0, 0, True), (1, 1, True), (2, 2, True), (3, 3, True))
    # NVML numbers the three that are left 0..2.
    after = _inventory((0, 1, True), (1, 2, True), (2, 3, True))
    with caplog.at_level(logging.INFO, logger="agent.runner"):
        log_health_changes(before, after)
    messages = _messages(caplog)
    assert f"GPU 0 ({_uuid(0)}) disappeared" in messages
    assert not any("GPU 3" in m and "disappeared" in m for m in messages)
    assert f"GPU {_uuid(3)} is now index 2 (was 3)" in messages
    assert not any("appeared" in m and "disappeared" not in m for m in messages)


def test_health_changes_are_logged_for_the_same_gpu_after_renumbering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _inventory((0, 0, True), (1, 1, True), (2, 2, False))
    after = _inventory((0, 1, False), (1, 2, True), (2, 9, True))
    with caplog.at_level(logging.INFO, logger="agent.runner"):
        log_health_changes(before, after)
    messages = _messages(caplog)
    assert f"GPU 0 ({_uuid(1)}) turned unhealthy: Xid 79" in messages
    assert f"GPU 1 ({_uuid(2)}) is healthy again" in messages
    assert f"GPU 2 ({_uuid(9)}) appeared" in messages
    assert f"GPU 0 ({_uuid(0)}) disappeared" in messages


def test_first_probe_counts_gpus_and_names_the_unhealthy_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="agent.runner"):
        log_health_changes(None, _inventory((0, 0, True), (1, 1, False)))
    assert _messages(caplog) == [
        "node gpu-node-1: 2 GPUs, 1 unhealthy",
        f"GPU 1 ({_uuid(1)}) is unhealthy: Xid 79",
    ]
