"""The plan between two snapshots: maps and slots added, removed, moved, and maps turning invalid."""

from __future__ import annotations

from placement.diff import (
    MapChangeKind,
    RunningPod,
    SlotChangeKind,
    drifting_pods,
    format_plan,
    plan,
)
from placement.snapshot import load_snapshot

HEAD = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {{name: {name}, namespace: ml}}
spec:
  sharing: {sharing}
  placements:
"""


def map_file(name: str, *rows: str, sharing: str = "exclusive") -> str:
    return HEAD.format(name=name, sharing=sharing) + "".join(f"    - {r}\n" for r in rows)


BASE = {
    "llm.yaml": map_file(
        "llm",
        "{index: 0, node: gpu-1, devices: [0, 1]}",
        "{index: 1, node: gpu-1, devices: [2, 3]}",
        "{index: 2, node: gpu-2, count: 2}",
    ),
    "old.yaml": map_file("old", "{index: 0, node: gpu-3, devices: [0]}"),
    "stable.yaml": map_file("stable", "{index: 0, node: gpu-4, devices: [0]}"),
}


def test_no_changes() -> None:
    result = plan(load_snapshot(BASE), load_snapshot(BASE))
    assert result.changes == ()
    assert format_plan(result, "a", "b").endswith("No changes.")


def test_slots_added_removed_moved_and_changed() -> None:
    new = dict(BASE)
    new["llm.yaml"] = map_file(
        "llm",
        "{index: 0, node: gpu-1, devices: [0, 1]}",
        "{index: 1, node: gpu-5, devices: [2, 3]}",  # moved: node
        "{index: 2, node: gpu-2, count: 2, require: {minMemoryMiB: 80000}}",  # changed: require
        "{index: 3, node: gpu-2, devices: [7]}",  # added
        sharing="shared",
    )
    del new["old.yaml"]
    new["new.yaml"] = map_file("new", "{index: 0, node: gpu-6, devices: [0]}")
    result = plan(load_snapshot(BASE), load_snapshot(new))

    kinds = {str(c.id): c.kind for c in result.changes}
    assert kinds == {
        "ml/llm": MapChangeKind.CHANGED,
        "ml/new": MapChangeKind.ADDED,
        "ml/old": MapChangeKind.REMOVED,
    }
    llm = next(c for c in result.changes if str(c.id) == "ml/llm")
    assert [(s.kind, s.index) for s in llm.slots] == [
        (SlotChangeKind.MOVED, 1),
        (SlotChangeKind.CHANGED, 2),
        (SlotChangeKind.ADDED, 3),
    ]
    assert llm.settings == ("sharing: exclusive -> shared",)
    assert result.valid
    text = format_plan(result, "main", "working tree")
    assert text.splitlines() == [
        "Comparing main -> working tree",
        "",
        "~ map ml/llm (llm.yaml): changed",
        "    sharing: exclusive -> shared",
        "    ~ index 1 moved: gpu-1 devices 2,3 -> gpu-5 devices 2,3",
        "    ~ index 2 changed: gpu-2 count=2 -> gpu-2 count=2 (>= 80000 MiB)",
        "    + index 3: gpu-2 devices 7",
        "+ map ml/new (new.yaml): added, 1 slots",
        "    + index 0: gpu-6 devices 0",
        "- map ml/old (old.yaml): removed, 1 slots",
        "    - index 0: gpu-3 devices 0",
        "",
        "Plan: maps 1 added, 1 changed, 1 removed; slots 2 added, 1 removed, 1 moved, 1 changed.",
    ]


def test_a_device_change_is_a_move() -> None:
    new = dict(BASE, **{"stable.yaml": map_file("stable", "{index: 0, node: gpu-4, devices: [1]}")})
    (change,) = plan(load_snapshot(BASE), load_snapshot(new)).changes
    assert [(s.kind, s.describe()) for s in change.slots] == [
        (SlotChangeKind.MOVED, "~ index 0 moved: gpu-4 devices 0 -> gpu-4 devices 1")
    ]


def test_a_map_turning_invalid_is_not_removed_and_shows_its_errors() -> None:
    new = dict(
        BASE, **{"stable.yaml": map_file("stable", "{index: -1, node: gpu-4, devices: [0]}")}
    )
    result = plan(load_snapshot(BASE), load_snapshot(new))
    (change,) = result.changes
    assert change.kind is MapChangeKind.INVALID
    assert change.serving_slots == 1
    assert [d.format() for d in change.diagnostics] == [
        "stable.yaml:7:15: error: spec.placements[0].index: index -1 is negative"
    ]
    assert not result.valid
    text = format_plan(result, "main", "pr")
    assert (
        "! map ml/stable (stable.yaml): turns invalid; the controller keeps serving its last "
        "valid version (1 slots)"
    ) in text
    assert text.endswith("The new revision has errors.")


def test_a_file_that_no_longer_parses_turns_its_maps_invalid() -> None:
    new = dict(BASE, **{"stable.yaml": "apiVersion: [\n"})
    (change,) = plan(load_snapshot(BASE), load_snapshot(new)).changes
    assert change.kind is MapChangeKind.INVALID
    assert change.diagnostics[0].location.source == "stable.yaml"


def test_invalid_before_and_after_new_invalid_and_fixed() -> None:
    broken = map_file("stable", "{index: 0, node: gpu-4, devices: []}")
    old = dict(BASE, **{"stable.yaml": broken})
    new = dict(BASE, **{"extra.yaml": map_file("extra", "{index: 0, node: gpu-9, devices: [x]}")})
    new["stable.yaml"] = broken
    kinds = {str(c.id): c.kind for c in plan(load_snapshot(old), load_snapshot(new)).changes}
    assert kinds == {
        "ml/extra": MapChangeKind.NEW_INVALID,
        "ml/stable": MapChangeKind.STILL_INVALID,
    }
    fixed = plan(load_snapshot(old), load_snapshot(BASE)).changes
    assert [(str(c.id), c.kind, len(c.slots)) for c in fixed] == [
        ("ml/stable", MapChangeKind.FIXED, 1)
    ]


def test_new_conflicts_are_errors_of_the_plan() -> None:
    new = dict(BASE, **{"clash.yaml": map_file("clash", "{index: 0, node: gpu-4, devices: [0]}")})
    result = plan(load_snapshot(BASE), load_snapshot(new))
    assert [c.kind for c in result.changes] == [MapChangeKind.ADDED]
    assert len(result.errors) == 1
    assert result.errors[0].location.source == "clash.yaml"
    assert "is also claimed by exclusive map ml/stable index 0" in result.errors[0].message
    assert not result.valid


def test_json_summary_counts() -> None:
    new = dict(BASE)
    del new["old.yaml"]
    data = plan(load_snapshot(BASE), load_snapshot(new)).to_json()
    assert data["summary"]["mapsRemoved"] == 1
    assert data["summary"]["slotsRemoved"] == 1
    assert data["maps"][0]["slots"][0] == {
        "kind": "removed",
        "index": 0,
        "before": {"node": "gpu-3", "devices": [0], "count": None, "require": None},
        "after": None,
    }


def test_drifting_pods_are_those_on_moved_or_removed_slots_and_removed_maps() -> None:
    def doc(name: str, slots: str) -> str:
        return (
            "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
            f"metadata: {{name: {name}, namespace: ml}}\nspec:\n  placements: {slots}\n"
        )

    old = load_snapshot(
        {
            "a.yaml": doc(
                "a",
                "[{index: 0, node: n1, devices: [0]}, {index: 1, node: n1, devices: [1]}, {index: 2, node: n1, devices: [2]}]",
            ),
            "b.yaml": doc("b", "[{index: 0, node: n2, devices: [0]}]"),
        }
    )
    new = load_snapshot(
        {
            "a.yaml": doc(
                "a", "[{index: 0, node: n1, devices: [0]}, {index: 1, node: n3, devices: [1]}]"
            )
        }
    )
    pods = [RunningPod("ml", f"a-{i}", "a", i) for i in range(3)] + [
        RunningPod("ml", "b-0", "b", 0)
    ]
    found = {d.pod.name: d.reason for d in drifting_pods(plan(old, new), pods)}
    assert found == {"a-1": "SlotMoved", "a-2": "SlotRemoved", "b-0": "MapDeleted"}
