"""Which node a map means: the one node resolver of compile and the binder.

A map names a node by its name or by a logical name: the value of a node label (`gpu-node-name`
by default, as the earlier tools had it). A name that is a node's wins; a logical name must be on
exactly one node. An ambiguous logical name resolves to nothing and says which nodes carry it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Set
from dataclasses import dataclass

from placement.types import NodeName


@dataclass(frozen=True, slots=True)
class NodeResolution:
    node: NodeName | None
    problem: str = ""  # why there is no node, for a message: not found, or ambiguous and where


def resolve_node(
    declared: str,
    nodes: Container[str],
    aliases: Mapping[str, Set[NodeName]],
    alias_label: str,
) -> NodeResolution:
    if declared in nodes:
        return NodeResolution(NodeName(declared))
    matches = aliases.get(declared, ())
    if len(matches) == 1:
        return NodeResolution(next(iter(matches)))
    if matches:
        names = ", ".join(sorted(matches))
        return NodeResolution(
            None, f"node {declared!r} is ambiguous: label {alias_label}={declared} is on {names}"
        )
    return NodeResolution(None, f"node {declared!r} not found")


def unique_aliases(
    labels: Mapping[NodeName, Mapping[str, str]], alias_label: str
) -> dict[str, NodeName]:
    """Logical name -> node, for the names `resolve_node` resolves: on exactly one node, and no
    node's own name (tools that read nodes once, e.g. `gpuplace plan` and `gpuplace move`)."""
    carriers: dict[str, list[NodeName]] = {}
    for node, node_labels in labels.items():
        if alias_label in node_labels:
            carriers.setdefault(node_labels[alias_label], []).append(node)
    return {
        name: nodes[0] for name, nodes in carriers.items() if len(nodes) == 1 and name not in labels
    }
