"""Writes the webhook configurations: whole objects (`--register`) or just their caBundle."""

from __future__ import annotations

import logging
from typing import Any

from kubeio.client import Kube, Obj
from kubeio.errors import APINotFoundError
from kubeio.retry import on_conflict
from webhook.manifests import MUTATING_KIND, MUTATING_PATH, VALIDATING_PATH, with_ca_bundle

log = logging.getLogger(__name__)


def collection_of(configuration: dict[str, Any]) -> str:
    return MUTATING_PATH if configuration.get("kind") == MUTATING_KIND else VALIDATING_PATH


def apply_configuration(kube: Kube, configuration: dict[str, Any]) -> Obj:
    """Creates the configuration or replaces the existing one, retrying on write conflicts."""
    collection = collection_of(configuration)
    name = configuration["metadata"]["name"]

    def attempt() -> Obj:
        try:
            current = kube.get(f"{collection}/{name}")
        except APINotFoundError:
            return kube.create(collection, configuration)  # a conflict: another replica was first
        metadata = {
            **configuration["metadata"],
            "resourceVersion": current["metadata"]["resourceVersion"],
        }
        return kube.put(f"{collection}/{name}", {**configuration, "metadata": metadata})

    return on_conflict(attempt, f"{collection}/{name}")


def patch_ca_bundle(kube: Kube, collection: str, name: str, ca_bundle: bytes) -> bool | None:
    """Sets every webhook's caBundle; True if written, False if already set, None if absent."""

    def attempt() -> bool | None:
        try:
            current = kube.get(f"{collection}/{name}")
        except APINotFoundError:
            return None
        updated = with_ca_bundle(current, ca_bundle)
        if updated is None:
            return False
        kube.put(f"{collection}/{name}", updated)
        log.info("caBundle written into %s %s", collection.rsplit("/", 1)[-1], name)
        return True

    return on_conflict(attempt, f"{collection}/{name}")
