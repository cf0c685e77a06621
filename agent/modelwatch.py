"""The compiled model as the controller last wrote it (the model watch, `kubeio.configmapwatch`), narrowed
to the maps with a slot on this agent's node."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubeio.client import Kube
from kubeio.configmapwatch import ConfigMapWatch
from kubeio.informer import Informer
from placement.model import MODEL_CONFIGMAPS, CompiledMap, CompiledSlot
from placement.types import MapKey, NodeName

log = logging.getLogger(__name__)


class ModelWatch:
    """The maps with a slot on this agent's node, from the model watch (`kubeio.configmapwatch`)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        node: NodeName,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.node = node
        self.watch = ConfigMapWatch(kube, namespace, MODEL_CONFIGMAPS)
        self.watch.add_handler(lambda _event, _obj, _old: on_change())
        self.generation: int | None = None
        self._maps: tuple[CompiledMap, ...] | None = None

    @property
    def informer(self) -> Informer:
        return self.watch.informer

    def start(self) -> None:
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()

    def maps(self) -> tuple[CompiledMap, ...] | None:
        """The maps with a slot on this node from the newest complete model, the same tuple
        while nothing changed; None until a model (or the absence of one) has been read."""
        if not self.watch.informer.synced.is_set():
            return self._maps
        model = self.watch.read()
        if model is None or model.generation == self.generation:
            return self._maps
        self.generation = model.generation
        mine = tuple(
            cmap
            for cmap in sorted(model.maps.values(), key=lambda m: m.key)
            if any(slot.node == self.node for slot in cmap.slots.values())
        )
        # A new generation that leaves this node's slots as they were keeps the same tuple, so
        # the agent does not check again (most model changes concern other nodes).
        if self._maps is None or _slots(mine) != _slots(self._maps):
            self._maps = mine
            log.debug(
                "model generation %d: %d maps target node %s",
                model.generation,
                len(mine),
                self.node,
            )
        return self._maps


def _slots(maps: tuple[CompiledMap, ...]) -> list[tuple[MapKey, dict[int, CompiledSlot]]]:
    return [(m.key, dict(m.slots)) for m in maps]
