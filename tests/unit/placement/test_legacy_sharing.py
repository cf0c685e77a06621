"""One rule for the earlier tools' text, in an annotation or in `spec.map`: lines that name the same
GPU share it, exactly those lines, with a warning; every other map and pod stays off it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from controller.slotcache import SlotCache
from controller.sources import map_status, read_source
from gpuplace.commands.validate import check
from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL
from placement.binding import (
    Cluster,
    InventoryState,
    NodeState,
    Placement,
    PodFacts,
    Status,
    plan,
)
from placement.compile import Compiler
from placement.inventory import GpuDevice, NodeInventory
from placement.model import decode_map, encode_map
from placement.status import MapStatus
from placement.types import GpuUuid, MapKey, NodeName
from placement.validate import parse_map
from tests.unit.webhook_builders import make_configmap, make_pod, review
from webhook.admission import build_response
from webhook.mapcheck import check_configmap
from webhook.review import parse_review
from webhook.settings import AdmissionSettings

NODES = [f"aks-workerpool-25338008-vmss00000{i}" for i in (0, 1, 3, 4)]
TEXT = "".join(
    f"{i}={NODES[n]}:{devs}\n"
    for i, (n, devs) in enumerate([(0, "0,1"), (1, "2"), (2, "0,1,2"), (3, "3"), (3, "3")])
)
EXPECTED = {0: (NODES[0], "0,1"), 1: (NODES[1], "2"), 2: (NODES[2], "0,1,2")}
EXPECTED |= {3: (NODES[3], "3"), 4: (NODES[3], "3")}


def map_yaml(name: str = "aks", sharing: str = "") -> str:
    block = "".join(f"    {line}\n" for line in TEXT.splitlines())
    extra = f"  sharing: {sharing}\n" if sharing else ""
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: {name}\n  namespace: ml\nspec:\n{extra}  map: |\n{block}"
    )


def other_yaml(name: str, index: int = 0) -> str:
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: {name}\n  namespace: ml\nspec:\n  placements:\n"
        f"    - {{index: {index}, node: {NODES[3]}, devices: [3]}}\n"
    )


def uuid_of(node: int, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{node:08x}-0000-4000-8000-{index:012x}")


def inventories() -> dict[NodeName, NodeInventory]:
    return {
        NodeName(name): NodeInventory(
            NodeName(name), tuple(GpuDevice(i, uuid_of(n, i)) for i in range(4))
        )
        for n, name in enumerate(NODES)
    }


def compile_maps(*texts: str) -> Cluster:
    compiler = Compiler()
    for name, inventory in inventories().items():
        compiler.set_node(name, {})
        compiler.set_inventory(inventory)
    for text in texts:
        compiler.set_map(parse_map(text, "m.yaml"))
    model, _ = compiler.build()
    return Cluster(
        model,
        {NodeName(n): NodeState(NodeName(n)) for n in NODES},
        {},
        {k: InventoryState(v) for k, v in inventories().items()},
    )


def map_pod(name: str, map_name: str = "aks", owner: str | None = "StatefulSet") -> PodFacts:
    return PodFacts("ml", name, f"uid-{name}", {}, owner, map_name, None)


def legacy_pod(name: str, text: str = TEXT) -> PodFacts:
    return PodFacts("ml", name, f"uid-{name}", {}, "StatefulSet", None, text)


def place_all(pods: list[PodFacts], cluster: Cluster, cache: SlotCache) -> dict[str, Placement]:
    placed = {}
    for pod in pods:
        result = plan(pod, cluster, cache)
        assert isinstance(result, Placement), result
        cache.assume(pod.uid, f"{pod.namespace}/{pod.name}", result)
        placed[pod.name] = result
    return placed


@pytest.mark.parametrize("order", list(itertools.permutations(range(5)))[::7])
def test_spec_map_lines_share_their_gpu_in_any_order(order: tuple[int, ...]) -> None:
    cluster = compile_maps(map_yaml())
    placed = place_all([map_pod(f"check-{i}") for i in order], cluster, SlotCache())
    for i, (node, cvd) in EXPECTED.items():
        decision = placed[f"check-{i}"].decision
        assert (decision.node, decision.cuda_visible_devices) == (node, cvd)
    assert placed["check-3"].decision.devices == placed["check-4"].decision.devices


@pytest.mark.parametrize("order", list(itertools.permutations(range(5)))[::11])
def test_annotation_lines_share_their_gpu_in_any_order(order: tuple[int, ...]) -> None:
    cluster = compile_maps()
    placed = place_all([legacy_pod(f"check-{i}") for i in order], cluster, SlotCache())
    for i, (node, cvd) in EXPECTED.items():
        decision = placed[f"check-{i}"].decision
        assert (decision.node, decision.cuda_visible_devices) == (node, cvd)


def test_other_maps_and_pods_stay_off_the_shared_gpu_and_messages_name_the_pod() -> None:
    cluster = compile_maps(map_yaml())
    cache = SlotCache()
    place_all([map_pod("check-3")], cluster, cache)
    # A legacy pod of another workload naming the same GPU waits, told who uses it.
    busy = plan(legacy_pod("other-3"), cluster, cache)
    assert isinstance(busy, Status) and busy.reason == "DeviceBusy"
    assert busy.message.endswith(
        f"GPU {uuid_of(3, 3)} on node {NODES[3]} is still used by pod ml/check-3 (uid uid-check-3)"
    )
    # Another pod asking for the same slot: SlotTaken names the holder too.
    taken = plan(PodFacts("ml", "dup-3", "uid-dup", {}, "StatefulSet", "aks", None), cluster, cache)
    assert isinstance(taken, Status) and taken.reason == "SlotTaken"
    assert taken.message == "map ml/aks index 3 is held by pod ml/check-3 (uid uid-check-3)"


def test_another_map_naming_the_gpu_conflicts_and_the_lines_win_or_lose_together() -> None:
    cluster = compile_maps(map_yaml(), other_yaml("rival"))
    aks = cluster.model.maps[MapKey("ml", "aks")]
    rival = cluster.model.maps[MapKey("ml", "rival")]
    # No incumbent: nobody gets the GPU, and both lines block together.
    assert aks.slots[3].blocked == aks.slots[4].blocked == "SlotConflict"
    assert rival.slots[0].blocked == "SlotConflict"
    assert not aks.slots[0].blocked
    # Once the legacy map is in service alone, it is the incumbent: a rival added later loses.
    compiler = Compiler()
    for name, inventory in inventories().items():
        compiler.set_node(name, {})
        compiler.set_inventory(inventory)
    compiler.set_map(parse_map(map_yaml(), "m.yaml"))
    compiler.build()
    compiler.set_map(parse_map(other_yaml("late"), "m.yaml"))
    model, reports = compiler.build()
    assert not model.maps[MapKey("ml", "aks")].slots[3].blocked
    assert not model.maps[MapKey("ml", "aks")].slots[4].blocked
    assert model.maps[MapKey("ml", "late")].slots[0].blocked == "SlotConflict"
    # The report names the rival, never the sharing line of its own map.
    assert reports[MapKey("ml", "aks")].message == (
        "index 3 conflicts with ml/late[0]; index 4 conflicts with ml/late[0]"
    )


def test_shared_lines_alone_are_no_conflict() -> None:
    cluster = compile_maps(map_yaml())
    aks = cluster.model.maps[MapKey("ml", "aks")]
    assert aks.legacy_sharing and not any(s.blocked for s in aks.slots.values())
    assert decode_map(aks.key, encode_map(aks)).legacy_sharing


def test_admission_warns_the_sharing_pods_with_the_gpu_and_lines() -> None:
    settings = AdmissionSettings()
    pod = make_pod("check-4").annotation(LEGACY_ANNOTATION, TEXT).scheduler("gpu-scheduler")
    answer = build_response(review(pod.obj()), compile_maps().model, settings)
    assert answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        f"annotation gpu-scheduling-map: GPU 3 on node {NODES[3]} is listed by lines 4 and 5 "
        "(indices 3 and 4): their pods share it, as the earlier tools did; every other map and "
        "pod is kept off it"
    ]
    alone = make_pod("check-0").annotation(LEGACY_ANNOTATION, TEXT).scheduler("gpu-scheduler")
    answer = build_response(review(alone.obj()), compile_maps().model, settings)
    assert "warnings" not in answer["response"]
    mapped = make_pod("check-3", "ml").label(MAP_LABEL, "aks").owner("StatefulSet")
    answer = build_response(review(mapped.obj()), compile_maps(map_yaml()).model, settings)
    assert answer["response"]["warnings"][0] == (
        f"placement map ml/aks: GPU 3 on node {NODES[3]} is given to indices 3-4 by its spec.map "
        "lines: their pods share it, as the earlier tools did"
    )


def test_applying_the_map_warns_with_the_location_and_status_carries_it() -> None:
    obj = make_configmap("aks", map_yaml(), "ml")
    verdict = check_configmap(
        parse_review(review(obj, kind="ConfigMap", resource="configmaps", namespace="ml"))
    )
    assert verdict.allowed
    (warning,) = verdict.warnings
    assert warning.startswith(
        f"configmap ml/aks placement.yaml:12:42: warning: spec.map: GPU 3 on node {NODES[3]} is "
        "listed by lines 11 and 12 (indices 3 and 4)"
    )
    explicit = make_configmap("aks", map_yaml(sharing="exclusive"), "ml")
    refused = check_configmap(
        parse_review(review(explicit, kind="ConfigMap", resource="configmaps", namespace="ml"))
    )
    assert not refused.allowed
    assert "placement.yaml:13:5: error: spec.map: device 3 on node" in refused.message
    state = read_source(obj, None)
    compiler = Compiler()
    for name, inventory in inventories().items():
        compiler.set_node(name, {})
        compiler.set_inventory(inventory)
    assert state.valid is not None
    compiler.set_map(state.valid)
    model, reports = compiler.build()
    status = MapStatus.from_json(
        map_status(state, reports[state.key], model.generation, 0).to_json()
    )
    assert [w.format() for w in status.warnings] == [warning]
    assert status.message.startswith("5 slots; 1 warning(s): configmap ml/aks placement.yaml:12")


def test_bound_count_counts_bound_pods_only() -> None:
    """What a map's status reports: a pod being bound (assumed) is not bound yet, a released one
    no longer is."""
    cluster = compile_maps(map_yaml())
    cache = SlotCache()
    key = MapKey("ml", "aks")
    placed = place_all([map_pod("check-0"), map_pod("check-1")], cluster, cache)
    assert placed and cache.bound_count(key) == 0
    cache.confirm("uid-check-0")
    assert cache.bound_count(key) == 1
    cache.forget("uid-check-1")  # its Binding failed
    cache.release("uid-check-0")  # deleted
    assert cache.bound_count(key) == 0


def test_gpuplace_validate_prints_the_warning_and_passes(tmp_path: Path) -> None:
    path = tmp_path / "aks.yaml"
    path.write_text(map_yaml())
    _, diagnostics = check([str(path)])
    assert [d.severity for d in diagnostics] == ["warning"]
    assert (
        diagnostics[0]
        .format()
        .startswith(
            f"{path}:12:42: warning: spec.map: GPU 3 on node {NODES[3]} is listed by lines 11 and 12"
        )
    )
    path.write_text(map_yaml(sharing="exclusive"))
    _, diagnostics = check([str(path)])
    assert [d.severity for d in diagnostics] == ["error"]
