"""A map rebuilt from the stored model (placement/restore.py) declares what the model served,
including MIG requests, spares, tolerations and `sameClique`, so that a controller that starts
with an invalid source map keeps serving all of it."""

from __future__ import annotations

from placement.compile import Compiler
from placement.inventory import GpuDevice, MigInstance, NodeInventory
from placement.maps import DeclaredSlot, MigRequest, PlacementMap
from placement.model import decode_model, encode_model
from placement.restore import declared_map
from placement.taints import Toleration, TolerationOperator
from placement.types import GpuUuid, MapKey, NodeName

NODE = NodeName("gpu-1")
KEY = MapKey("team", "llm")


def uuid(i: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{i:012x}")


def inventory() -> NodeInventory:
    mig = MigInstance("MIG-00000001-0000-4000-8000-000000000001", "3g.40gb", 0, 0, 4, 40960)
    return NodeInventory(
        NODE,
        (
            GpuDevice(
                0, uuid(0), "NVIDIA H100 80GB HBM3", 81559, mig_mode=True, mig_instances=(mig,)
            ),
            GpuDevice(1, uuid(1), "NVIDIA H100 80GB HBM3", 81559),
            GpuDevice(2, uuid(2), "NVIDIA H100 80GB HBM3", 81559),
            GpuDevice(3, uuid(3), "NVIDIA H100 80GB HBM3", 81559),
        ),
    )


def the_map() -> PlacementMap:
    xid = Toleration(key="gpu.nvidia.com/xid", operator=TolerationOperator.EXISTS)
    return PlacementMap(
        key=KEY,
        slots=(
            DeclaredSlot(0, NODE, mig=MigRequest(0, "3g.40gb"), tolerations=(xid,)),
            DeclaredSlot(1, NODE, (1,), fallback=(3,)),
            DeclaredSlot(2, NODE, count=1),
        ),
        same_clique=True,
    )


def test_the_rebuilt_map_declares_mig_spares_tolerations_and_same_clique() -> None:
    compiler = Compiler()
    compiler.set_node(NODE, {"nvidia.com/gpu.clique": "a"})
    compiler.set_inventory(inventory())
    compiler.set_map(the_map())
    model, _ = compiler.build()
    stored = decode_model(encode_model(model))
    rebuilt = declared_map(stored.maps[KEY])
    original = the_map()
    assert rebuilt.same_clique is True
    for index in (0, 1, 2):
        got, want = rebuilt.by_index[index], original.by_index[index]
        assert (got.node, got.devices, got.count, got.mig, got.fallback, got.tolerations) == (
            want.node,
            want.devices,
            want.count,
            want.mig,
            want.fallback,
            want.tolerations,
        )


def test_the_rebuilt_map_compiles_to_what_was_served() -> None:
    first = Compiler()
    first.set_node(NODE, {"nvidia.com/gpu.clique": "a"})
    first.set_inventory(inventory())
    first.set_map(the_map())
    model, _ = first.build()
    stored = decode_model(encode_model(model))
    again = Compiler(previous=stored)
    again.set_node(NODE, {"nvidia.com/gpu.clique": "a"})
    again.set_inventory(inventory())
    again.set_map(declared_map(stored.maps[KEY]))
    rebuilt, _ = again.build()
    assert {i: s.devices for i, s in rebuilt.maps[KEY].slots.items()} == {
        i: s.devices for i, s in model.maps[KEY].slots.items()
    }
