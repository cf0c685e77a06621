"""What the informer threads hand to the model keeper: one type per kind of change.

The informer threads only put these in its inbox (`ChangeQueue.put`); its pass applies them in
order (`ModelKeeper.apply`), which matches on the type, so a kind of change without its handler
fails type checking.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.sources import Form
from kubeio.client import Obj
from placement.inventory import NodeInventory
from placement.types import NodeName


@dataclass(frozen=True, slots=True)
class SourceChanged:
    """A map's source (a labelled ConfigMap, or a PlacementMap) was added or changed."""

    obj: Obj
    form: Form = Form.CONFIGMAP


@dataclass(frozen=True, slots=True)
class SourceDeleted:
    obj: Obj
    form: Form = Form.CONFIGMAP


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    """The placement policy (its ConfigMap, or its PlacementPolicy) changed; `obj` is None when
    it was deleted."""

    obj: Obj | None
    form: Form = Form.CONFIGMAP


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
