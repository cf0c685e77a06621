"""Writes the model ConfigMaps (only those whose content changed) and the status annotations."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kubeio.client import Kube
from kubeio.errors import APIConflictError, APIError, APINotFoundError
from kubeio.paths import CONFIGMAPS, PLACEMENT_MAPS
from placement.annotations import STATUS_ANNOTATION
from placement.model import MANIFEST_NAME, MODEL_LABEL, Model, encode_model
from placement.status import MapStatus
from placement.types import MapKey

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class ModelWriter:
    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self._path = CONFIGMAPS.collection(namespace)

    def write(self, model: Model, current: Mapping[str, Mapping[str, str]]) -> int:
        """Writes shards first and the manifest last (readers check shards against it), then drops
        shards the manifest no longer names. Returns the number of ConfigMaps written."""
        wanted = encode_model(model)
        order = [*sorted(n for n in wanted if n != MANIFEST_NAME), MANIFEST_NAME]
        written = 0
        for name in order:
            data = wanted[name]
            if current.get(name) == data:
                continue
            self._put(name, data)
            written += 1
        for name in current:
            if name not in wanted:
                with contextlib.suppress(APINotFoundError):
                    self.kube.delete(CONFIGMAPS.item(name, self.namespace))
        return written

    def _put(self, name: str, data: Mapping[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {MODEL_LABEL: "true", "app.kubernetes.io/managed-by": "gpuplace"},
            },
            "data": dict(data),
        }
        try:
            self.kube.put(CONFIGMAPS.item(name, self.namespace), body)
        except APINotFoundError:
            self.kube.create(self._path, body)


def patch_status(kube: Kube, key: MapKey, status: MapStatus) -> bool:
    """Sets the status annotation on a source map; False if the map is gone."""
    body = {"metadata": {"annotations": {STATUS_ANNOTATION: status.to_json()}}}
    return patched(kube, CONFIGMAPS.item(key.name, key.namespace), body, str(key))


def patch_resource_status(kube: Kube, key: MapKey, status: Mapping[str, Any]) -> bool:
    """Sets the status of a PlacementMap custom resource; False if it is gone or not written."""
    path = PLACEMENT_MAPS.item(key.name, key.namespace, "status")
    return patched(kube, path, {"status": status}, str(key))


def patched(kube: Kube, path: str, body: Mapping[str, Any], what: str) -> bool:
    """A merge patch of a status; False when the object is gone, changed meanwhile or the write
    failed (logged: the next pass writes it again)."""
    try:
        kube.patch(path, body)
    except (APINotFoundError, APIConflictError):
        return False
    except APIError as exc:
        log.warning("status of %s not written: %s", what, exc)
        return False
    return True
