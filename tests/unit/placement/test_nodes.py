"""The one node resolver: compile and the binder read a map's node the same way."""

from __future__ import annotations

from placement.nodes import NodeResolution, resolve_node
from placement.types import NodeName

A, B, C = NodeName("gpu-a"), NodeName("gpu-b"), NodeName("node1")
NODES = {A, B, C}
ALIASES = {"node1": frozenset({A}), "twin": frozenset({A, B}), "solo": frozenset({B})}


def resolve(declared: str) -> NodeResolution:
    return resolve_node(declared, NODES, ALIASES, "gpu-node-name")


def test_a_node_name_wins_over_a_label_of_the_same_value() -> None:
    assert resolve("node1") == NodeResolution(C)


def test_a_logical_name_on_one_node_is_that_node() -> None:
    assert resolve("solo") == NodeResolution(B)


def test_an_ambiguous_logical_name_is_no_node_and_says_where() -> None:
    assert resolve("twin") == NodeResolution(
        None, "node 'twin' is ambiguous: label gpu-node-name=twin is on gpu-a, gpu-b"
    )


def test_an_unknown_name_is_no_node() -> None:
    assert resolve("nowhere") == NodeResolution(None, "node 'nowhere' not found")
