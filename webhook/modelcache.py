"""The compiled model as the webhook sees it: fed by the model watch (`kubeio.configmapwatch`); the last
complete model keeps serving while a write is seen half-way."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from kubeio.client import Kube
from kubeio.configmapwatch import ConfigMapWatch
from placement.model import MODEL_CONFIGMAPS, Model

log = logging.getLogger(__name__)


class ModelSource(Protocol):
    def current(self) -> Model:
        """The model to admit against now."""
        ...

    def loaded(self) -> bool:
        """Whether a model has been loaded since start (readiness)."""
        ...


@dataclass(frozen=True, slots=True)
class StaticModel:
    """A fixed model (tests, benchmarks)."""

    model: Model

    def current(self) -> Model:
        return self.model

    def loaded(self) -> bool:
        return True


class ModelCache:
    """The model as the model watch reads it (ConfigMaps labelled
    `gpuplace.io/model=true` in the system namespace), decoded on a thread of its own, off the
    informer's: a burst of shard events (one model write) collapses into one rebuild."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._watch = ConfigMapWatch(kube, namespace, MODEL_CONFIGMAPS)
        self._watch.add_handler(lambda _event, _obj, _old: self._dirty.set())
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._model = Model()
        self._thread = threading.Thread(target=self._run, name="model-cache", daemon=True)

    def current(self) -> Model:
        return self._model  # one reference read: a request sees one whole model

    def loaded(self) -> bool:
        return self._loaded.is_set()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout)

    def start(self) -> ModelCache:
        self._watch.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._watch.stop()

    def _run(self) -> None:
        while not self._watch.informer.wait_synced(0.5):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            self._dirty.clear()
            self.rebuild()
            self._dirty.wait()

    def rebuild(self) -> None:
        started = time.perf_counter()
        model = self._watch.read()
        if model is None:
            return
        if model.generation != self._model.generation or not self._loaded.is_set():
            log.info(
                "model generation %d loaded: %d maps in %.1f ms",
                model.generation,
                len(model.maps),
                (time.perf_counter() - started) * 1000,
            )
        self._model = model
        self._loaded.set()
