"""What `gpuplace freeze`, `move` and `import` choose (placement/authoring.py, moves.py)."""

from __future__ import annotations

import textwrap

from placement.authoring import RunningGpuPod, apply_slot_edits, freeze_edits, import_maps
from placement.compile import Compiler
from placement.diff import RunningPod, drifting_pods, plan
from placement.grants import parse_policy, resolve
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import PlacementMap
from placement.model import Model
from placement.moves import MoveRequest, held_gpus, plan_moves
from placement.snapshot import load_snapshot
from placement.types import GpuUuid, MapKey, NodeName
from placement.validate import parse_map

H100 = ("NVIDIA H100 80GB HBM3", 81559)
A100 = ("NVIDIA A100-SXM4-40GB", 40960)


def uuid(node: int, i: int) -> GpuUuid:
    return GpuUuid(f"GPU-{node:08x}-0000-4000-8000-{i:012x}")


def inventory(
    n: int,
    name: str,
    count: int = 4,
    kind: tuple[str, int] = H100,
    unhealthy: tuple[int, ...] = (),
    nvlink_pairs: bool = False,
) -> NodeInventory:
    def peers(i: int) -> tuple[GpuUuid, ...]:
        return (uuid(n, i ^ 1),) if nvlink_pairs else ()

    return NodeInventory(
        NodeName(name),
        tuple(
            GpuDevice(
                i,
                uuid(n, i),
                kind[0],
                kind[1],
                pci_bus_id=f"0000:{i + 16:02x}:00.0",
                healthy=i not in unhealthy,
                health_reason="XID 79" if i in unhealthy else "",
                nvlink_peers=peers(i),
            )
            for i in range(count)
        ),
    )


def pmap(name: str, entries: str, namespace: str = "ml", extra: str = "") -> PlacementMap:
    text = (
        f"apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata:\n  name: {name}\n"
        f"  namespace: {namespace}\nspec:\n{extra}  placements:\n"
        + textwrap.indent(textwrap.dedent(entries), "    ")
    )
    return parse_map(text, f"{name}.yaml")


def compiled(inventories: list[NodeInventory], *maps: PlacementMap) -> Model:
    c = Compiler()
    for inv in inventories:
        c.set_node(inv.node, {})
        c.set_inventory(inv)
    for m in maps:
        c.set_map(m)
    model, _ = c.build()
    return model


# -- freeze ---------------------------------------------------------------------------------


def test_freeze_writes_the_controllers_picks_and_the_spares_in_use() -> None:
    invs = [inventory(1, "a", count=6, unhealthy=(0,))]
    picks = pmap("picks", "- index: 0\n  node: a\n  count: 2\n")
    spare = pmap("spare", f"- index: 0\n  node: a\n  devices: [0]\n  fallback: [{uuid(1, 3)}]\n")
    plain = pmap("plain", "- index: 0\n  node: a\n  devices: [2]\n")
    model = compiled(invs, picks, spare, plain)
    edits, skipped = freeze_edits([picks, spare, plain], model, {i.node: i for i in invs})
    by_map = {e.map.name: e for e in edits}
    picked = model.slot(picks.key, 0)
    assert picked is not None and by_map["picks"].devices == picked.devices
    assert len(picked.devices) == 2 and uuid(1, 0) not in picked.devices  # unhealthy skipped
    assert by_map["spare"].devices == (uuid(1, 3),) and by_map["spare"].fallback == ()
    assert "plain" not in by_map and not skipped


def test_freeze_skips_what_the_cluster_does_not_serve() -> None:
    invs = [inventory(1, "a", count=1)]
    picks = pmap("picks", "- index: 0\n  node: a\n  count: 2\n")
    model = compiled(invs, picks)
    edits, skipped = freeze_edits([picks], model, {i.node: i for i in invs})
    assert edits == [] and "not served" in skipped[0].why


# -- move -----------------------------------------------------------------------------------


def inventories(*invs: NodeInventory) -> dict[NodeName, NodeInventory]:
    return {i.node: i for i in invs}


def test_move_off_a_node_moves_exactly_its_slots_as_count_would() -> None:
    a, b, c = inventory(1, "a"), inventory(2, "b", count=8), inventory(3, "c", count=2)
    serving = pmap(
        "serving",
        f"- index: 0\n  node: a\n  devices: [0, 1]\n"
        f"- index: 1\n  node: b\n  devices: [{uuid(2, 0)}]\n",
    )
    other = pmap("other", "- index: 0\n  node: c\n  devices: [0]\n")
    model = compiled([a, b, c], serving, other)
    invs = inventories(a, b, c)
    result = plan_moves(MoveRequest(NodeName("a")), [serving, other], model, invs, held_gpus(model))
    assert [(e.map.name, e.index) for e in result.edits] == [("serving", 0)]
    edit = result.edits[0]
    # Best fit: c has 1 free GPU (too few), b has 7: b takes it, its lowest free pair.
    assert edit.node == "b" and edit.devices == (uuid(2, 1), uuid(2, 2))
    assert not result.unplaced
    # Written into the file, the map moves that slot and nothing else.
    text = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata:\n  name: serving\n"
        "  namespace: ml\nspec:\n  placements:\n    - index: 0\n      node: a\n"
        "      devices: [0, 1]\n    - index: 1\n      node: b\n"
        f"      devices: [{uuid(2, 0)}]\n"
    )
    after = apply_slot_edits({"s.yaml": text}, result.edits).files["s.yaml"]
    moved = parse_map(after, "s.yaml")
    assert moved.by_index[0].node == "b" and moved.by_index[1] == serving.by_index[1]


def test_move_keeps_product_memory_and_nvlink_and_says_why_a_slot_found_no_room() -> None:
    a = inventory(1, "a", nvlink_pairs=True)
    b = inventory(2, "b", kind=A100)  # another product: never a target
    c = inventory(3, "c", count=4)  # no NVLink at all
    d = inventory(4, "d", count=4, nvlink_pairs=True)
    pair = pmap("pair", "- index: 0\n  node: a\n  devices: [2, 3]\n")
    model = compiled([a, b, c, d], pair)
    result = plan_moves(
        MoveRequest(NodeName("a")), [pair], model, inventories(a, b, c, d), held_gpus(model)
    )
    assert result.edits[0].node == "d" and result.edits[0].devices == (uuid(4, 0), uuid(4, 1))
    # With d full, nothing fits: the slot stays, and the reason names each node.
    held = held_gpus(model, [(NodeName("d"), uuid(4, i)) for i in (0, 2)])
    stuck = plan_moves(MoveRequest(NodeName("a")), [pair], model, inventories(a, b, c, d), held)
    assert stuck.edits == ()
    why = stuck.unplaced[0].why
    assert "2 free NVIDIA H100 80GB HBM3 (81559 MiB) joined by NVLink" in why
    assert "b: 0 free of 2" in why and "c: no 2 free GPUs joined by NVLink" in why
    assert "d: no 2 free GPUs joined by NVLink" in why


def test_move_off_a_gpu_stays_on_its_node_and_keeps_its_other_gpus() -> None:
    a = inventory(1, "a", unhealthy=(1,))
    b = inventory(2, "b")
    slot = pmap("s", "- index: 0\n  node: a\n  devices: [0, 1]\n  fallback: [3]\n")
    model = compiled([a, b], slot)
    result = plan_moves(
        MoveRequest(gpus=frozenset({uuid(1, 1)})),
        [slot],
        model,
        inventories(a, b),
        held_gpus(model),
    )
    edit = result.edits[0]
    assert edit.node is None and edit.devices is not None
    assert edit.devices[0] == uuid(1, 0) and uuid(1, 1) not in edit.devices
    assert edit.devices[1] in (uuid(1, 2), uuid(1, 3))


def test_move_respects_grants_and_moves_a_gang_whole_or_not_at_all() -> None:
    a, b, c = inventory(1, "a"), inventory(2, "b", count=1), inventory(3, "c", count=2)
    gang = pmap(
        "gang",
        "- index: 0\n  node: a\n  devices: [0]\n- index: 1\n  node: a\n  devices: [1, 2]\n",
        extra="  gang: {}\n",
    )
    model = compiled([a, b, c], gang)
    policy = parse_policy(
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: p}\n"
        "spec:\n  grants:\n    - namespaces: [ml]\n      nodes: [a, b]\n",
        "p.yaml",
    )
    grants = resolve(policy, True, {"a": {}, "b": {}, "c": {}})
    result = plan_moves(
        MoveRequest(NodeName("a")),
        [gang],
        model,
        inventories(a, b, c),
        held_gpus(model),
        grants=grants,
    )
    assert result.edits == ()
    whys = {s.index: s.why for s in result.unplaced}
    assert "c: not granted" in whys[1]
    assert "gang moves whole" in whys[0]


def test_move_writes_the_logical_name_where_the_entry_wrote_one() -> None:
    a, b = inventory(1, "a"), inventory(2, "b")
    slot = pmap("s", "- index: 0\n  node: rack-a\n  devices: [0]\n")
    c = Compiler()
    c.set_node(a.node, {"gpu-node-name": "rack-a"})
    c.set_node(b.node, {"gpu-node-name": "rack-b"})
    c.set_inventory(a)
    c.set_inventory(b)
    c.set_map(slot)
    model, _ = c.build()
    result = plan_moves(
        MoveRequest(NodeName("a")),
        [slot],
        model,
        inventories(a, b),
        held_gpus(model),
        logical={NodeName("b"): "rack-b"},
    )
    assert result.edits[0].node == "rack-b"


# -- import ---------------------------------------------------------------------------------


def pod(
    name: str,
    node: str,
    *gpus: int,
    rank: int | None = None,
    kind: str = "StatefulSet",
    workload: str = "llm",
    n: int = 1,
) -> RunningGpuPod:
    return RunningGpuPod(
        "ml",
        name,
        NodeName(node),
        tuple(uuid(n, g) for g in gpus),
        kind,
        workload,
        rank,
        source="device plugin",
    )


def test_import_declares_where_each_pod_runs_now() -> None:
    invs = {NodeName("a"): inventory(1, "a"), NodeName("b"): inventory(1, "b")}
    pods = [
        pod("llm-1", "b", 2, rank=1),
        pod("llm-0", "a", 0, 1, rank=0),
        # A Deployment's pods have no rank: slots by node, then lowest GPU index.
        pod("web-x", "b", 3, kind="Deployment", workload="web"),
        pod("web-y", "a", 3, kind="Deployment", workload="web"),
        pod("web-z", "a", 2, kind="Deployment", workload="web"),
    ]
    result = import_maps(pods, {NodeName("a"): "rack-a"}, invs)
    maps = {m.key.name: m for m in result.maps}
    llm = parse_map(maps["llm"].text(), "llm.yaml")
    assert llm.indexing.value == "auto"
    assert [(s.index, s.node, s.devices) for s in llm.slots] == [
        (0, "rack-a", (uuid(1, 0), uuid(1, 1))),
        (1, "b", (uuid(1, 2),)),
    ]
    web = parse_map(maps["web"].text(), "web.yaml")
    assert web.indexing.value == "allocate"
    assert [(s.node, s.devices) for s in web.slots] == [
        ("rack-a", (uuid(1, 2),)),
        ("rack-a", (uuid(1, 3),)),
        ("b", (uuid(1, 3),)),
    ]
    assert "# pod web-z" in maps["web"].text()


def test_import_shares_gpus_pods_share_and_leaves_existing_maps_alone() -> None:
    pods = [
        pod("a-0", "a", 0, rank=0, workload="a"),
        pod("b-0", "a", 0, rank=0, workload="b"),
        pod("c-0", "a", 1, rank=0, workload="c"),
    ]
    result = import_maps(pods, {}, {}, existing=[MapKey("ml", "c")])
    assert [(m.key.name, m.shared) for m in result.maps] == [("a", True), ("b", True)]
    assert parse_map(result.maps[0].text(), "a.yaml").sharing.value == "shared"
    assert "map ml/c exists already" in result.skipped[0]


def test_a_spare_the_moved_slot_now_holds_leaves_its_fallback() -> None:
    a = inventory(1, "a", count=3, unhealthy=(1,))
    slot = pmap("s", "- index: 0\n  node: a\n  devices: [0, 1]\n  fallback: [2]\n")
    model = compiled([a], slot)
    result = plan_moves(
        MoveRequest(gpus=frozenset({uuid(1, 1)})), [slot], model, inventories(a), held_gpus(model)
    )
    assert result.edits[0].devices == (uuid(1, 0), uuid(1, 2))
    assert result.edits[0].fallback == ()


def test_a_failed_gpu_without_a_spare_suggests_the_move_that_re_places_its_slot() -> None:
    a = inventory(1, "a", unhealthy=(1,))
    bare = pmap("bare", "- index: 0\n  node: a\n  devices: [0, 1]\n")
    spared = pmap("spared", "- index: 0\n  node: a\n  devices: [1]\n  fallback: [3]\n", "other")
    c = Compiler()
    c.set_node(a.node, {})
    c.set_inventory(a)
    c.set_map(bare)
    c.set_map(spared)
    _, reports = c.build()
    suggestion = f"re-place it: gpuplace move --gpu {uuid(1, 1)}"
    assert suggestion in reports[bare.key].message
    assert reports[bare.key].phase.value == "Degraded"
    assert "gpuplace move" not in reports[spared.key].message  # its spare stands in


def test_a_frozen_pick_moves_no_running_pod_in_the_plan() -> None:
    head = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata:\n  name: m\n"
        "  namespace: ml\nspec:\n  placements:\n    - index: 0\n      node: rack-a\n"
    )
    before = load_snapshot({"m.yaml": head + "      count: 1\n"})
    frozen = load_snapshot({"m.yaml": head + f"      devices: [{uuid(1, 2)}]\n"})
    result = plan(before, frozen)
    holding = RunningPod("ml", "m-0", "m", 0, "a", (uuid(1, 2),))
    elsewhere = RunningPod("ml", "m-0", "m", 0, "a", (uuid(1, 3),))
    assert drifting_pods(result, [holding], {"rack-a": "a"}) == []
    assert drifting_pods(result, [holding]) != []  # rack-a is not node a without the alias
    assert [d.reason for d in drifting_pods(result, [elsewhere], {"rack-a": "a"})] == ["SlotMoved"]
