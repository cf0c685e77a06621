"""ConfigMaps that together hold one value, read through a watch: decoded again only when one of
them changed, the last value that decoded kept while the stored set does not (a write seen
half-way), for the controller, the webhook and the agents alike.

What the ConfigMaps hold, and how a half-written set reads, is the codec's to say (for the compiled
model, `placement.model.MODEL_CONFIGMAPS`); this module knows the watch, not the content.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from kubeio.client import Kube, Obj
from kubeio.informer import Handler, Informer
from kubeio.paths import CONFIGMAPS

log = logging.getLogger(__name__)

T = TypeVar("T")
_Versions = tuple[tuple[str, str], ...]


class ConfigMapCodec(Protocol[T]):
    """Which ConfigMaps hold the value, and how they read."""

    @property
    def name(self) -> str:
        """What the ConfigMaps hold: the informer's name, and the log's."""
        ...

    @property
    def label_selector(self) -> str: ...

    def decode(self, objects: Sequence[Obj]) -> T:
        """The value the ConfigMaps hold now; ValueError while they do not hold a whole one."""
        ...

    def describe(self, value: T) -> str:
        """The value kept while the stored one does not decode, as the log names it."""
        ...


class ConfigMapWatch(Generic[T]):
    def __init__(self, kube: Kube, namespace: str, codec: ConfigMapCodec[T]) -> None:
        self.codec = codec
        self.informer = Informer(
            kube,
            CONFIGMAPS.collection(namespace),
            label_selector=codec.label_selector,
            name=codec.name,
        )
        self._lock = threading.Lock()
        self._versions: _Versions | None = None
        self._value: T | None = None

    def add_handler(self, handler: Handler) -> None:
        self.informer.add_handler(handler)

    def start(self) -> ConfigMapWatch[T]:
        self.informer.start()
        return self

    def stop(self) -> None:
        self.informer.stop()

    def objects(self) -> list[Obj]:
        """The ConfigMaps as stored now (a whole value or not)."""
        with self.informer.lock:
            return list(self.informer.store.values())

    def shards(self) -> Mapping[str, Mapping[str, str]]:
        """Their data by ConfigMap name, for a writer to compare against."""
        return {str(o["metadata"]["name"]): o.get("data") or {} for o in self.objects()}

    def read(self) -> T | None:
        """The newest value that decoded: decoded again only when a ConfigMap changed; the last
        one while the stored one does not decode (None before any did)."""
        objects = self.objects()
        versions = tuple(
            sorted(
                (str(o["metadata"]["name"]), str(o["metadata"].get("resourceVersion", "")))
                for o in objects
            )
        )
        with self._lock:
            if versions == self._versions:
                return self._value
            try:
                value = self.codec.decode(objects)
            except ValueError as exc:
                kept = "none yet" if self._value is None else self.codec.describe(self._value)
                log.info("%s not complete (%s); keeping %s", self.codec.name, exc, kept)
                self._versions = versions
                return self._value
            self._versions = versions
            self._value = value
            return value
