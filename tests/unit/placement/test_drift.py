"""Drift of a bound pod against its map's current slot, and the map rebuilt from the model."""

from __future__ import annotations

from placement.compile import Compiler
from placement.drift import BoundSlot, DriftKind, drift_of
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Rollout
from placement.model import Model, Provenance, decode_map, encode_map
from placement.restore import declared_map
from placement.types import GpuUuid, Indexing, MapKey, NodeName, RolloutStrategy, SlotKey

KEY = MapKey("ml", "llm")


def uuid(node: str, index: int) -> str:
    return f"GPU-{int(node[-1]):08x}-0000-0000-0000-{index:012x}"


def inventory(node: str, n: int = 4) -> NodeInventory:
    return NodeInventory(
        NodeName(node),
        tuple(
            GpuDevice(i, GpuUuid(uuid(node, i)), "H100", 81559, f"0000:{i:02x}:00.0")
            for i in range(n)
        ),
    )


def compile_map(
    slots: list[DeclaredSlot],
    inventories: bool = True,
    provenance: Provenance | None = None,
    **kw: object,
) -> Model:
    compiler = Compiler()
    for node in ("gpu-1", "gpu-2"):
        compiler.set_node(NodeName(node), {})
        if inventories:
            compiler.set_inventory(inventory(node))
    compiler.set_map(PlacementMap(KEY, tuple(slots), **kw), "v", provenance)  # type: ignore[arg-type]
    model, _ = compiler.build()
    return model


def bound(index: int, node: str, *devices: int, revision: str = "r1") -> BoundSlot:
    gpus = tuple(uuid(node, d) for d in devices)
    return BoundSlot(SlotKey(KEY, index), NodeName(node), gpus, revision)


def test_a_pod_where_its_map_puts_it_has_not_drifted() -> None:
    model = compile_map([DeclaredSlot(0, "gpu-1", (0, 1))])
    assert drift_of(bound(0, "gpu-1", 1, 0), model) is None


def test_a_moved_node_or_other_devices_is_slot_moved_with_old_and_new() -> None:
    model = compile_map([DeclaredSlot(0, "gpu-2", (2,))], provenance=Provenance("r2", "m.yaml"))
    drift = drift_of(bound(0, "gpu-1", 0), model)
    assert drift is not None and drift.kind is DriftKind.SLOT_MOVED and drift.movable
    assert drift.old_placement() == f"node gpu-1 GPUs {uuid('gpu-1', 0)}"
    assert drift.new_placement() == f"node gpu-2 GPUs {uuid('gpu-2', 2)}"
    message = drift.message()
    assert "bound by revision r1" in message and "at revision r2 (m.yaml)" in message
    same_node = compile_map([DeclaredSlot(0, "gpu-1", (3,))])
    drift = drift_of(bound(0, "gpu-1", 0), same_node)
    assert drift is not None and drift.now_gpus == (uuid("gpu-1", 3),)


def test_removed_index_and_deleted_map() -> None:
    model = compile_map([DeclaredSlot(1, "gpu-1", (0,))])
    drift = drift_of(bound(0, "gpu-1", 0), model)
    assert drift is not None and drift.kind is DriftKind.SLOT_REMOVED and not drift.movable
    drift = drift_of(bound(0, "gpu-1", 0), Model())
    assert drift is not None and drift.kind is DriftKind.MAP_DELETED
    assert "was deleted" in drift.message()


def test_an_unresolved_slot_counts_only_a_change_of_node() -> None:
    # No inventory: the compiled slot knows indices, not UUIDs; a UUID binding cannot be told
    # apart from it, so only a node change is drift.
    model = compile_map([DeclaredSlot(0, "gpu-1", (0,))], inventories=False)
    assert drift_of(bound(0, "gpu-1", 0), model) is None
    assert drift_of(bound(0, "gpu-2", 0), model) is not None
    by_index = BoundSlot(SlotKey(KEY, 0), NodeName("gpu-1"), ("#1",))
    drift = drift_of(by_index, model)
    assert drift is not None and drift.now_gpus == ("#0",)


def test_the_map_rebuilt_from_the_model_compiles_to_the_same_content() -> None:
    slots = [
        DeclaredSlot(0, "gpu-1", (0, 1)),
        DeclaredSlot(1, "gpu-2", (GpuUuid(uuid("gpu-2", 3)),)),
        DeclaredSlot(2, "gpu-2", count=2),
    ]
    rollout = Rollout(RolloutStrategy.EVICT, 2)
    model = compile_map(
        slots, indexing=Indexing.ALLOCATE, rollout=rollout, provenance=Provenance("r1", "f")
    )
    cmap = model.maps[KEY]
    rebuilt = declared_map(cmap)
    assert rebuilt.rollout == rollout and rebuilt.indexing is Indexing.ALLOCATE
    compiler = Compiler(previous=model)
    for node in ("gpu-1", "gpu-2"):
        compiler.set_node(NodeName(node), {})
        compiler.set_inventory(inventory(node))
    compiler.set_map(rebuilt, cmap.source_version, cmap.provenance)
    again, _ = compiler.build()
    assert again.maps[KEY].content_equal(cmap)


def test_rollout_and_provenance_survive_the_model_codec() -> None:
    model = compile_map(
        [DeclaredSlot(0, "gpu-1", (0,))],
        rollout=Rollout(RolloutStrategy.EVICT, 3),
        provenance=Provenance("abc", "clusters/dev/maps/llm.yaml"),
    )
    cmap = model.maps[KEY]
    decoded = decode_map(KEY, encode_map(cmap))
    assert decoded.rollout == Rollout(RolloutStrategy.EVICT, 3)
    assert decoded.provenance == Provenance("abc", "clusters/dev/maps/llm.yaml")
    plain = compile_map([DeclaredSlot(0, "gpu-1", (0,))]).maps[KEY]
    assert "rollout" not in encode_map(plain) and "revision" not in encode_map(plain)
