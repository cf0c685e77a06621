"""What the compiler compiles from: the valid maps (with their source version and provenance), the
nodes and their logical names, and the nodes' inventories; and which maps each change touches, so
that a build recompiles only those."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from placement.annotations import CLIQUE_LABEL
from placement.inventory import NodeInventory
from placement.maps import PlacementMap
from placement.model import Provenance
from placement.nodes import resolve_node
from placement.types import MapKey, NodeName


class CompileInputs:
    def __init__(self, alias_label: str) -> None:
        self.alias_label = alias_label
        self.maps: dict[MapKey, PlacementMap] = {}
        self.versions: dict[MapKey, str] = {}
        self.provenance: dict[MapKey, Provenance] = {}
        self.inventories: dict[NodeName, NodeInventory] = {}
        self._nodes: dict[NodeName, str | None] = {}  # node -> its alias label value
        self.cliques: dict[NodeName, str] = {}  # node -> its GPU clique label value
        self._aliases: dict[str, set[NodeName]] = defaultdict(set)
        #: node name or logical name -> the maps with a slot there
        self._by_node: dict[str, set[MapKey]] = defaultdict(set)
        self.dirty: set[MapKey] = set()  # maps to compile again

    def set_map(self, pmap: PlacementMap, version: str, provenance: Provenance | None) -> None:
        old = self.maps.get(pmap.key)
        if old is not None:
            for slot in old.slots:
                self._by_node[slot.node].discard(pmap.key)
        self.maps[pmap.key] = pmap
        self.versions[pmap.key] = version
        self.provenance[pmap.key] = provenance or Provenance()
        for slot in pmap.slots:
            self._by_node[slot.node].add(pmap.key)
        self.dirty.add(pmap.key)

    def remove_map(self, key: MapKey) -> None:
        old = self.maps.pop(key, None)
        if old is None:
            return
        for slot in old.slots:
            self._by_node[slot.node].discard(key)
        self.versions.pop(key, None)
        self.provenance.pop(key, None)
        self.dirty.add(key)

    def set_node(self, name: NodeName, labels: Mapping[str, str]) -> bool:
        """Records the node's labels; whether one that compiling reads changed."""
        clique_changed = self._set_clique(name, labels.get(CLIQUE_LABEL))
        alias = labels.get(self.alias_label)
        if name in self._nodes and self._nodes[name] == alias:
            return clique_changed
        self._forget_node(name)
        self._nodes[name] = alias
        if alias:
            self._aliases[alias].add(name)
            self.dirty |= self._by_node.get(alias, set())
        self.dirty |= self._by_node.get(name, set())
        return True

    def _set_clique(self, name: NodeName, clique: str | None) -> bool:
        if self.cliques.get(name) == clique:
            return False
        if clique:
            self.cliques[name] = clique
        else:
            self.cliques.pop(name, None)
        self._dirty_node(name)
        return True

    def remove_node(self, name: NodeName) -> None:
        self._set_clique(name, None)
        if name in self._nodes:
            self._forget_node(name)
            self.dirty |= self._by_node.get(name, set())

    def _forget_node(self, name: NodeName) -> None:
        alias = self._nodes.pop(name, None)
        if alias:
            self._aliases[alias].discard(name)
            self.dirty |= self._by_node.get(alias, set())

    def aliases(self) -> dict[str, frozenset[NodeName]]:
        """The alias index (logical name -> the nodes whose alias label carries it), a copy that
        stays as it is (the binder reads it on other threads)."""
        return {alias: frozenset(names) for alias, names in self._aliases.items() if names}

    def set_inventory(self, inventory: NodeInventory) -> None:
        if self.inventories.get(inventory.node) == inventory:
            return
        self.inventories[inventory.node] = inventory
        self._dirty_node(inventory.node)

    def remove_inventory(self, node: NodeName) -> None:
        if self.inventories.pop(node, None) is not None:
            self._dirty_node(node)

    def _dirty_node(self, node: NodeName) -> None:
        self.dirty |= self._by_node.get(node, set())
        alias = self._nodes.get(node)
        if alias:
            self.dirty |= self._by_node.get(alias, set())

    def resolve_node(self, declared: str) -> tuple[NodeName | None, str]:
        """The node a map means by `declared` (see `placement.nodes`). Returns (node, problem)."""
        found = resolve_node(declared, self._nodes, self._aliases, self.alias_label)
        return found.node, found.problem
