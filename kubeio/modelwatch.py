"""The compiled model, read through a watch on its ConfigMaps: one implementation for the controller
(the stored model a new leader seeds from, the shards the writer compares against), the webhook and
the agents.

The controller writes the model as a manifest and shards; what a half-written model means is
`placement.model.read_model`'s to say: `read` keeps the last complete model until the next one is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from kubeio.client import Kube, Obj
from kubeio.informer import Handler, Informer
from kubeio.paths import CONFIGMAPS
from placement.model import MODEL_LABEL, Model, model_data, read_model

log = logging.getLogger(__name__)

_Versions = tuple[tuple[str, str], ...]


class ModelWatch:
    def __init__(self, kube: Kube, namespace: str) -> None:
        self.informer = Informer(
            kube,
            CONFIGMAPS.collection(namespace),
            label_selector=f"{MODEL_LABEL}=true",
            name="model",
        )
        self._lock = threading.Lock()
        self._versions: _Versions | None = None
        self._model: Model | None = None

    def add_handler(self, handler: Handler) -> None:
        self.informer.add_handler(handler)

    def start(self) -> ModelWatch:
        self.informer.start()
        return self

    def stop(self) -> None:
        self.informer.stop()

    def objects(self) -> list[Obj]:
        with self.informer.lock:
            return list(self.informer.store.values())

    def data(self) -> dict[str, dict[str, str]]:
        """The model ConfigMaps' data by name, as stored now (complete or not)."""
        return model_data(self.objects())

    def shards(self) -> Mapping[str, Mapping[str, str]]:
        """The same by ConfigMap name, for the writer to compare against."""
        return {str(o["metadata"]["name"]): o.get("data") or {} for o in self.objects()}

    def read(self) -> Model | None:
        """The newest complete model: read again only when a ConfigMap changed; the last
        complete one while the stored one is not (None before any was)."""
        objects = self.objects()
        versions = tuple(
            sorted(
                (str(o["metadata"]["name"]), str(o["metadata"].get("resourceVersion", "")))
                for o in objects
            )
        )
        with self._lock:
            if versions == self._versions:
                return self._model
            try:
                model = read_model(model_data(objects))
            except ValueError as exc:
                kept = "none yet" if self._model is None else f"generation {self._model.generation}"
                log.info("model not complete (%s); keeping %s", exc, kept)
                self._versions = versions
                return self._model
            self._versions = versions
            self._model = model
            return model
