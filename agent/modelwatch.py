"""The compiled model as the controller last wrote it, read through a watch (read-only).

The controller writes the model as a manifest and shards; what a half-written model means is
`placement.model.read_model`'s to say (the last complete model stays in use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubeio.client import Kube
from kubeio.informer import Informer
from kubeio.paths import CONFIGMAPS
from placement.model import MODEL_LABEL, CompiledMap, CompiledSlot, model_data, read_model
from placement.types import MapKey, NodeName

log = logging.getLogger(__name__)

_Versions = tuple[tuple[str, str], ...]


class ModelWatch:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        node: NodeName,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.node = node
        self.informer = Informer(
            kube,
            CONFIGMAPS.collection(namespace),
            label_selector=f"{MODEL_LABEL}=true",
            name="model",
        )
        self.informer.add_handler(lambda _event, _obj, _old: on_change())
        self.generation: int | None = None
        self._versions: _Versions | None = None
        self._maps: tuple[CompiledMap, ...] | None = None

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    def maps(self) -> tuple[CompiledMap, ...] | None:
        """The maps with a slot on this node from the newest complete model, the same tuple
        while nothing changed; None until a model (or the absence of one) has been read."""
        if not self.informer.synced.is_set():
            return self._maps
        with self.informer.lock:
            objects = list(self.informer.store.values())
        versions = tuple(
            sorted(
                (str(o["metadata"]["name"]), str(o["metadata"].get("resourceVersion", "")))
                for o in objects
            )
        )
        if versions == self._versions:
            return self._maps
        self._versions = versions
        try:
            model = read_model(model_data(objects))
        except ValueError as exc:
            kept = "none yet" if self.generation is None else f"generation {self.generation}"
            log.info("model not readable now (%s); checking against %s", exc, kept)
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
