"""What the model keeper publishes for every other reconciler: one immutable snapshot (the model, each
map's source state, the compiler's reports, the grants' verdicts), replaced whole by one reference
assignment after each pass of the model's queue. Readers take `Published.current` once per reconcile
and work on that: what they see is one pass's state, never half of the next, and no reader calls the
model keeper or reaches into it (docs/architecture.md, The controller)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from controller.inventories import InventoryTracker
from controller.nodekeeper import NodeKeeper
from controller.policystatus import PolicyVerdict
from controller.sources import Form, SourceState
from kubeio.client import Obj
from placement.binding import Cluster
from placement.compile import MapReport
from placement.errors import Diagnostic
from placement.model import Model
from placement.types import MapKey


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One pass of the model keeper: never changed after it is published."""

    model: Model = field(default_factory=Model)
    #: Maps with sharing: shared (read on every pod event); a set never changed once published.
    shared: set[str] = field(default_factory=set)
    #: The state each map is served from.
    sources: Mapping[MapKey, SourceState] = field(default_factory=_empty)
    #: Each map's state in each form that declares it (ConfigMap, custom resource).
    forms: Mapping[MapKey, Mapping[Form, SourceState]] = field(default_factory=_empty)
    reports: Mapping[MapKey, MapReport] = field(default_factory=_empty)
    #: Maps the placement policy denies, and why.
    denied: Mapping[MapKey, tuple[Diagnostic, ...]] = field(default_factory=_empty)
    #: The policy's objects by form, and the verdict on each (for their status).
    policy_objects: Mapping[Form, Obj] = field(default_factory=_empty)
    verdicts: Mapping[Form, PolicyVerdict] = field(default_factory=_empty)


class Published:
    """The current snapshot: `swap` by the model keeper alone, `current` by any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = Snapshot()

    @property
    def current(self) -> Snapshot:
        return self._current

    def swap(self, snapshot: Snapshot) -> Snapshot:
        """Publishes `snapshot`; returns the one it replaces."""
        with self._lock:
            before, self._current = self._current, snapshot
        return before


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the binder and the rollouts plan against: the published model with the nodes and the
    inventories as their own rooms keep them (each guarded there)."""

    published: Published
    nodes: NodeKeeper
    tracker: InventoryTracker
    require_inventory: bool
    alias_label: str

    def __call__(self) -> Cluster:
        return Cluster(
            self.published.current.model,
            self.nodes.nodes,
            self.nodes.aliases,
            self.tracker.states,
            self.require_inventory,
            self.alias_label,
        )
