"""What the informer threads hand to the reconcile loop: one type per kind of change.

The informer threads only enqueue these (`ControllerManager._enqueue`); the reconcile loop applies
them in order (`ControllerManager._apply`), which matches on the type, so a kind of change without
its handler fails type checking.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeio.client import Obj
from placement.inventory import NodeInventory
from placement.types import NodeName


@dataclass(frozen=True, slots=True)
class SourceChanged:
    """A source ConfigMap (a placement map) was added or changed."""

    obj: Obj


@dataclass(frozen=True, slots=True)
class SourceDeleted:
    obj: Obj


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    """The placement policy ConfigMap changed; `obj` is None when it was deleted."""

    obj: Obj | None


@dataclass(frozen=True, slots=True)
class NodeChanged:
    obj: Obj
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class InventoryChanged:
    """A node's GPU inventory (agent report, or DRA ResourceSlices) changed; None: gone."""

    node: NodeName
    inventory: NodeInventory | None


Change = SourceChanged | SourceDeleted | PolicyChanged | NodeChanged | InventoryChanged
