"""Node inventories: the agents' ConfigMaps, judged fresh or stale by their Leases, with the DRA
taints of their devices overlaid (dra enforcement).

A Lease is stale when this process has not seen it renewed for its leaseDurationSeconds (agents set
that to three renewal intervals). Time is this process's own clock from the last observed change,
so clock skew between nodes does not matter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from controller.workqueue import Requeue
from kubeio.client import Obj, obj_key
from placement.binding import InventoryState
from placement.inventory import INVENTORY_KEY, NodeInventory, SourcedTaint
from placement.types import NodeName

log = logging.getLogger(__name__)

#: The expiry queue's one key: every inventory re-judged, once a second.
EXPIRY: Final = "inventories"
EXPIRY_SECONDS = 1.0


class InventoryTracker:
    """Written by the inventories' and leases' informer threads, the expiry queue's worker and
    (`retaint_all`) the taints queue's worker, under one lock; `states` is read
    by the binder and `on_change` is called under that lock. The inventory served (to `states`
    and `on_change`) is the agent's with `taints_of(node)` overlaid: the compiler and the binder
    see the same taints."""

    def __init__(
        self,
        on_change: Callable[[NodeName, NodeInventory | None], None],
        taints_of: Callable[[NodeName], Mapping[str, tuple[SourcedTaint, ...]]] = lambda _n: {},
    ) -> None:
        self.on_change = on_change  # called with the inventory to serve, or None when gone/stale
        #: A node's DRA device taints by GPU or MIG UUID; none outside dra enforcement.
        self.taints_of = taints_of
        self.states: dict[NodeName, InventoryState] = {}
        self._inventories: dict[NodeName, NodeInventory] = {}
        #: What is served: `_inventories` with their taints, made when either changes (the expiry
        #: timer re-judges every node every second and must stay cheap).
        self._served: dict[NodeName, NodeInventory] = {}
        self._renewed: dict[NodeName, tuple[str, float, float]] = {}  # renewTime, seen, duration
        self._lock = threading.RLock()

    def on_configmap(self, event: str, obj: Obj, _old: Obj | None) -> None:
        node = NodeName(obj_key(obj)[1])
        with self._lock:
            if event == "DELETED":
                self._inventories.pop(node, None)
            else:
                text = (obj.get("data") or {}).get(INVENTORY_KEY)
                if text is None:  # not an inventory (e.g. kube-root-ca.crt)
                    return
                try:
                    inventory = NodeInventory.from_json(text)
                except ValueError as exc:
                    log.warning("ignoring inventory of %s: %s", node, exc)
                    return
                if inventory.node != node:
                    log.warning("inventory %s names node %s; ignored", node, inventory.node)
                    return
                if self._inventories.get(node) == inventory:
                    return
                self._inventories[node] = inventory
            self._overlay(node)
            self._publish(node)

    def on_lease(self, event: str, obj: Obj, _old: Obj | None) -> None:
        node = NodeName(obj_key(obj)[1])
        with self._lock:
            if event == "DELETED":
                self._renewed.pop(node, None)
            else:
                spec = obj.get("spec") or {}
                renew = str(spec.get("renewTime", ""))
                duration = float(spec.get("leaseDurationSeconds") or 30)
                last = self._renewed.get(node)
                if last is None or last[0] != renew:
                    self._renewed[node] = (renew, time.monotonic(), duration)
            self._publish(node)

    def retaint(self, node: NodeName) -> None:
        """The node's devices' taints changed: its inventory is served again with them. A node
        without an agent inventory stays without one (its taints reach the binder's DRA check)."""
        with self._lock:
            self._overlay(node)
            self._publish(node)

    def _overlay(self, node: NodeName) -> None:
        inventory = self._inventories.get(node)
        if inventory is None:
            self._served.pop(node, None)
        else:
            self._served[node] = inventory.with_taints(self.taints_of(node))

    def _fresh(self, node: NodeName) -> bool:
        last = self._renewed.get(node)
        return last is not None and time.monotonic() - last[1] <= last[2]

    def _publish(self, node: NodeName) -> None:
        inventory = self._served.get(node)
        before = self.states.get(node)
        if inventory is None:
            if before is not None:
                del self.states[node]
                self.on_change(node, None)
            return
        state = InventoryState(inventory, self._fresh(node))
        if before != state:
            self.states[node] = state
            self.on_change(node, inventory if state.fresh else None)

    def inventories(self) -> dict[NodeName, NodeInventory]:
        """Every node's inventory as its agent last published it, fresh or not (a snapshot)."""
        with self._lock:
            return dict(self._inventories)

    def check_expiry(self) -> None:
        """Re-judges freshness (no API calls)."""
        with self._lock:
            for node in list(self._inventories):
                self._publish(node)

    def expire(self, _keys: list[str]) -> Requeue[str]:
        """The expiry queue's reconcile: every inventory now, and again in a second (it looks
        at every inventory: once a second is enough)."""
        self.check_expiry()
        return {EXPIRY: EXPIRY_SECONDS}

    def retaint_all(self, nodes: list[NodeName]) -> None:
        """The taints queue's reconcile (dra enforcement): the nodes whose devices' taints the
        DRA tracker saw change."""
        for node in nodes:
            self.retaint(node)
