"""The compiler: node aliases, index <-> UUID resolution, `count` picks (deterministic, topology
aware, persistent), conflicts between maps, shared maps, and the model's ConfigMap sharding."""

from __future__ import annotations

import json

import pytest

from placement.compile import Compiler
from placement.devices import DeclaredDevices
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import (
    MANIFEST_NAME,
    MAX_SHARD_BYTES,
    SHARD_KEY,
    CompiledMap,
    CompiledSlot,
    Model,
    decode_model,
    encode_model,
)
from placement.reasons import Reason
from placement.slotdevices import select_devices
from placement.status import Phase
from placement.types import DeviceRef, GpuUuid, MapKey, NodeName, Sharing

H100 = "NVIDIA H100 80GB HBM3"

CONFLICT, DEVICE_MISSING, INSUFFICIENT = (
    Reason.SLOT_CONFLICT,
    Reason.DEVICE_MISSING,
    Reason.INSUFFICIENT_DEVICES,
)


def uuid(node: int, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{node:08x}-0000-4000-8000-{index:012x}")


def inventory(
    node: int,
    gpus: int = 8,
    *,
    unhealthy: tuple[int, ...] = (),
    product: str = H100,
    memory: int = 81559,
) -> NodeInventory:
    """Node `gpu-<node>`: GPUs 0..3 on NUMA node 0, 4..7 on NUMA node 1, PCI order = index."""
    return NodeInventory(
        NodeName(f"gpu-{node}"),
        tuple(
            GpuDevice(
                index=i,
                uuid=uuid(node, i),
                name=product,
                memory_mib=memory,
                pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                healthy=i not in unhealthy,
                health_reason="XID 79" if i in unhealthy else "",
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
    )


def pmap(
    name: str, *slots: DeclaredSlot, sharing: Sharing = Sharing.EXCLUSIVE, namespace: str = "ml"
) -> PlacementMap:
    return PlacementMap(MapKey(namespace, name), tuple(slots), sharing)


def devices(node: str, *refs: DeviceRef, index: int = 0) -> DeclaredSlot:
    return DeclaredSlot(index, node, tuple(refs))


def count(node: str, n: int, index: int = 0, require: Requirement | None = None) -> DeclaredSlot:
    return DeclaredSlot(index, node, count=n, require=require)


def cluster(*nodes: int, alias: dict[int, str] | None = None) -> Compiler:
    compiler = Compiler()
    for n in nodes:
        labels = {"gpu-node-name": alias[n]} if alias and n in alias else {}
        compiler.set_node(NodeName(f"gpu-{n}"), labels)
        compiler.set_inventory(inventory(n))
    return compiler


def slot(model: Model, name: str, index: int = 0, namespace: str = "ml") -> CompiledSlot:
    found = model.slot(MapKey(namespace, name), index)
    assert found is not None
    return found


# -- node names and aliases -------------------------------------------------------------------
def test_a_logical_name_resolves_through_the_alias_label() -> None:
    compiler = cluster(1, 2, alias={2: "node2"})
    compiler.set_map(pmap("legacy", devices("node2", 2)))
    model, reports = compiler.build()
    assert slot(model, "legacy") == CompiledSlot(
        0, NodeName("gpu-2"), (uuid(2, 2),), (2,), DeclaredDevices((2,))
    )
    assert reports[MapKey("ml", "legacy")].phase is Phase.VALID


def test_relabelling_a_node_recompiles_the_maps_that_name_it() -> None:
    compiler = cluster(1, 2, alias={1: "node1"})
    compiler.set_map(pmap("legacy", devices("node1", 0)))
    compiler.build()
    compiler.set_node(NodeName("gpu-1"), {})
    compiler.set_node(NodeName("gpu-2"), {"gpu-node-name": "node1"})
    model, _ = compiler.build()
    assert slot(model, "legacy").node == "gpu-2"
    assert slot(model, "legacy").devices == (uuid(2, 0),)


def test_an_ambiguous_or_unknown_name_is_reported() -> None:
    compiler = cluster(1, 2, alias={1: "twin", 2: "twin"})
    compiler.set_map(pmap("a", devices("twin", 0), devices("nowhere", 0, index=1)))
    _, reports = compiler.build()
    report = reports[MapKey("ml", "a")]
    assert report.phase is Phase.DEGRADED
    assert report.problems == (
        "index 0: node 'twin' is ambiguous: label gpu-node-name=twin is on gpu-1, gpu-2",
        "index 1: node 'nowhere' not found",
    )


# -- device resolution ------------------------------------------------------------------------
def test_indices_resolve_to_uuids_and_uuids_to_indices() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("a", devices("gpu-1", 1, 0), devices("gpu-1", uuid(1, 5), index=1)))
    model, _ = compiler.build()
    assert slot(model, "a", 0).devices == (uuid(1, 1), uuid(1, 0))
    assert slot(model, "a", 0).device_indices == (1, 0)
    assert slot(model, "a", 1).device_indices == (5,)
    assert slot(model, "a", 0).resolved


def test_without_an_inventory_the_declared_form_is_kept_until_one_arrives() -> None:
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-1"), {})
    compiler.set_map(pmap("a", devices("gpu-1", 3)))
    model, _ = compiler.build()
    assert (slot(model, "a").devices, slot(model, "a").device_indices) == ((), (3,))
    compiler.set_inventory(inventory(1))
    model, _ = compiler.build()
    assert slot(model, "a").devices == (uuid(1, 3),)


def test_a_missing_device_blocks_its_slot() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("a", devices("gpu-1", 9)))
    model, reports = compiler.build()
    assert slot(model, "a").blocked == DEVICE_MISSING
    assert slot(model, "a").message == "index 0 on node gpu-1: device 9 not found (node has 8 GPUs)"
    assert reports[MapKey("ml", "a")].served == 0


# -- count --------------------------------------------------------------------------------------
def test_count_prefers_the_fullest_numa_node_that_fits_and_adjacent_gpus() -> None:
    compiler = cluster(1)
    # Another map holds GPUs 0, 1 (NUMA 0) and 4 (NUMA 1): NUMA 0 has 2 free, NUMA 1 has 3.
    compiler.set_map(pmap("held", devices("gpu-1", 0, 1), devices("gpu-1", 4, index=1)))
    compiler.set_map(pmap("two", count("gpu-1", 2)))
    compiler.set_map(pmap("three", count("gpu-1", 3)))
    model, _ = compiler.build()
    # Key order compiles "three" first: only NUMA 1 fits 3; then "two" fits NUMA 0 exactly.
    assert slot(model, "three").device_indices == (5, 6, 7)
    assert slot(model, "two").device_indices == (2, 3)


def test_select_devices_spans_numa_nodes_only_when_no_one_fits() -> None:
    pool = [d for d in inventory(1).devices if d.index in (2, 3, 5, 6)]
    picked = select_devices(pool, 3)
    assert picked is not None
    assert [d.index for d in picked] == [2, 3, 5]
    assert select_devices(pool, 5) is None


def test_count_is_deterministic_whatever_the_order_of_events() -> None:
    def run(order: list[str]) -> Model:
        compiler = cluster(1, 2)
        maps = {
            "a": pmap("a", count("gpu-1", 2), count("gpu-2", 3, index=1)),
            "b": pmap("b", count("gpu-1", 2)),
            "c": pmap("c", devices("gpu-1", 0)),
        }
        for name in order:
            compiler.set_map(maps[name])
        return compiler.build()[0]

    first = run(["a", "b", "c"])
    again = run(["c", "b", "a"])
    assert {k: m.slots for k, m in first.maps.items()} == {
        k: m.slots for k, m in again.maps.items()
    }


def test_count_picks_around_explicit_claims_of_maps_compiled_after_it() -> None:
    compiler = cluster(1)
    # "a" sorts first, but "z" names GPUs 0..3 explicitly: "a" must not take them.
    compiler.set_map(pmap("a", count("gpu-1", 4)))
    compiler.set_map(pmap("z", devices("gpu-1", 0, 1, 2, 3)))
    model, reports = compiler.build()
    assert slot(model, "a").device_indices == (4, 5, 6, 7)
    assert all(r.phase is Phase.VALID for r in reports.values())


@pytest.mark.parametrize("named", [0, "uuid"], ids=["by index", "by UUID"])
def test_a_count_pick_yields_to_a_map_that_names_its_gpu_later(named: int | str) -> None:
    # Maps synced one by one (ArgoCD applies them in turn): the count entry is compiled first.
    compiler = cluster(1)
    compiler.set_map(pmap("a", count("gpu-1", 2)))
    model, _ = compiler.build()
    assert slot(model, "a").device_indices == (0, 1)
    ref: DeviceRef = 0 if named == 0 else uuid(1, 0)
    compiler.set_map(pmap("z", devices("gpu-1", ref)))
    model, reports = compiler.build()
    assert slot(model, "z").device_indices == (0,)
    assert 0 not in slot(model, "a").device_indices
    assert len(slot(model, "a").device_indices) == 2
    assert [r.phase for r in reports.values()] == [Phase.VALID, Phase.VALID]


def test_a_count_pick_yields_only_to_names_not_to_other_picks() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("b", count("gpu-1", 4)))
    model, _ = compiler.build()
    kept = slot(model, "b").device_indices
    # Another pick of the same size goes around "b"; naming b's GPUs 4.. would not move it.
    compiler.set_map(pmap("a", count("gpu-1", 4)))
    compiler.set_map(pmap("z", devices("gpu-1", 7, index=0)))
    model, reports = compiler.build()
    assert slot(model, "b").device_indices == kept
    assert slot(model, "z").device_indices == (7,)
    assert slot(model, "a").blocked == INSUFFICIENT  # 3 GPUs left for 4
    assert reports[MapKey("ml", "b")].phase is Phase.VALID


def test_count_honours_require_and_health() -> None:
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-1"), {})
    compiler.set_inventory(inventory(1, unhealthy=(0, 1)))
    compiler.set_map(pmap("a", count("gpu-1", 2, require=Requirement(H100, 80_000))))
    compiler.set_map(pmap("b", count("gpu-1", 1, require=Requirement("NVIDIA A100"))))
    model, reports = compiler.build()
    assert slot(model, "a").device_indices == (2, 3)
    assert slot(model, "b").blocked == INSUFFICIENT
    assert reports[MapKey("ml", "b")].problems == (
        "index 0 on node gpu-1: needs 1 free healthy devices (product 'NVIDIA A100'), 0 available",
    )


def test_count_keeps_its_devices_across_rebuilds() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("b", count("gpu-1", 2)))
    model, _ = compiler.build()
    assert slot(model, "b").device_indices == (0, 1)
    # "a" sorts before "b": compiled fresh together, it would take GPUs 0 and 1.
    compiler.set_map(pmap("a", count("gpu-1", 2)))
    compiler.set_map(pmap("b", count("gpu-1", 2)))  # a new version of the source, same content
    model, _ = compiler.build()
    assert slot(model, "b").device_indices == (0, 1)
    assert slot(model, "a").device_indices == (2, 3)


def test_count_choices_survive_a_restart_seeded_with_the_served_model() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("b", count("gpu-1", 2)))
    compiler.build()
    compiler.set_map(pmap("a", count("gpu-1", 2)))
    served, _ = compiler.build()

    restarted = Compiler(previous=decode_model(encode_model(served)))
    restarted.set_node(NodeName("gpu-1"), {})
    restarted.set_inventory(inventory(1))
    restarted.set_map(pmap("a", count("gpu-1", 2)))
    restarted.set_map(pmap("b", count("gpu-1", 2)))
    model, _ = restarted.build()
    assert {k: m.slots for k, m in model.maps.items()} == {
        k: m.slots for k, m in served.maps.items()
    }
    assert model.generation == served.generation  # nothing changed


def test_a_count_choice_moves_when_its_gpu_turns_unhealthy() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("a", count("gpu-1", 1)))
    model, _ = compiler.build()
    assert slot(model, "a").device_indices == (0,)
    compiler.set_inventory(inventory(1, unhealthy=(0,)))
    model, _ = compiler.build()
    assert slot(model, "a").device_indices == (1,)


def test_maps_of_a_restart_that_are_not_set_again_are_dropped() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("gone", devices("gpu-1", 0)))
    served, _ = compiler.build()
    restarted = Compiler(previous=served)
    model, _ = restarted.build()
    assert not model.maps
    assert model.generation == served.generation + 1


# -- conflicts ----------------------------------------------------------------------------------
def test_conflicting_exclusive_maps_name_each_other_and_the_incumbent_keeps_the_gpu() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("first", devices("gpu-1", 0)))
    compiler.build()
    compiler.set_map(pmap("second", devices("gpu-1", 0), namespace="other"))
    model, reports = compiler.build()

    assert slot(model, "first").blocked == ""
    late = slot(model, "second", namespace="other")
    assert late.blocked == CONFLICT
    assert late.message == "GPU 0 on node gpu-1 is also claimed by ml/first[0]"
    first, second = reports[MapKey("ml", "first")], reports[MapKey("other", "second")]
    assert (first.phase, second.phase) == (Phase.CONFLICT, Phase.CONFLICT)
    assert first.conflicts_with == (MapKey("other", "second"),)
    assert second.conflicts_with == (MapKey("ml", "first"),)
    assert first.message == "index 0 conflicts with other/second[0]"
    assert (first.served, second.served) == (1, 0)

    compiler.remove_map(MapKey("other", "second"))
    model, reports = compiler.build()
    assert reports[MapKey("ml", "first")].phase is Phase.VALID
    assert MapKey("other", "second") not in model.maps


def test_maps_arriving_together_with_a_conflict_both_wait() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("a", devices("gpu-1", 0)))
    compiler.set_map(pmap("b", devices("gpu-1", 0)))
    model, _ = compiler.build()
    assert (slot(model, "a").blocked, slot(model, "b").blocked) == (CONFLICT, CONFLICT)


def test_an_index_and_a_uuid_naming_one_gpu_conflict_once_the_inventory_is_known() -> None:
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-1"), {})
    compiler.set_map(pmap("a", devices("gpu-1", 2)))
    compiler.set_map(pmap("b", devices("gpu-1", uuid(1, 2))))
    _, reports = compiler.build()
    assert reports[MapKey("ml", "a")].phase is Phase.VALID  # not knowable yet
    compiler.set_inventory(inventory(1))
    model, reports = compiler.build()
    assert reports[MapKey("ml", "b")].phase is Phase.CONFLICT
    # b held the GPU by its UUID in the model in service: it is the incumbent.
    assert (slot(model, "a").blocked, slot(model, "b").blocked) == (CONFLICT, "")


def test_shared_maps_overlap_but_not_with_an_exclusive_one() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("s1", devices("gpu-1", 0), sharing=Sharing.SHARED))
    compiler.set_map(
        pmap("s2", devices("gpu-1", 0), count("gpu-1", 1, index=1), sharing=Sharing.SHARED)
    )
    model, reports = compiler.build()
    assert all(r.phase is Phase.VALID for r in reports.values())
    # A shared count entry may land on a GPU other shared maps use; the lowest is GPU 0.
    assert slot(model, "s2", 1).device_indices == (0,)

    compiler.set_map(pmap("x", devices("gpu-1", 0)))
    model, reports = compiler.build()
    assert reports[MapKey("ml", "x")].phase is Phase.CONFLICT
    assert slot(model, "x").blocked == CONFLICT


# -- the model ------------------------------------------------------------------------------------
def test_generation_moves_only_when_content_changes() -> None:
    compiler = cluster(1)
    compiler.set_map(pmap("a", devices("gpu-1", 0)))
    first, _ = compiler.build()
    compiler.set_map(pmap("a", devices("gpu-1", 0)))
    same, _ = compiler.build()
    assert same is first
    compiler.set_map(pmap("b", devices("gpu-1", 1)))
    second, _ = compiler.build()
    assert second.generation == first.generation + 1
    assert second.maps[MapKey("ml", "a")] is first.maps[MapKey("ml", "a")]
    assert second.maps[MapKey("ml", "b")].generation == second.generation


def large_model(maps: int, slots: int) -> Model:
    out = {}
    for m in range(maps):
        key = MapKey(f"team-{m % 7}", f"map-{m}")
        out[key] = CompiledMap(
            key,
            {
                i: CompiledSlot(
                    i,
                    NodeName(f"gpu-node-{(m * slots + i) // 8}"),
                    (uuid(m, i),),
                    (i % 8,),
                    DeclaredDevices((i % 8,)),
                )
                for i in range(slots)
            },
        )
    return Model(42, out)


def test_a_large_model_is_sharded_under_900_kib_a_shard_and_decodes_back() -> None:
    model = large_model(2_000, 40)  # 80,000 slots
    encoded = encode_model(model)
    shards = {name: data[SHARD_KEY] for name, data in encoded.items() if name != MANIFEST_NAME}
    assert len(shards) > 1
    assert max(len(text.encode()) for text in shards.values()) <= MAX_SHARD_BYTES
    manifest = json.loads(encoded[MANIFEST_NAME]["manifest.json"])
    assert manifest["generation"] == 42
    assert set(manifest["shards"]) == set(shards)
    assert decode_model(encoded) == model


def test_a_half_written_model_is_refused() -> None:
    encoded = encode_model(large_model(200, 40))
    name = next(n for n in encoded if n != MANIFEST_NAME)
    damaged = dict(encoded)
    damaged[name] = {SHARD_KEY: encoded[name][SHARD_KEY].replace("map-", "MAP-", 1)}
    with pytest.raises(ValueError, match="does not match manifest"):
        decode_model(damaged)
    del damaged[name]
    with pytest.raises(ValueError, match="is missing"):
        decode_model(damaged)


def test_a_map_too_large_for_one_configmap_is_refused() -> None:
    with pytest.raises(ValueError, match="alone encodes to"):
        encode_model(large_model(1, 30_000))
