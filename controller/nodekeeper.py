"""Nodes: their state as the binder needs it (Ready, schedulable, logical alias), the alias index,
and the inventories of deleted nodes. Applies node changes in the model keeper's pass (the caller holds
the inbox's lock); the leader removes what no agent will renew any more."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from controller.grantkeeper import GrantKeeper
from controller.inventories import InventoryTracker
from kubeio.client import Kube, Obj, obj_key
from kubeio.errors import APIError, APINotFoundError
from kubeio.informer import Informer
from kubeio.paths import CONFIGMAPS, LEASES
from placement.binding import NodeState
from placement.compile import Compiler
from placement.types import NodeName
from placement.wake import WakeKey

log = logging.getLogger(__name__)


def node_state(obj: Obj, alias_label: str) -> NodeState:
    conditions = obj.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    labels = obj["metadata"].get("labels") or {}
    return NodeState(
        NodeName(obj_key(obj)[1]),
        ready,
        not obj.get("spec", {}).get("unschedulable", False),
        labels.get(alias_label),
    )


@dataclass(eq=False)
class NodeKeeper:
    kube: Kube
    inventory_namespace: str
    alias_label: str
    compiler: Compiler
    grants: GrantKeeper
    nodes: dict[NodeName, NodeState] = field(default_factory=dict, init=False)
    #: logical name (the alias label's value) -> the nodes that carry it
    aliases: dict[str, frozenset[NodeName]] = field(default_factory=dict, init=False)
    _aliases_dirty: bool = field(default=False, init=False)

    def apply(self, obj: Obj, deleted: bool, leading: bool) -> set[WakeKey] | None:
        """One node event; returns the binder keys it may unblock, None when nothing the binder
        reads changed (a heartbeat). A deleted node's inventory goes too when `leading`."""
        name = NodeName(obj_key(obj)[1])
        before = self.nodes.get(name)
        after: NodeState | None = None
        if deleted:
            self.grants.set_node(name, None)
            self.nodes.pop(name, None)
            self.compiler.remove_node(name)
            if leading:
                self.remove_inventory(name)
        else:
            labels = dict(obj["metadata"].get("labels") or {})
            self.grants.set_node(name, labels)
            after = node_state(obj, self.alias_label)
            # The compiler reads a label the binder does not (the GPU clique, for `sameClique`).
            recompile = self.compiler.set_node(name, labels)
            if before == after:
                return set() if recompile else None
            self.nodes[name] = after
        if (before and before.alias) or (after and after.alias):
            self._aliases_dirty = True
        keys = {WakeKey.node(name), WakeKey.nodes()}
        for seen in (before, after):
            if seen is not None and seen.alias:
                keys.add(WakeKey.node(seen.alias))
        return keys

    def refresh_aliases(self) -> None:
        """Takes the compiler's alias index if a node's alias changed since the last call (one
        index: the compiler resolves maps by it, the binder reads this copy)."""
        if not self._aliases_dirty:
            return
        self._aliases_dirty = False
        self.aliases = self.compiler.aliases()

    def remove_inventory(self, node: NodeName) -> None:
        """A deleted node's inventory and Lease go with it: no agent renews them any more, and
        a node of the same name joining later starts from its own agent's report. Pods bound to
        the node keep their holdings until they are gone (the pod garbage collector deletes
        them), so their GPUs are not handed out twice meanwhile."""
        ns = self.inventory_namespace
        for path in (CONFIGMAPS.item(node, ns), LEASES.item(node, ns)):
            try:
                self.kube.delete(path)
            except APINotFoundError:
                pass
            except APIError as exc:
                log.warning("inventory of deleted node %s not removed: %s", node, exc)

    def sweep_inventories(self, inventories: Informer, tracker: InventoryTracker) -> None:
        """Removes inventories of nodes that no longer exist and whose Lease nobody renews
        (nodes deleted while no controller was leading)."""
        with inventories.lock:
            names = [n for (_ns, n) in inventories.store]
        for name in names:
            node = NodeName(name)
            if node in self.nodes or name == "kube-root-ca.crt":
                continue
            state = tracker.states.get(node)
            if state is None or not state.fresh:
                self.remove_inventory(node)
