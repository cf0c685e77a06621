"""Every validation rule: its exact message and where it points (file:line:column and field)."""

from __future__ import annotations

import textwrap

import pytest

from placement.errors import PlacementError
from placement.types import GpuUuid, MapKey, Sharing
from placement.validate import load_maps, parse_map, parse_map_for
from tests.unit.webhook_builders import map_header

HEADER = map_header()
# The spec body below starts on line 7.
UUID_A = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00"


def body(spec: str) -> str:
    """`spec` written at any indentation, placed under `spec:`."""
    return textwrap.indent(textwrap.dedent(spec), "  ")


def problems(spec: str) -> list[tuple[int, int, str, str]]:
    """(line, column, field path, message) of every diagnostic for HEADER + spec."""
    result = load_maps(HEADER + body(spec), "m.yaml")
    assert not result.maps
    assert all(d.location.source == "m.yaml" for d in result.diagnostics)
    return [
        (d.location.line, d.location.column, d.location.path, d.message) for d in result.diagnostics
    ]


def one(spec: str) -> tuple[int, int, str, str]:
    found = problems(spec)
    assert len(found) == 1, found
    return found[0]


def test_a_valid_map_has_every_field_normalized() -> None:
    pmap = parse_map(
        HEADER
        + body(f"""\
          sharing: shared
          envMode: uuid
          placements:
            - index: 1
              node: gpu-a-02
              devices: [{UUID_A}]
            - index: 0
              node: gpu-a-01
              devices: [0, 1]
            - index: 2
              node: gpu-b-01
              count: 2
              require: {{product: "NVIDIA H100 80GB HBM3", minMemoryMiB: 80000}}
        """),
        "m.yaml",
    )
    assert pmap.key == MapKey("inference", "llm")
    assert pmap.sharing is Sharing.SHARED
    assert [s.index for s in pmap.slots] == [0, 1, 2]
    assert pmap.by_index[0].devices == (0, 1)
    assert pmap.by_index[1].devices == (GpuUuid(UUID_A),)
    assert pmap.by_index[2].count == 2
    assert pmap.by_index[2].require is not None
    assert pmap.by_index[2].require.min_memory_mib == 80000
    assert (pmap.by_index[1].location.line, pmap.by_index[1].location.column) == (10, 7)


def test_duplicate_index_points_at_the_second_entry_and_names_the_first() -> None:
    assert one("""\
      placements:
        - index: 0
          node: n1
          devices: [0]
        - index: 0
          node: n1
          devices: [1]
    """) == (11, 7, "spec.placements[1]", "duplicate index 0 (first at line 8, column 7)")


def test_duplicate_device_in_one_entry_points_at_the_repeat() -> None:
    assert one("""\
      placements:
        - index: 0
          node: n1
          devices: [0, 1, 0]
    """) == (
        10,
        23,
        "spec.placements[0].devices[2]",
        "device 0 listed twice in this entry (first at line 10, column 17)",
    )


def test_negative_index() -> None:
    assert one("""\
      placements:
        - index: -1
          node: n1
          devices: [0]
    """) == (8, 14, "spec.placements[0].index", "index -1 is negative")


def test_huge_index() -> None:
    assert one("""\
      placements:
        - index: 100000
          node: n1
          devices: [0]
    """) == (8, 14, "spec.placements[0].index", "index 100000 is larger than 99999")


def test_empty_device_list() -> None:
    result = load_maps(
        HEADER + "  placements:\n    - index: 0\n      node: n1\n      devices: []\n", "m.yaml"
    )
    (d,) = result.diagnostics
    assert (d.location.line, d.location.column, d.message) == (10, 16, "empty device list")
    assert d.hint == "list at least one device, or use 'count'"


def test_devices_and_count_together_points_at_count() -> None:
    assert one("""\
      placements:
        - index: 0
          node: n1
          devices: [0]
          count: 1
    """) == (11, 7, "spec.placements[0].count", "'devices' and 'count' are mutually exclusive")


def test_neither_devices_nor_count() -> None:
    assert one("""\
      placements:
        - index: 4
          node: n1
    """) == (8, 7, "spec.placements[0]", "placement index 4 needs 'devices', 'count' or 'mig'")


def test_unknown_field_points_at_the_key_and_suggests_the_right_one() -> None:
    result = load_maps(
        HEADER + "  placements:\n    - index: 0\n      node: n1\n      devics: [0]\n", "m.yaml"
    )
    (d,) = result.diagnostics
    assert (d.location.line, d.location.column) == (10, 7)
    assert d.location.path == "spec.placements[0].devics"
    assert d.message == "unknown field 'devics'"
    assert d.hint == "did you mean 'devices'?"
    assert d.format() == (
        "m.yaml:10:7: error: spec.placements[0].devics: unknown field 'devics' "
        "(did you mean 'devices'?)"
    )


def test_unknown_top_level_field() -> None:
    result = load_maps(HEADER + "  placements: []\nstatus: {}\n", "m.yaml")
    assert [(d.location.line, d.location.column, d.message) for d in result.diagnostics] == [
        (8, 1, "unknown field 'status'")
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"0"', "expected an integer, got string '0'"),
        ("1.5", "expected an integer, got number 1.5"),
        ("true", "expected an integer, got boolean True"),
        ("[0]", "expected an integer, got list"),
    ],
)
def test_wrong_type_of_index(value: str, message: str) -> None:
    assert one(f"""\
      placements:
        - index: {value}
          node: n1
          devices: [0]
    """) == (8, 14, "spec.placements[0].index", message)


def test_a_device_that_fits_no_type_gets_one_message_naming_both() -> None:
    assert one("""\
      placements:
        - index: 0
          node: n1
          devices: [1.5]
    """) == (
        10,
        17,
        "spec.placements[0].devices[0]",
        "expected an integer or a string, got number 1.5",
    )


def test_missing_required_field_points_at_its_mapping() -> None:
    assert one("""\
      placements:
        - index: 0
          devices: [0]
    """) == (8, 7, "spec.placements[0].node", "missing required field 'node'")


def test_device_given_to_two_entries_of_an_exclusive_map() -> None:
    found = problems("""\
      placements:
        - {index: 0, node: n1, devices: [0, 1]}
        - {index: 1, node: n2, devices: [1]}
        - {index: 2, node: n1, devices: [1]}
    """)
    assert found == [
        (
            10,
            7,
            "spec.placements[2]",
            "device 1 on node n1 is already given to index 0 (line 8); an exclusive map gives "
            "each GPU to one slot",
        )
    ]


def test_a_shared_map_may_give_one_device_to_several_entries() -> None:
    pmap = parse_map(
        HEADER
        + "  sharing: shared\n  placements:\n"
        + "    - {index: 0, node: n1, devices: [0]}\n    - {index: 1, node: n1, devices: [0]}\n",
        "m.yaml",
    )
    assert len(pmap.slots) == 2


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("-1", "device index -1 is negative"),
        ("256", "device index 256 is larger than 255"),
        ("gpu0", "device 'gpu0' is neither an NVML index, a GPU UUID nor a PCI bus ID"),
        ("GPU-1234", "device 'GPU-1234' is neither an NVML index, a GPU UUID nor a PCI bus ID"),
        (
            '"0000:18:00.8"',
            "device '0000:18:00.8' is neither an NVML index, a GPU UUID nor a PCI bus ID",
        ),
    ],
)
def test_bad_device(device: str, message: str) -> None:
    assert one(f"""\
      placements:
        - index: 0
          node: n1
          devices: [{device}]
    """) == (10, 17, "spec.placements[0].devices[0]", message)


@pytest.mark.parametrize(
    ("count", "message"),
    [("0", "count 0 is less than 1"), ("65", "count 65 is larger than 64")],
)
def test_count_bounds(count: str, message: str) -> None:
    assert one(f"""\
      placements:
        - index: 0
          node: n1
          count: {count}
    """) == (10, 14, "spec.placements[0].count", message)


def test_bad_node_name() -> None:
    assert one("""\
      placements:
        - index: 0
          node: "gpu node 1"
          devices: [0]
    """) == (
        9,
        13,
        "spec.placements[0].node",
        "node 'gpu node 1' is not a valid node name or label value",
    )


def test_enum_value() -> None:
    assert one("""\
      sharing: maybe
      placements: []
    """) == (7, 12, "spec.sharing", "sharing must be 'exclusive' or 'shared', got string 'maybe'")


def test_placements_and_map_together() -> None:
    assert one("""\
      placements: []
      map: "0=n1:0"
    """) == (8, 3, "spec.map", "'placements' and 'map' are mutually exclusive")


def test_neither_placements_nor_map() -> None:
    assert one("""\
      sharing: shared
    """) == (7, 3, "spec", "spec needs 'placements' or 'map'")


def test_wrong_api_version_and_bad_metadata_name_are_both_reported() -> None:
    text = HEADER.replace("v1alpha1", "v1").replace("name: llm", "name: LLM_1")
    result = load_maps(text + "  placements: []\n", "m.yaml")
    assert [(d.location.line, d.location.column, d.message) for d in result.diagnostics] == [
        (1, 13, "apiVersion must be 'gpuplace.io/v1alpha1', got 'gpuplace.io/v1'"),
        (4, 9, "metadata.name 'LLM_1' is not a valid DNS label (RFC 1123)"),
    ]


def test_yaml_syntax_error_is_located() -> None:
    result = load_maps(HEADER + "  placements: [\n", "m.yaml")
    (d,) = result.diagnostics
    assert d.location.line == 8
    assert d.message.startswith("YAML syntax: ")


def test_duplicate_yaml_key() -> None:
    result = load_maps(HEADER + "  placements: []\n  placements: []\n", "m.yaml")
    (d,) = result.diagnostics
    assert (d.location.line, d.location.column) == (8, 3)
    assert d.message == "duplicate key 'placements' (first at line 7)"


def test_a_tag_the_value_does_not_fit_is_an_error_not_a_crash() -> None:
    result = load_maps(HEADER + "  placements: []\n  sharing: !!int shared\n", "m.yaml")
    (d,) = result.diagnostics
    assert (d.location.line, d.location.column) == (8, 12)
    assert d.message == "value 'shared' does not fit its tag !!int"


def test_anchors_are_not_expanded_exponentially() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    # 10**12 leaves if expanded; not a PlacementMap, so it is only parsed.
    result = load_maps("\n".join(lines) + "\n", "bomb.yaml")
    assert result.other_documents == 1
    assert not result.diagnostics


def test_other_kinds_are_skipped() -> None:
    result = load_maps("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "cm.yaml")
    assert (result.maps, result.diagnostics, result.other_documents) == ([], [], 1)


def test_every_map_of_a_stream_and_every_error_of_every_document() -> None:
    good = HEADER + "  placements: [{index: 0, node: n1, devices: [0]}]\n"
    bad = HEADER + "  placements: [{index: -1, node: n1, devices: [0]}]\n"
    result = load_maps(good + "---\n" + bad, "two.yaml")
    assert len(result.maps) == 1
    (d,) = result.diagnostics
    # 7 lines, the separator, then the second document's placements on its 7th line.
    assert (d.location.line, d.message) == (15, "index -1 is negative")


def test_parse_map_wants_exactly_one_map() -> None:
    with pytest.raises(PlacementError) as raised:
        parse_map("apiVersion: v1\nkind: ConfigMap\n", "cm")
    assert raised.value.diagnostics[0].message == "expected exactly one PlacementMap, found 0"


def test_parse_map_for_checks_the_configmap_identity() -> None:
    text = HEADER + "  placements: [{index: 0, node: n1, devices: [0]}]\n"
    assert parse_map_for(text, "cm", MapKey("inference", "llm")).key == MapKey("inference", "llm")
    with pytest.raises(PlacementError) as raised:
        parse_map_for(text, "cm", MapKey("inference", "other"))
    assert raised.value.diagnostics[0].message == (
        "map declares inference/llm but is stored in ConfigMap inference/other"
    )


def test_an_unquoted_pci_bus_id_is_read_by_yaml_as_a_number_and_the_hint_says_so() -> None:
    doc = textwrap.dedent("""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementMap
        metadata: {name: m, namespace: ns}
        spec:
          placements:
            - {index: 0, node: n1, devices: [0000:18:00.0]}
    """)
    with pytest.raises(PlacementError) as raised:
        parse_map(doc, "m.yaml")
    (diagnostic,) = raised.value.diagnostics
    assert "got number" in diagnostic.message
    assert diagnostic.hint.startswith('quote a PCI bus ID ("0000:18:00.0")')
