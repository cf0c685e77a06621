"""In-place edits keep every byte outside the values they change."""

from __future__ import annotations

import difflib

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from placement.authoring import (
    SlotEdit,
    add_generators,
    add_resources,
    apply_slot_edits,
    listed_resources,
    maps_folder,
)
from placement.types import GpuUuid, MapKey
from placement.validate import parse_map
from placement.yamledit import YamlEdit, scalar

ODD = """\
# A map written by hand, with comments everywhere and odd spacing.
apiVersion:   gpuplace.io/v1alpha1   # the version
kind: PlacementMap
metadata: {name: serving, namespace: inference}
spec:
  # slots, by ordinal
  placements:
  -   index: 0          # first
      node:    gpu-a    # rack 3
      devices: [ 0,1 ]  # NVLink pair
      fallback:
        - 3
  -   index: 1
      node: 'gpu-b'
      count: 2     # picked by the controller
      require: {product: "NVIDIA H100 80GB HBM3"}
      # trailing comment of entry 1

  -   index: 2
      node: gpu-c
      devices:
      - GPU-c0000000-0000-4000-8000-0000000000c0
      - GPU-c1000000-0000-4000-8000-0000000000c1
# the end
"""

KEY = MapKey("inference", "serving")


def changed_lines(before: str, after: str) -> set[int]:
    """The 0-based lines of `before` that the edit replaced or removed."""
    out: set[int] = set()
    matcher = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            out.update(range(i1, i2))
    return out


def test_freeze_a_count_entry_changes_one_line() -> None:
    result = apply_slot_edits(
        {"m.yaml": ODD},
        [
            SlotEdit(
                KEY,
                1,
                "frozen",
                devices=(
                    GpuUuid("GPU-b1000000-0000-4000-8000-0000000000b1"),
                    GpuUuid("GPU-b2000000-0000-4000-8000-0000000000b2"),
                ),
            )
        ],
    )
    after = result.files["m.yaml"]
    assert (
        "      devices: [GPU-b1000000-0000-4000-8000-0000000000b1, GPU-b2000000-0000-4000-8000-0000000000b2]     # picked by the controller\n"
        in after
    )
    assert changed_lines(ODD, after) == {14}
    assert parse_map(after, "m.yaml").by_index[1].devices == (
        "GPU-b1000000-0000-4000-8000-0000000000b1",
        "GPU-b2000000-0000-4000-8000-0000000000b2",
    )


def test_move_keeps_comments_and_spacing_outside_the_changed_values() -> None:
    edits = [
        SlotEdit(
            KEY,
            0,
            "off gpu-a",
            node="gpu-d",
            devices=(GpuUuid("GPU-d0000000-0000-4000-8000-0000000000d0"),),
            fallback=(),
        ),
        SlotEdit(
            KEY,
            2,
            "off GPU-c1000000-0000-4000-8000-0000000000c1",
            devices=(
                GpuUuid("GPU-c0000000-0000-4000-8000-0000000000c0"),
                GpuUuid("GPU-c2000000-0000-4000-8000-0000000000c2"),
            ),
        ),
    ]
    after = apply_slot_edits({"m.yaml": ODD}, edits).files["m.yaml"]
    lines = ODD.splitlines()
    assert changed_lines(ODD, after) == {8, 9, 10, 11, 22}
    assert "      node:    gpu-d    # rack 3\n" in after
    assert "      devices: [GPU-d0000000-0000-4000-8000-0000000000d0]  # NVLink pair\n" in after
    assert "fallback" not in after
    # A block list stays a block list, at its column.
    assert (
        "      devices:\n      - GPU-c0000000-0000-4000-8000-0000000000c0\n      - GPU-c2000000-0000-4000-8000-0000000000c2\n# the end\n"
        in after
    )
    assert lines[17] in after and "# the end" in after
    pmap = parse_map(after, "m.yaml")
    assert pmap.by_index[0].node == "gpu-d" and pmap.by_index[0].fallback == ()
    assert pmap.by_index[2].devices == (
        "GPU-c0000000-0000-4000-8000-0000000000c0",
        "GPU-c2000000-0000-4000-8000-0000000000c2",
    )


def test_a_new_key_is_a_new_line_indented_like_its_siblings() -> None:
    edit = YamlEdit(ODD, "m.yaml")
    entry = edit.get(edit.documents[0], "spec", "placements", 1)
    assert entry is not None
    edit.set_pair(entry, "fallback", "[GPU-ee000000-0000-4000-8000-0000000000ee]", after="require")
    after = edit.result()
    assert (
        '      require: {product: "NVIDIA H100 80GB HBM3"}\n      fallback: [GPU-ee000000-0000-4000-8000-0000000000ee]\n'
        in after
    )
    assert changed_lines(ODD, after) == set()  # only an inserted line
    assert len(after.splitlines()) == len(ODD.splitlines()) + 1


def test_unknown_slot_and_legacy_text_are_reported_not_written() -> None:
    legacy = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata:\n  name: old\n"
        "  namespace: ns\nspec:\n  map: |\n    0=n1:0\n"
    )
    result = apply_slot_edits(
        {"a.yaml": ODD, "b.yaml": legacy},
        [
            SlotEdit(KEY, 7, "x", node="n"),
            SlotEdit(MapKey("ns", "old"), 0, "x", node="n2"),
        ],
    )
    assert result.files == {}
    whys = sorted(s.why for s in result.unwritten)
    assert whys[0].startswith("legacy `map:` text in b.yaml")
    assert whys[1] == "no file of the repository declares this slot"


def test_kustomization_gains_entries_and_keeps_its_bytes() -> None:
    before = (
        "# cluster dev\nresources:\n  - namespaces.yaml   # first\n\nconfigMapGenerator:\n"
        "  - name: a\n    namespace: x\n    files:\n      - placement.yaml=placement/a.yaml\n"
        "# a trailing comment\n"
    )
    assert maps_folder(before, "k.yaml") == "placement"
    after = add_generators(before, "k.yaml", [(MapKey("ns", "b"), "placement/b.yaml")])
    assert after.startswith(before.split("# a trailing comment", maxsplit=1)[0])
    assert after.endswith("# a trailing comment\n")
    assert (
        "  - name: b\n    namespace: ns\n    files:\n      - placement.yaml=placement/b.yaml\n"
        in after
    )
    assert changed_lines(before, after) == set()
    fresh = add_generators("kind: Kustomization\n", "k.yaml", [(MapKey("ns", "b"), "maps/b.yaml")])
    assert fresh.startswith("kind: Kustomization\nconfigMapGenerator:\n  - name: b\n")


@pytest.mark.parametrize(
    "value",
    [
        "GPU-5c1d0c3e-aaaa",
        "gpu-node-1",
        "true",
        "0000:18:00.0",
        "1e3",
        "a: b",
        "",
        "-x",
        ".inf",
        "\x85\u2028",
    ],
)
def test_scalars_read_back_as_themselves(value: str) -> None:
    assert yaml.safe_load(f"k: {scalar(value)}")["k"] == value


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30))
def test_any_string_reads_back(value: str) -> None:
    assert yaml.safe_load(f"k: {scalar(value)}")["k"] == value


def test_an_empty_configmapgenerator_gets_its_first_entries_under_its_key() -> None:
    before = "kind: Kustomization\nconfigMapGenerator:\n# later\nresources: [a.yaml]\n"
    after = add_generators(before, "k.yaml", [(MapKey("ml", "m"), "maps/m.yaml")])
    assert after.startswith("kind: Kustomization\nconfigMapGenerator:\n  - name: m\n")
    assert after.endswith("# later\nresources: [a.yaml]\n")
    generated = yaml.safe_load(after)["configMapGenerator"]
    assert generated[0]["files"] == ["placement.yaml=maps/m.yaml"]


def test_an_empty_flow_list_of_generators_gets_its_first_entries() -> None:
    before = "kind: Kustomization\nconfigMapGenerator: []\nresources: [a.yaml]\n"
    after = add_generators(before, "k.yaml", [(MapKey("ml", "m"), "maps/m.yaml")])
    assert after.startswith("kind: Kustomization\nconfigMapGenerator:\n  - name: m\n")
    assert after.endswith("resources: [a.yaml]\n")
    assert yaml.safe_load(after)["configMapGenerator"][0]["name"] == "m"


def test_maps_served_as_resources_are_listed_after_the_others() -> None:
    """After `gpuplace migrate` a kustomization lists its maps under resources and generates no
    ConfigMap: imported maps are listed the same way, every other byte kept."""
    before = (
        "kind: Kustomization\n"
        "resources:\n"
        "  - maps/llm.yaml   # the serving map\n"
        "  - policy.yaml\n"
        "namespace: ml\n"
    )
    assert listed_resources(before, "k.yaml") == (["maps/llm.yaml", "policy.yaml"], False)
    after = add_resources(before, "k.yaml", ["maps/vllm.yaml"])
    assert after == before.replace("  - policy.yaml\n", "  - policy.yaml\n  - maps/vllm.yaml\n")
    generated = "kind: Kustomization\nresources: [a.yaml]\nconfigMapGenerator:\n  - name: m\n"
    assert listed_resources(generated, "k.yaml") == (["a.yaml"], True)
