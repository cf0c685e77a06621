"""The key the binder signs its Bindings with: a Secret in the controller's namespace.

Only the controller's service account may read it (the chart's Role names it), so nobody else can
write a holding that the slot cache believes. The first leader to start creates it; every later
leader, and every restart, reads the same key, so the cache rebuilt after a failover trusts exactly
the pods that this installation bound.
"""

from __future__ import annotations

import base64
import logging
import secrets
from dataclasses import dataclass

from kubeio.client import Kube
from kubeio.errors import APIConflictError, APINotFoundError
from kubeio.paths import SECRETS
from kubeio.times import now_time

log = logging.getLogger(__name__)

KEY_FIELD = "key"
KEY_BYTES = 32
#: When the key was made: pods bound before it carry no signature and still hold their GPUs (an
#: installation that signed nothing yet); nobody can create a pod that predates it.
SINCE_ANNOTATION = "gpuplace.io/signing-since"


@dataclass(frozen=True, slots=True)
class SigningKey:
    key: bytes
    since: str  # RFC 3339, UTC, seconds


def load_or_create_key(kube: Kube, namespace: str, name: str) -> SigningKey:
    """The key in Secret `name`; a new random one if the Secret is missing or (as the chart renders
    it, so that RBAC needs no `create`) empty. Races between replicas end with one key."""
    path = SECRETS.collection(namespace)
    fresh = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
    for _attempt in range(5):
        try:
            found = kube.get(f"{path}/{name}")
        except APINotFoundError:
            found = None
        if found is None:
            try:
                return _decode(kube.create(path, _secret(namespace, name, fresh)), namespace, name)
            except APIConflictError:
                continue  # another replica created it first: use theirs
        data = found.get("data") or {}
        if data.get(KEY_FIELD):
            return _decode(found, namespace, name)
        found["data"] = {**data, KEY_FIELD: fresh}  # resourceVersion kept: a racing fill conflicts
        meta = found.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), SINCE_ANNOTATION: now_time()}
        try:
            filled = kube.put(f"{path}/{name}", found)
            log.info("stored a new binding key in Secret %s/%s", namespace, name)
            return _decode(filled, namespace, name)
        except APIConflictError:
            continue
    raise RuntimeError(f"Secret {namespace}/{name}: could not store a binding key (conflicts)")


def _secret(namespace: str, name: str, value: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gpuplace"},
            "annotations": {SINCE_ANNOTATION: now_time()},
        },
        "type": "Opaque",
        "data": {KEY_FIELD: value},
    }


def _decode(secret: dict[str, object], namespace: str, name: str) -> SigningKey:
    meta = secret.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    since = (meta.get("annotations") or {}).get(SINCE_ANNOTATION) or meta.get("creationTimestamp")
    data = secret.get("data")
    value = data.get(KEY_FIELD) if isinstance(data, dict) else None
    key = base64.b64decode(value) if isinstance(value, str) else b""
    if len(key) < 16:
        raise ValueError(
            f"Secret {namespace}/{name} must hold at least 16 random bytes under data.{KEY_FIELD}"
        )
    return SigningKey(key, str(since or ""))
