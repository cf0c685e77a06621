"""Renumbering: which bound pods' NVML indices now name other GPUs than they were bound to."""

from __future__ import annotations

import dataclasses

from controller.renumber import bound_indices, renumbering
from kubeio.events import ObjectRef
from placement.annotations import BindingDecision
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, MapKey, NodeName

REF = ObjectRef("Pod", "ml", "web-0", "u1")
NODE = NodeName("gpu-1")


def inventory(order: dict[int, int] | None = None) -> NodeInventory:
    swap = order or {}
    return NodeInventory(
        NODE,
        tuple(
            GpuDevice(swap.get(i, i), GpuUuid(f"GPU-{i}"), "H100", 80000, f"0000:{i:02d}:00.0")
            for i in range(4)
        ),
    )


def decision(cvd: str, *uuids: str) -> BindingDecision:
    return BindingDecision(MapKey("ml", "web"), 0, NODE, tuple(GpuUuid(u) for u in uuids), cvd, 1)


def test_only_index_bindings_are_watched() -> None:
    assert bound_indices(REF, NODE, decision("GPU-1", "GPU-1")) is None  # envMode uuid
    assert bound_indices(REF, NODE, decision("1,2", "GPU-1")) is None  # does not line up
    watched = bound_indices(REF, NODE, decision("1,2", "GPU-1", "GPU-2"))
    assert watched is not None and watched.indices == (1, 2)


def test_renumbered_gpus_are_named_both_ways() -> None:
    watched = bound_indices(REF, NODE, decision("1,2", "GPU-1", "GPU-2"))
    assert watched is not None
    assert renumbering(watched, inventory()) is None
    message = renumbering(watched, inventory({1: 3, 3: 1}))
    assert message is not None
    assert "index 1 was GPU-1 (now index 3) and now names GPU-3" in message
    assert "index 2" not in message
    # A GPU that is gone is DeviceMissing's business, not a renumbering.
    gone = inventory()
    gone = dataclasses.replace(gone, devices=gone.devices[:1] + gone.devices[2:])
    assert renumbering(watched, gone) is None
