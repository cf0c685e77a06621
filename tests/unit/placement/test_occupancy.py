"""Who holds which GPU: the cells (placement/occupancy.py), read from pods and drawn as a grid
(gpuplace/occupancy.py)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from controller.holders import holder_of
from gpuplace.occupancy import Filters, grid, render, select
from kubeio.pod import Pod
from placement.annotations import (
    DRIFTED_CONDITION,
    LEGACY_ANNOTATION,
    BindingDecision,
    encode_binding,
)
from placement.inventory import GpuDevice, NodeInventory
from placement.occupancy import CellState, Holder, occupancy, summary
from placement.types import GpuUuid, MapKey, NodeName

A, B = NodeName("node-a"), NodeName("node-b")


def inventory(node: NodeName, count: int, unhealthy: int | None = None) -> NodeInventory:
    return NodeInventory(
        node,
        tuple(
            GpuDevice(
                i,
                GpuUuid(f"GPU-{node}-{i}"),
                "NVIDIA H100 80GB HBM3",
                healthy=i != unhealthy,
                health_reason="XID 79" if i == unhealthy else "",
            )
            for i in range(count)
        ),
    )


def holder(pod: str, node: NodeName, *gpus: int, map_name: str = "llm", **flags: str) -> Holder:
    index = int(pod.rsplit("-", 1)[1])
    uuids = tuple(f"GPU-{node}-{g}" for g in gpus)
    return Holder("ml", pod, map_name, index, node, uuids, **flags)


INVENTORIES = {A: inventory(A, 4, unhealthy=3), B: inventory(B, 2)}


def test_every_gpu_of_every_node_is_a_cell_with_its_holders() -> None:
    cells = occupancy(
        INVENTORIES,
        [
            holder("web-0", A, 0, 1),
            holder("web-1", A, 2, drifted="moved to node-b"),
            holder("db-0", B, 0, map_name="db"),
            holder("db-1", B, 0, map_name="db"),
        ],
    )
    states = {(c.node, c.index): c.state for c in cells}
    assert states == {
        (A, 0): CellState.HELD,
        (A, 1): CellState.HELD,
        (A, 2): CellState.DRIFTED,
        (A, 3): CellState.DEGRADED,
        (B, 0): CellState.SHARED,
        (B, 1): CellState.FREE,
    }
    a3 = next(c for c in cells if c.node == A and c.index == 3)
    assert a3.reason == "XID 79" and a3.product == "NVIDIA H100 80GB HBM3"
    b0 = next(c for c in cells if c.node == B and c.index == 0)
    assert [h.pod for h in b0.holders] == ["db-0", "db-1"]
    assert summary(cells)["held"] == 2 and summary(cells)["free"] == 1


def test_a_gpu_no_inventory_lists_is_a_missing_cell_and_indices_resolve_by_inventory() -> None:
    by_index = Holder("ml", "idx-0", "llm", 0, A, (), (1,))
    gone = holder("web-9", B, 7)
    no_inventory = Holder("ml", "x-0", "llm", 0, NodeName("node-c"), (), (0,))
    cells = occupancy(INVENTORIES, [by_index, gone, no_inventory])
    a1 = next(c for c in cells if c.node == A and c.index == 1)
    assert a1.state is CellState.HELD and a1.holders == (by_index,)
    missing = [c for c in cells if c.state is CellState.MISSING]
    assert {(c.node, c.uuid) for c in missing} == {(B, "GPU-node-b-7"), ("node-c", "index 0")}
    assert all(c.index is None for c in missing)


def pod(name: str, node: str = "node-a", **extra: Any) -> Pod:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}", "annotations": {}},
        "spec": {"nodeName": node, "schedulerName": "gpuplace"},
        "status": {"phase": "Running", "conditions": extra.pop("conditions", [])},
    }
    obj["metadata"]["annotations"].update(extra.pop("annotations", {}))
    return Pod.of(obj)


def test_a_holder_is_read_from_the_binding_annotations_or_the_legacy_line() -> None:
    decision = BindingDecision(
        MapKey("ml", "llm"), 2, A, (GpuUuid("GPU-node-a-1"),), "1", 3, "abc", "maps/llm.yaml"
    )
    drifted = {"type": DRIFTED_CONDITION, "status": "True", "message": "slot moved"}
    bound = holder_of(pod("web-2", annotations=encode_binding(decision), conditions=[drifted]))
    assert bound is not None
    assert (bound.map, bound.index, bound.uuids, bound.drifted) == (
        "llm",
        2,
        ("GPU-node-a-1",),
        "slot moved",
    )
    legacy = holder_of(pod("old-1", annotations={LEGACY_ANNOTATION: "0=node-a:0\n1=node-a:2,3"}))
    assert legacy is not None
    assert (legacy.map, legacy.index, legacy.indices) == ("legacy.old", 1, (2, 3))
    assert holder_of(pod("web-3", node="")) is None  # pending
    assert holder_of(pod("plain-0")) is None  # bound, no gpuplace binding, no legacy line


def test_filters_keep_the_nodes_a_namespace_or_map_holds_and_hide_other_holders() -> None:
    cells = occupancy(INVENTORIES, [holder("web-0", A, 0), holder("db-0", B, 0, map_name="db")])
    by_map = Filters(map="ml/db")
    chosen = select(cells, by_map)
    assert {c.node for c in chosen} == {B}
    assert {c.node for c in select(cells, Filters(nodes=frozenset({A})))} == {A}
    assert select(cells, Filters(namespace="other")) == []
    text = grid(select(cells, Filters(map="web-free")), Filters(map="web-free"))
    assert text.startswith("no GPUs")
    shown = grid(cells, Filters(map="db"))
    assert "(other)" in shown and "db#0" in shown


def test_the_grid_puts_nodes_down_and_gpus_across_and_lists_what_is_not_free() -> None:
    cells = occupancy(INVENTORIES, [holder("web-0", A, 0), holder("web-1", A, 2, drifted="x")])
    lines = grid(cells).splitlines()
    assert lines[0].split() == ["NODE", "GPU0", "GPU1", "GPU2", "GPU3"]
    assert lines[1].split() == ["node-a", "llm#0", "free", "llm#1", "!drifted", "DEGRADED"]
    assert lines[2].split() == ["node-b", "free", "free"]
    assert "1 degraded, 1 drifted, 1 held, 3 free GPU(s)" in lines  # worst first
    assert "node-a GPU3 GPU-node-a-3  degraded: XID 79" in lines
    assert "node-a GPU2 GPU-node-a-2  drifted: x  held by ml/web-1 (ml/llm#1)" in lines
    assert "node-a GPU0 GPU-node-a-0  held  held by ml/web-0 (ml/llm#0)" in lines
    assert not any(line.startswith("node-b GPU0") for line in lines)  # free: the grid says so
    coloured = grid(cells, colour=True)
    assert "\x1b[31m" in coloured and "\x1b[0m" in coloured


def test_json_and_yaml_carry_the_same_cells() -> None:
    cells = occupancy(INVENTORIES, [holder("web-0", A, 0)])
    data = json.loads(render(cells, "json", Filters(), colour=False))
    assert yaml.safe_load(render(cells, "yaml", Filters(), colour=False)) == data
    first = data["gpus"][0]
    assert first == {
        "node": "node-a",
        "index": 0,
        "uuid": "GPU-node-a-0",
        "product": "NVIDIA H100 80GB HBM3",
        "state": "held",
        "reason": "",
        "holders": [{"namespace": "ml", "pod": "web-0", "map": "llm", "index": 0}],
        "claims": [],
    }
    assert data["summary"]["free"] == 4


def test_a_gpu_two_claims_allocate_is_held_twice_and_a_claim_alone_holds_it() -> None:
    """Claims hold GPUs whoever allocated them: a tenant's claim beside a gpuplace pod's claim
    is a second owner; the claims of two pods sharing a GPU by a shared slot are not."""
    holders = [holder("web-0", A, 0), holder("web-1", B, 1), holder("web-2", B, 1)]
    claims = [
        ("ml/web-0-gpus", A, "GPU-node-a-0"),
        ("tenant-a/squat", A, "GPU-node-a-0"),
        ("tenant-a/own", A, "GPU-node-a-1"),
        ("ml/web-1-gpus", B, "GPU-node-b-1"),
        ("ml/web-2-gpus", B, "GPU-node-b-1"),
    ]
    cells = {(c.node, c.index): c for c in occupancy(INVENTORIES, holders, claims=claims)}
    twice = cells[(A, 0)]
    assert twice.state is CellState.HELD_TWICE
    assert twice.reason == "allocated to 2 claims: ml/web-0-gpus, tenant-a/squat"
    assert (cells[(A, 1)].state, cells[(A, 1)].claims) == (CellState.HELD, ("tenant-a/own",))
    assert cells[(B, 1)].state is CellState.SHARED
    text = grid(list(cells.values()))
    assert "2 claims !held-twice" in text
    assert "node-a GPU1 GPU-node-a-1  held  held by claim tenant-a/own" in text
    assert cells[(A, 0)].to_dict()["claims"] == ["ml/web-0-gpus", "tenant-a/squat"]
