"""Writes the webhook configurations: whole objects (`--register`, server-side apply) or just their
caBundle."""

from __future__ import annotations

import logging
from typing import Any

from kubeio.client import Kube, Obj
from kubeio.errors import APINotFoundError
from kubeio.paths import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, Resource
from kubeio.retry import on_conflict
from webhook.manifests import MUTATING_KIND, with_ca_bundle

log = logging.getLogger(__name__)


#: The field manager of the configurations `--register` applies.
FIELD_MANAGER = "gpuplace-webhook"


def resource_of(configuration: dict[str, Any]) -> Resource:
    return MUTATING_WEBHOOKS if configuration.get("kind") == MUTATING_KIND else VALIDATING_WEBHOOKS


def apply_configuration(kube: Kube, configuration: dict[str, Any]) -> Obj:
    """Creates the configuration or updates it to `configuration` (server-side apply): one
    request, no read-modify-write to retry, and a caBundle that another writer (the TLS bootstrap,
    cert-manager's injector) keeps in fields `configuration` leaves out stays in place."""
    path = resource_of(configuration).item(configuration["metadata"]["name"])
    return kube.apply(path, configuration, FIELD_MANAGER)


def patch_ca_bundle(kube: Kube, resource: Resource, name: str, ca_bundle: bytes) -> bool | None:
    """Sets every webhook's caBundle; True if written, False if already set, None if absent."""
    path = resource.item(name)

    def attempt() -> bool | None:
        try:
            current = kube.get(path)
        except APINotFoundError:
            return None
        updated = with_ca_bundle(current, ca_bundle)
        if updated is None:
            return False
        kube.put(path, updated)
        log.info("caBundle written into %s %s", resource.plural, name)
        return True

    return on_conflict(attempt, path)
