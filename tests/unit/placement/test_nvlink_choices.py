"""NVLink-aware `count` picks (NVLink, then PCIe switch, then NUMA), `require: {nvlink: true}`,
`sameClique` maps and GPU-clique grants."""

from __future__ import annotations

import textwrap

from placement.compile import Compiler
from placement.grants import parse_policy, resolve
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import CompiledSlot, Model
from placement.reasons import Reason
from placement.slotdevices import select_devices
from placement.status import Phase
from placement.types import GpuUuid, MapKey, NodeName
from placement.validate import parse_map

CLIQUE = "nvidia.com/gpu.clique"
NVLINK = Requirement(nvlink=True)


def uuid(i: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{i:012x}")


def gpus(
    n: int = 8,
    *,
    nvlink: tuple[tuple[int, ...], ...] = (),
    switch: tuple[tuple[int, ...], ...] = (),
    unhealthy: tuple[int, ...] = (),
) -> tuple[GpuDevice, ...]:
    """`n` GPUs, 0..3 on NUMA node 0 and 4..7 on 1; each tuple of `nvlink` (`switch`) is a group
    joined pairwise by NVLink (under one PCIe switch), as the agent reports it on every member."""

    def peers(i: int, groups: tuple[tuple[int, ...], ...]) -> tuple[GpuUuid, ...]:
        return tuple(uuid(j) for g in groups if i in g for j in g if j != i)

    return tuple(
        GpuDevice(
            i,
            uuid(i),
            "NVIDIA H100 80GB HBM3",
            81559,
            f"00000000:{0x18 + i * 0x10:02X}:00.0",
            healthy=i not in unhealthy,
            numa_node=i // 4,
            nvlink_peers=peers(i, nvlink),
            pcie_switch_peers=peers(i, switch),
        )
        for i in range(n)
    )


def indices(chosen: tuple[GpuDevice, ...] | None) -> list[int] | None:
    return None if chosen is None else [d.index for d in chosen]


def test_nvlink_set_beats_pcie_switch_beats_numa() -> None:
    # NUMA alone would pick 0,1 (the first node's adjacent pair).
    assert indices(select_devices(gpus(), 2)) == [0, 1]
    assert indices(select_devices(gpus(switch=((2, 6),)), 2)) == [2, 6]
    both = gpus(nvlink=((3, 5),), switch=((2, 6),))
    assert indices(select_devices(both, 2)) == [3, 5]
    # The lowest indices among several joined sets, whatever the order of the candidates.
    many = gpus(nvlink=((4, 5), (1, 7), (0, 6)))
    assert indices(select_devices(reversed(many), 2)) == [0, 6]


def test_a_set_must_be_joined_pairwise_and_a_link_reported_by_one_end_counts() -> None:
    # 0-1 and 1-2 are linked, 0-2 is not: no three joined GPUs, so NUMA decides.
    chain = gpus(nvlink=((0, 1), (1, 2)))
    assert indices(select_devices(chain, 3)) == [0, 1, 2]  # NUMA node 0, not an NVLink set
    assert select_devices(chain, 3, nvlink=True) is None
    full = gpus(nvlink=((2, 4, 6),))
    assert indices(select_devices(full, 3, nvlink=True)) == [2, 4, 6]
    one_sided = list(gpus())
    one_sided[5] = GpuDevice(5, uuid(5), numa_node=1, nvlink_peers=(uuid(1),))
    assert indices(select_devices(one_sided, 2, nvlink=True)) == [1, 5]


def test_nvlink_required_refuses_without_a_joined_set() -> None:
    assert select_devices(gpus(switch=((0, 1),)), 2, nvlink=True) is None
    assert indices(select_devices(gpus(), 1, nvlink=True)) == [0]


# -- compile ------------------------------------------------------------------------------------
def compiler(devices: tuple[GpuDevice, ...], **labels: dict[str, str]) -> Compiler:
    c = Compiler()
    for name in ("gpu-1", *labels):
        c.set_node(NodeName(name), labels.get(name, {}))
        c.set_inventory(NodeInventory(NodeName(name), devices))
    return c


def served(model: Model, name: str, index: int = 0) -> CompiledSlot:
    found = model.slot(MapKey("ml", name), index)
    assert found is not None
    return found


def test_count_prefers_nvlink_pairs_and_keeps_what_it_picked() -> None:
    c = compiler(gpus(nvlink=((1, 2), (5, 6))))
    c.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=2),)))
    c.set_map(PlacementMap(MapKey("ml", "b"), (DeclaredSlot(0, "gpu-1", count=2),)))
    model, _ = c.build()
    assert served(model, "a").device_indices == (1, 2)
    assert served(model, "b").device_indices == (5, 6)
    # A third map takes what is left, as close as it can; the first two keep their picks.
    c.set_map(PlacementMap(MapKey("ml", "c"), (DeclaredSlot(0, "gpu-1", count=2),)))
    model, _ = c.build()
    assert served(model, "c").device_indices == (0, 3)
    c.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=2),), source="v2"))
    model, _ = c.build()
    assert served(model, "a").device_indices == (1, 2)


def test_a_kept_pick_is_not_repicked_when_a_closer_set_frees_up() -> None:
    c = compiler(gpus(nvlink=((0, 1),)))
    c.set_map(PlacementMap(MapKey("ml", "hold"), (DeclaredSlot(0, "gpu-1", devices=(0,)),)))
    c.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=2),)))
    model, _ = c.build()
    assert served(model, "a").device_indices == (1, 2)
    c.remove_map(MapKey("ml", "hold"))
    model, _ = c.build()
    assert served(model, "a").device_indices == (1, 2)


def test_require_nvlink_blocks_the_slot_with_a_clear_reason() -> None:
    c = compiler(gpus(nvlink=((0, 1),)))
    c.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=2, require=NVLINK),)))
    c.set_map(PlacementMap(MapKey("ml", "b"), (DeclaredSlot(0, "gpu-1", count=2, require=NVLINK),)))
    model, reports = c.build()
    assert served(model, "a").device_indices == (0, 1)
    blocked = served(model, "b")
    assert blocked.blocked is Reason.NO_NVLINK_SET
    assert blocked.message == (
        "index 0 on node gpu-1: needs 2 free healthy devices joined to each other by NVLink; "
        "no such set among the 6 free ones (indices 2,3,4,5,6,7)"
    )
    assert reports[MapKey("ml", "b")].phase is Phase.DEGRADED


def test_a_kept_nvlink_pick_moves_when_its_link_goes_down() -> None:
    c = compiler(gpus(nvlink=((0, 1), (4, 5))))
    c.set_map(PlacementMap(MapKey("ml", "a"), (DeclaredSlot(0, "gpu-1", count=2, require=NVLINK),)))
    model, _ = c.build()
    assert served(model, "a").device_indices == (0, 1)
    c.set_inventory(NodeInventory(NodeName("gpu-1"), gpus(nvlink=((4, 5),))))
    model, _ = c.build()
    assert served(model, "a").device_indices == (4, 5)


def test_require_nvlink_is_read_from_the_map() -> None:
    text = textwrap.dedent("""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementMap
        metadata: {name: m, namespace: ml}
        spec:
          sameClique: true
          placements:
            - {index: 0, node: n1, count: 2, require: {nvlink: true}}
    """)
    pmap = parse_map(text, "m.yaml")
    assert pmap.same_clique
    assert pmap.slots[0].require == Requirement(nvlink=True)
    assert pmap.slots[0].require.describe() == "joined by NVLink"


# -- cliques ------------------------------------------------------------------------------------
def clique_map(*nodes: str) -> PlacementMap:
    slots = tuple(DeclaredSlot(i, n, count=1) for i, n in enumerate(nodes))
    return PlacementMap(MapKey("ml", "train"), slots, same_clique=True)


def test_same_clique_serves_slots_whose_nodes_share_the_label() -> None:
    c = compiler(gpus(), **{"gpu-2": {CLIQUE: "a.1"}, "gpu-3": {CLIQUE: "a.1"}})
    c.set_map(clique_map("gpu-2", "gpu-3"))
    model, reports = c.build()
    assert not served(model, "train", 0).blocked
    assert not served(model, "train", 1).blocked
    assert reports[MapKey("ml", "train")].phase is Phase.VALID


def test_same_clique_blocks_the_slots_outside_the_majority_clique_and_unlabelled_nodes() -> None:
    labels = {"gpu-2": {CLIQUE: "a.1"}, "gpu-3": {CLIQUE: "b.1"}, "gpu-4": {CLIQUE: "a.1"}}
    c = compiler(gpus(), **labels)
    c.set_map(clique_map("gpu-3", "gpu-2", "gpu-4", "gpu-1"))
    model, reports = c.build()
    assert [served(model, "train", i).blocked for i in range(4)] == [
        Reason.CLIQUE_MISMATCH,
        "",
        "",
        Reason.CLIQUE_MISMATCH,
    ]
    assert served(model, "train", 0).message == (
        "index 0 on node gpu-3: sameClique: node gpu-3 is in GPU clique 'b.1', the map's other "
        "slots in 'a.1' (nvidia.com/gpu.clique)"
    )
    assert served(model, "train", 3).message == (
        "index 3 on node gpu-1: sameClique: node gpu-1 has no nvidia.com/gpu.clique label"
    )
    assert served(model, "train", 0).devices == ()  # a blocked slot claims no GPU
    assert reports[MapKey("ml", "train")].served == 2
    # Relabelling the node recompiles the map.
    assert c.set_node(NodeName("gpu-3"), {CLIQUE: "a.1"})
    assert not c.set_node(NodeName("gpu-3"), {CLIQUE: "a.1"})
    model, _ = c.build()
    assert not served(model, "train", 0).blocked


def test_a_map_without_same_clique_ignores_the_label() -> None:
    c = compiler(gpus(), **{"gpu-2": {CLIQUE: "a.1"}, "gpu-3": {CLIQUE: "b.1"}})
    c.set_map(PlacementMap(MapKey("ml", "train"), clique_map("gpu-2", "gpu-3").slots))
    model, _ = c.build()
    assert not served(model, "train", 1).blocked


def test_grants_select_nodes_by_gpu_clique() -> None:
    policy = parse_policy(
        textwrap.dedent("""\
            apiVersion: gpuplace.io/v1alpha1
            kind: PlacementPolicy
            metadata: {name: cluster}
            spec:
              grants:
                - namespaces: [training]
                  nodeSelector: {matchLabels: {nvidia.com/gpu.clique: cluster-a.7}}
        """),
        "policy.yaml",
    )
    nodes = {"gpu-1": {CLIQUE: "cluster-a.7"}, "gpu-2": {CLIQUE: "cluster-a.8"}, "gpu-3": {}}
    view = resolve(policy, False, nodes)
    assert view.refusal("training", "gpu-1", [0]) is None
    assert "may not place on node gpu-2" in str(view.refusal("training", "gpu-2", [0]))
    assert "may not place on node gpu-3" in str(view.refusal("training", "gpu-3", [0]))
