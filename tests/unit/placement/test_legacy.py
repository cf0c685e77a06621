"""The earlier tools' `gpu-scheduling-map` text: every documented example, every error and where
it points, alone and inside a PlacementMap's `map: |` block."""

from __future__ import annotations

import pytest

from placement.errors import PlacementError
from placement.legacy import (
    FORMAT_HINT,
    MAX_LEGACY_BYTES,
    parse_legacy,
    render_legacy,
    shared_gpus,
)
from placement.types import GpuUuid, Sharing
from placement.validate import MAX_MAP_BYTES, load_maps, parse_map

UUID_A = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00"


def entries(text: str) -> list[tuple[int, str, tuple[int | str, ...]]]:
    return [(e.index, e.node, e.devices) for e in parse_legacy(text, "annotation")]


def errors(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(PlacementError) as raised:
        parse_legacy(text, "annotation")
    return [(d.location.line, d.location.column, d.message) for d in raised.value.diagnostics]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0=node1:0,1", [(0, "node1", (0, 1))]),
        ("1=node2:2", [(1, "node2", (2,))]),
        ("2=node3:0,1,2", [(2, "node3", (0, 1, 2))]),
        (
            "3=aks-workerpool-25338008-vmss000004:3",
            [(3, "aks-workerpool-25338008-vmss000004", (3,))],
        ),
        (f"0=gpu-a-01:{UUID_A}", [(0, "gpu-a-01", (GpuUuid(UUID_A),))]),
        (" 4 = node4 : 0 , 1 ", [(4, "node4", (0, 1))]),
    ],
)
def test_every_example_of_the_earlier_tools(
    text: str, expected: list[tuple[int, str, tuple[int | str, ...]]]
) -> None:
    assert entries(text) == expected


def test_the_whole_example_with_comments_blank_lines_and_crlf() -> None:
    text = "# gpu map\r\n0=node1:0,1\r\n\r\n1=node2:2   # one GPU\r\n  \r\n2=node3:0,1,2\r\n"
    assert entries(text) == [(0, "node1", (0, 1)), (1, "node2", (2,)), (2, "node3", (0, 1, 2))]
    parsed = parse_legacy(text, "annotation")
    assert [(e.line, e.column) for e in parsed] == [(2, 1), (4, 1), (6, 1)]
    assert parsed[2].device_columns == (9, 11, 13)
    assert parsed[2].node_column == 3


def test_render_is_the_inverse_of_parse() -> None:
    text = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n"
    assert render_legacy(entries(text)) == text  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0node1:0", (1, 1, "missing '=' in '0node1:0'")),
        ("x=node1:0", (1, 1, "index 'x' is not a non-negative integer")),
        ("-1=node1:0", (1, 1, "index '-1' is not a non-negative integer")),
        ("100000=node1:0", (1, 1, "index 100000 is larger than 99999")),
        ("9" * 5000 + "=node1:0", (1, 1, f"index {'9' * 5000} is larger than 99999")),
        ("0=node1", (1, 3, "missing ':' between node and devices in '0=node1'")),
        ("0=:0", (1, 3, "empty node name")),
        ("0=node_1!:0", (1, 3, "node 'node_1!' is not a valid node name or label value")),
        ("0=node1:", (1, 9, "no devices listed for index 0")),
        ("0=node1:0,,1", (1, 11, "empty device")),
        ("0=node1:0,gpu1", (1, 11, "device 'gpu1' is neither an index nor a GPU UUID")),
        ("0=node1:256", (1, 9, "device index 256 is larger than 255")),
        ("0=node1:1" + "0" * 5000, (1, 9, f"device index 1{'0' * 5000} is larger than 255")),
        (
            "0=node1:1,2,1",
            (1, 13, "device 1 listed twice in this entry (first at line 1, column 9)"),
        ),
    ],
)
def test_each_malformed_line(text: str, expected: tuple[int, int, str]) -> None:
    assert errors(text) == [expected]


def test_every_malformed_line_is_reported_with_its_own_line() -> None:
    found = errors("0=node1:0\nbad\n\n  2=node3:x\n")
    assert found == [
        (2, 1, "missing '=' in 'bad'"),
        (4, 11, "device 'x' is neither an index nor a GPU UUID"),
    ]


def test_the_format_hint_comes_with_shape_errors() -> None:
    with pytest.raises(PlacementError) as raised:
        parse_legacy("nonsense", "annotation")
    assert raised.value.diagnostics[0].hint == FORMAT_HINT


def test_an_empty_text_has_no_entries() -> None:
    assert entries("# nothing yet\n\n") == []


MAP_FILE = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: webhook-test
  namespace: legacy
spec:
  map: |
    # index=node:devices
    0=node1:0,1

    1=node2:{one}
    2=node3:0,1,2
"""


def test_a_map_block_parses_into_slots() -> None:
    pmap = parse_map(MAP_FILE.format(one="2"), "webhook-test.yaml")
    assert [(s.index, s.node, s.devices) for s in pmap.slots] == [
        (0, "node1", (0, 1)),
        (1, "node2", (2,)),
        (2, "node3", (0, 1, 2)),
    ]
    # Each slot points at its line in the file, not in the block.
    assert [(s.location.line, s.location.column) for s in pmap.slots] == [(9, 5), (11, 5), (12, 5)]


def test_errors_in_a_map_block_point_at_the_file_line_and_column() -> None:
    result = load_maps(MAP_FILE.format(one="2,x"), "webhook-test.yaml")
    (d,) = result.diagnostics
    assert d.format().startswith(
        "webhook-test.yaml:11:15: error: spec.map: device 'x' is neither an index nor a GPU UUID"
    )


def test_a_map_block_after_leading_blank_lines_keeps_its_offsets() -> None:
    text = MAP_FILE.replace("  map: |\n", "  map: |\n\n").format(one="bad")
    (d,) = load_maps(text, "m.yaml").diagnostics
    assert (d.location.line, d.location.column) == (12, 13)


def test_an_indented_block_with_an_indentation_indicator() -> None:
    text = MAP_FILE.replace("  map: |\n", "  map: |2\n").format(one="bad")
    (d,) = load_maps(text, "m.yaml").diagnostics
    # `|2` states the indentation (2 past `map:`) that the parser would otherwise infer.
    assert (d.location.line, d.location.column) == (11, 13)


def test_a_one_line_map_points_into_its_line() -> None:
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + "  map: 0=node1:x\n"
    (d,) = load_maps(text, "m.yaml").diagnostics
    assert (d.location.line, d.location.column) == (7, 16)


def test_duplicate_index_in_a_map_block() -> None:
    text = MAP_FILE.format(one="2").replace("2=node3", "0=node3")
    (d,) = load_maps(text, "m.yaml").diagnostics
    assert (d.location.line, d.location.column) == (12, 5)
    assert d.message == "duplicate index 0 (first at line 9, column 5)"


def test_one_gpu_twice_in_an_exclusive_map_block() -> None:
    text = MAP_FILE.format(one="2").replace("2=node3:0,1,2", "2=node1:1")
    # Only a map that says so refuses legacy lines sharing a GPU; the default shares it.
    text += "  sharing: exclusive\n"
    (d,) = load_maps(text, "m.yaml").diagnostics
    assert (d.location.line, d.location.column) == (12, 5)
    assert d.message.startswith("device 1 on node node1 is already given to index 0 (line 9)")


def test_an_empty_map_block_is_an_error() -> None:
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + "  map: |\n    # nothing\n"
    (d,) = load_maps(text, "m.yaml").diagnostics
    assert d.message == "the map text has no entries"


AKS_TEXT = """\
0=aks-workerpool-25338008-vmss000000:0,1
1=aks-workerpool-25338008-vmss000001:2
2=aks-workerpool-25338008-vmss000003:0,1,2
3=aks-workerpool-25338008-vmss000004:3
4=aks-workerpool-25338008-vmss000004:3
"""


def test_lines_naming_one_gpu_share_it_with_a_located_warning() -> None:
    """The earlier tools' own example gives GPU 3 of the fourth node to lines 3 and 4."""
    block = "".join(f"    {line}\n" for line in AKS_TEXT.splitlines())
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + "  map: |\n" + block
    result = load_maps(text, "aks.yaml")
    assert result.diagnostics == []
    (pmap,) = result.maps
    assert pmap.legacy_sharing and pmap.sharing is Sharing.EXCLUSIVE
    (warning,) = pmap.warnings
    assert warning.format() == (
        "aks.yaml:12:42: warning: spec.map: GPU 3 on node aks-workerpool-25338008-vmss000004 is "
        "listed by lines 11 and 12 (indices 3 and 4): their pods share it, as the earlier tools "
        "did; every other map and pod is kept off it (say 'sharing: exclusive' to refuse this)"
    )


def test_explicit_sharing_exclusive_refuses_the_same_text() -> None:
    block = "".join(f"    {line}\n" for line in AKS_TEXT.splitlines())
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + "  sharing: exclusive\n  map: |\n" + block
    (d,) = load_maps(text, "aks.yaml").diagnostics
    assert d.format().startswith(
        "aks.yaml:13:5: error: spec.map: device 3 on node aks-workerpool-25338008-vmss000004 is "
        "already given to index 3 (line 12)"
    )


def test_placements_keep_sharing_only_with_sharing_shared() -> None:
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + (
        "  placements:\n"
        "    - {index: 3, node: n4, devices: [3]}\n"
        "    - {index: 4, node: n4, devices: [3]}\n"
    )
    (d,) = load_maps(text, "p.yaml").diagnostics
    assert "device 3 on node n4 is already given to index 3" in d.message
    shared = load_maps(text.replace("spec:\n", "spec:\n  sharing: shared\n"), "p.yaml")
    assert shared.diagnostics == [] and not shared.maps[0].legacy_sharing


def test_shared_gpus_lists_each_gpu_with_its_lines() -> None:
    (shared,) = shared_gpus(parse_legacy(AKS_TEXT, "annotation"))
    assert (shared.node, shared.device, shared.indices) == (
        "aks-workerpool-25338008-vmss000004",
        3,
        (3, 4),
    )
    shared_text = parse_legacy("0=a:0,1\n1=b:0\n2=a:1\n3=a:1,0\n", "x")
    assert {(s.node, s.device, s.indices) for s in shared_gpus(shared_text)} == {
        ("a", 0, (0, 3)),
        ("a", 1, (0, 2, 3)),
    }


def legacy_lines(count: int) -> str:
    return "".join(f"{i}=node{i % 100}:{i % 8}\n" for i in range(count))


def test_a_pod_annotation_longer_than_annotations_may_be_is_refused_unread() -> None:
    text = legacy_lines(30_000)
    assert len(text) > MAX_LEGACY_BYTES
    with pytest.raises(PlacementError) as caught:
        parse_legacy(text, "pod ml/web-0 annotation gpu-scheduling-map")
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.location.line, diagnostic.location.column) == (1, 1)
    assert f"more than a pod's annotations may hold together ({MAX_LEGACY_BYTES} bytes)" in (
        diagnostic.message
    )


def test_a_maps_long_legacy_block_is_bounded_by_its_file_not_by_the_annotation_limit() -> None:
    block = "".join(f"    {line}\n" for line in legacy_lines(30_000).splitlines())
    text = MAP_FILE.split("  map: |", maxsplit=1)[0] + "  map: |\n" + block
    assert MAX_LEGACY_BYTES < len(block) < MAX_MAP_BYTES
    pmap = parse_map(text, "big-legacy.yaml")
    assert len(pmap.slots) == 30_000
