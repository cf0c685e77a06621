"""`gpuplace plan` shows the gangs a change touches: which slots bind together (or none), on
which nodes, and when the gang is reported stuck."""

from __future__ import annotations

import json

from gpuplace import planreport
from placement.review import RepoPlan, Revision, index_ranges, plan_cluster

TRAIN = "clusters/dev/maps/train.yaml"
MAP = """apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: train
  namespace: ml
spec:
{gang}  placements:
{slots}"""


def train(gang: str, nodes: list[str]) -> str:
    slots = "".join(
        f"    - index: {i}\n      node: {node}\n      devices: [{i}]\n"
        for i, node in enumerate(nodes)
    )
    return MAP.format(gang=gang, slots=slots)


GANG = "  gang: {timeoutSeconds: 900}\n"


def test_a_changed_gang_map_names_its_slots_and_their_nodes() -> None:
    base = {TRAIN: train(GANG, ["gpu-1", "gpu-2", "gpu-1"])}
    head = {TRAIN: train(GANG, ["gpu-1", "gpu-2", "gpu-1", "gpu-2"])}
    cluster = plan_cluster("clusters/dev", base, head)
    (gang,) = cluster.gangs
    assert gang.describe() == (
        "ml/train: slots 0-3 bind together or none, on 2 nodes (gpu-1: 0, 2; gpu-2: 1, 3); "
        "reported stuck after 900s"
    )
    text = planreport.text(RepoPlan(Revision("main"), Revision(None), (cluster,)))
    assert "  Gangs (every slot's pod bound at once, or none):\n      ml/train: slots 0-3" in text
    data = json.loads(planreport.to_json(RepoPlan(Revision("main"), Revision(None), (cluster,))))
    (shown,) = data["clusters"][0]["gangs"]
    assert shown["slots"][3] == {"index": 3, "node": "gpu-2"} and shown["timeoutSeconds"] == 900


def test_a_plain_map_and_an_unchanged_gang_show_no_gang() -> None:
    same = {TRAIN: train(GANG, ["gpu-1", "gpu-2"])}
    assert plan_cluster("clusters/dev", same, same).gangs == ()
    base = {TRAIN: train("", ["gpu-1"])}
    head = {TRAIN: train("", ["gpu-1", "gpu-2"])}
    assert plan_cluster("clusters/dev", base, head).gangs == ()


def test_a_wide_gang_counts_the_nodes_it_does_not_name() -> None:
    head = {TRAIN: train(GANG, [f"gpu-{i // 8}" for i in range(64)])}
    (gang,) = plan_cluster("clusters/dev", {}, head).gangs
    assert gang.describe().startswith(
        "ml/train: slots 0-63 bind together or none, on 8 nodes (gpu-0: 0-7; gpu-1: 8-15; "
        "gpu-2: 16-23; gpu-3: 24-31; and 4 more); "
    )


def test_index_ranges_join_runs() -> None:
    assert index_ranges([9, 0, 1, 2, 6, 8]) == "0-2, 6, 8-9"
    assert index_ranges([]) == ""
