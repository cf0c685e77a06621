"""The webhook reads a pod's gpu-scheduling-map text at a cost that does not grow with the text:
nothing for a name without an ordinal, then the pod's own line and a bounded number of lines on
the same node (`own_line`); the binder still reads every line (`pod_line`)."""

from __future__ import annotations

import pytest

from placement.errors import PlacementError
from placement.legacy import declared_indices, own_line, pod_line, shared_gpus

SOURCE = "pod ns/web-1 annotation gpu-scheduling-map"


def test_a_name_without_an_ordinal_reads_nothing() -> None:
    line = own_line("not a line at all\n" * 1000, "web", SOURCE)
    assert line.index is None and line.entry is None and line.entries == ()


def test_the_own_line_is_read_and_located_as_the_full_parse_locates_it() -> None:
    text = "# header\r\n0=node1:0\r\n\r\n1=node2:1,2  # two GPUs\r\n"
    full, own = pod_line(text, "web-1", SOURCE), own_line(text, "web-1", SOURCE)
    assert own.entry == full.entry and own.index == 1
    with pytest.raises(PlacementError) as broken:
        own_line("0=node1:0\n 01 = node2:x\n", "web-1", SOURCE)
    assert f"{SOURCE}:2:" in broken.value.format() and "'x'" in broken.value.format()


def test_other_lines_are_left_to_the_binder() -> None:
    text = "0=node1:0\n1=node2:1\n2=node3:oops\n"
    assert own_line(text, "web-1", SOURCE).entry is not None
    with pytest.raises(PlacementError):
        pod_line(text, "web-1", SOURCE)


def test_a_missing_line_and_the_declared_indices() -> None:
    text = "0=node1:0\n\n 7 = node2:1\n"
    assert own_line(text, "web-3", SOURCE).entry is None
    assert declared_indices(text) == [0, 7]
    assert own_line(text, "web-7", SOURCE).entry is not None


def test_lines_sharing_a_gpu_are_found_among_the_same_nodes_lines() -> None:
    text = "0=n1:0\n1=n2:3\n2=n2:1\n3=n2:3\n"
    own = own_line(text, "web-3", SOURCE)
    assert [s.indices for s in shared_gpus(own.entries)] == [
        s.indices for s in shared_gpus(pod_line(text, "web-3", SOURCE).entries)
    ]


def test_the_lines_read_per_create_are_bounded() -> None:
    text = "\n".join(f"{i}=n1:{i % 8}" for i in range(5000))
    own = own_line(text, "web-4999", SOURCE, max_partners=16)
    assert own.entry is not None and own.entry.index == 4999
    assert len(own.entries) <= 17
