"""A map may name a GPU by its PCI bus ID (its physical slot): validation reads it in either domain
width and case, the compiler resolves it to the GPU in that slot whatever its NVML index, and the
agent's check finds it."""

from __future__ import annotations

import textwrap

import pytest

from agent.checks import check_node
from placement.compile import Compiler
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, MapKey, NodeName, pci_bus_id
from placement.validate import parse_map

NODE = NodeName("gpu-1")


def uuid(i: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{i:012x}")


def inventory(order: tuple[int, ...] = (0, 1)) -> NodeInventory:
    """GPUs in slots 18 and 3B; `order` gives the NVML index of each (renumbered when reversed)."""
    slots = ("00000000:18:00.0", "00000000:3B:00.0")
    return NodeInventory(
        NODE,
        tuple(
            GpuDevice(index, uuid(i), "NVIDIA H100 80GB HBM3", 81559, slots[i])
            for i, index in enumerate(order)
        ),
    )


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("0000:3b:00.0", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        (" 0000:18:00.1", "00000000:18:00.1"),
        ("0000:18:00.8", None),
        ("18:00.0", None),
        ("GPU-00000001-0000-4000-8000-000000000000", None),
    ],
)
def test_pci_bus_ids_are_read_in_one_form(text: str, read: str | None) -> None:
    assert pci_bus_id(text) == read


def pci_map() -> str:
    return textwrap.dedent("""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementMap
        metadata: {name: llm, namespace: ml}
        spec:
          placements:
            - {index: 0, node: gpu-1, devices: ["0000:3b:00.0"]}
    """)


def test_a_slot_named_by_pci_bus_id_follows_the_gpu_in_that_slot() -> None:
    pmap = parse_map(pci_map(), "m.yaml")
    for order, index in (((0, 1), 1), ((1, 0), 0)):  # NVML renumbered the GPUs: the slot stays
        compiler = Compiler()
        compiler.set_node(NODE, {})
        compiler.set_inventory(inventory(order))
        compiler.set_map(pmap)
        model, _ = compiler.build()
        slot = model.maps[MapKey("ml", "llm")].slots[0]
        assert (slot.devices, slot.device_indices, slot.blocked) == ((uuid(1),), (index,), "")
        (check,) = check_node(inventory(order), model.maps.values(), {pmap.key: pmap})
        assert check.ok, check.message


def test_a_pci_bus_id_no_gpu_sits_in_is_missing() -> None:
    pmap = parse_map(pci_map().replace("3b:00.0", "5e:00.0"), "m.yaml")
    compiler = Compiler()
    compiler.set_node(NODE, {})
    compiler.set_inventory(inventory())
    compiler.set_map(pmap)
    model, _ = compiler.build()
    slot = model.maps[MapKey("ml", "llm")].slots[0]
    assert slot.blocked == "DeviceMissing" and "00000000:5E:00.0 not found" in slot.message
