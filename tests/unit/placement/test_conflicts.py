"""Cross-map checks on declared maps (no inventory) and how a tree of files is grouped by cluster."""

from __future__ import annotations

from placement.conflicts import find_conflicts, find_duplicate_maps
from placement.errors import Location
from placement.maps import DeclaredSlot, PlacementMap
from placement.snapshot import load_snapshot, scope_of
from placement.types import DeviceRef, GpuUuid, MapKey, Sharing

UUID_A = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00")


def declared(
    namespace: str,
    name: str,
    *slots: tuple[int, str, tuple[DeviceRef, ...]],
    sharing: Sharing = Sharing.EXCLUSIVE,
) -> PlacementMap:
    return PlacementMap(
        MapKey(namespace, name),
        tuple(
            DeclaredSlot(i, node, devs, location=Location(f"{name}.yaml", 7 + i, 7))
            for i, node, devs in slots
        ),
        sharing,
    )


def test_two_exclusive_maps_claiming_one_gpu_conflict_naming_both_maps_and_entries() -> None:
    llm = declared("inference", "llm", (0, "gpu-a-01", (0, 1)))
    train = declared("training", "jobs", (0, "gpu-b-01", (0,)), (1, "gpu-a-01", (1,)))
    (conflict,) = find_conflicts([train, llm])
    d = conflict.diagnostic()
    assert (d.location.source, d.location.line, d.location.column) == ("jobs.yaml", 8, 7)
    assert d.message == (
        "device 1 on node gpu-a-01 of exclusive map training/jobs index 1 (jobs.yaml:8:7) is also "
        "claimed by exclusive map inference/llm index 0 (llm.yaml:7:7); an exclusive slot needs "
        "its GPU to itself"
    )
    assert d.hint == "use another device, or set 'sharing: shared' in both maps"


def test_shared_maps_may_overlap_but_an_exclusive_one_may_not_join_them() -> None:
    a = declared("x", "a", (0, "n1", (0,)), sharing=Sharing.SHARED)
    b = declared("y", "b", (0, "n1", (0,)), sharing=Sharing.SHARED)
    assert find_conflicts([a, b]) == []
    c = declared("z", "c", (0, "n1", (0,)))
    (conflict,) = find_conflicts([a, b, c])
    assert (conflict.first.map, conflict.second.map) == (MapKey("x", "a"), MapKey("z", "c"))


def test_other_nodes_other_devices_and_other_spellings_do_not_conflict() -> None:
    a = declared("x", "a", (0, "n1", (0,)), (1, "n2", (UUID_A,)))
    b = declared("y", "b", (0, "n2", (0,)), (1, "n1", (1,)))
    # Index 0 on n2 may be UUID_A: only the compiler, with the inventory, can tell.
    assert find_conflicts([a, b]) == []


def test_entries_of_one_map_are_not_cross_map_conflicts() -> None:
    a = declared("x", "a", (0, "n1", (0,)), (1, "n1", (0,)), sharing=Sharing.SHARED)
    assert find_conflicts([a]) == []


def test_a_map_declared_twice() -> None:
    a = declared("x", "a", (0, "n1", (0,)))
    (d,) = find_duplicate_maps([(a, Location("one.yaml", 4, 9)), (a, Location("two.yaml", 4, 9))])
    assert d.format() == (
        "two.yaml:4:9: error: map x/a is declared twice (first at one.yaml:4:9) (each map is one "
        "ConfigMap: give one of them another metadata.name)"
    )


MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {{name: {name}, namespace: ml}}
spec:
  placements:
    - {{index: 0, node: gpu-1, devices: [0]}}
"""


def test_scope_is_the_nearest_directory_with_a_kustomization() -> None:
    roots = frozenset({"clusters/dev", "clusters/prod", "."})
    assert scope_of("clusters/dev/maps/a.yaml", roots) == "clusters/dev"
    assert scope_of("clusters/prod/a.yaml", roots) == "clusters/prod"
    assert scope_of("other/a.yaml", roots) == ""
    assert scope_of("a.yaml", frozenset()) == ""


def test_clusters_are_checked_separately() -> None:
    files = {
        "clusters/dev/kustomization.yaml": "resources: []\n",
        "clusters/prod/kustomization.yaml": "resources: []\n",
        "clusters/dev/a.yaml": MAP.format(name="a"),
        "clusters/prod/a.yaml": MAP.format(name="a"),
    }
    snapshot = load_snapshot(files)
    # Same name, same node and GPU: fine in two clusters (warnings only: nothing generates them).
    assert snapshot.errors == []
    assert len(snapshot.maps) == 2
    files["clusters/dev/b.yaml"] = MAP.format(name="a")
    files["clusters/dev/c.yaml"] = MAP.format(name="c")
    errors = [d.format() for d in load_snapshot(files).errors]
    assert errors == [
        "clusters/dev/b.yaml:3:18: error: map ml/a is declared twice (first at "
        "clusters/dev/a.yaml:3:18) (each map is one ConfigMap: give one of them another "
        "metadata.name)",
        "clusters/dev/c.yaml:6:7: error: spec.placements[0]: device 0 on node gpu-1 of exclusive "
        "map ml/c index 0 "
        "(clusters/dev/c.yaml:6:7) is also claimed by exclusive map ml/a index 0 "
        "(clusters/dev/a.yaml:6:7); an exclusive slot needs its GPU to itself (use another "
        "device, or set 'sharing: shared' in both maps)",
    ]


def test_invalid_documents_keep_the_map_they_meant_to_be() -> None:
    snapshot = load_snapshot(
        {
            "a.yaml": MAP.format(name="a").replace("[0]", "[-1]"),
            "b.yaml": "kind: PlacementMap\nspec: [unclosed\n",
            "chart/template.yaml": "{{- if .Values.enabled }}\nkind: ConfigMap\n",
        }
    )
    ids = sorted((bad.source, str(bad.id)) for bad in snapshot.invalid)
    assert ids == [("a.yaml", "ml/a"), ("b.yaml", "None"), ("chart/template.yaml", "None")]
    # A file meant to be a map that does not parse is an error; a template is only a warning.
    assert [d.location.source for d in snapshot.errors] == ["a.yaml", "b.yaml"]
    (warning,) = [d for d in snapshot.diagnostics if d.severity == "warning"]
    assert warning.location.source == "chart/template.yaml"
    assert warning.message.startswith("skipped, not YAML: YAML syntax:")
