"""The binding key ring's Secret in the controller's namespace: read, created, filled, migrated.

Only the controller's service account may read or write it (the chart's Role names it), so nobody
else can write a holding that the slot cache believes or an adoption record it honours. The first
leader to start fills it; every later leader, every restart, and `gpuplace key` read the same ring.
The chart keeps the Secret on uninstall and ArgoCD never prunes it: the ring must outlive the
release, or the pods it signed could no longer be verified (placement/keyring.py says what they
then hold).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from kubeio.client import Kube
from kubeio.errors import APINotFoundError
from kubeio.paths import SECRETS
from kubeio.retry import on_conflict
from kubeio.times import now_time
from placement.keyring import (
    KEY_BYTES,
    Adoption,
    KeyRing,
    TrustView,
    adoptions_data,
    new_ring,
    parse_adoptions,
    parse_ring,
    ring_data,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
#: When the key was made by the releases before the ring: pods bound before it carry no signature
#: and still hold their GPUs; carried into the ring as its `signingSince`.
SINCE_ANNOTATION = "gpuplace.io/signing-since"


@dataclass(frozen=True, slots=True)
class KeySecret:
    """Where the ring is kept: Secret `name` in `namespace`."""

    namespace: str
    name: str

    @property
    def path(self) -> str:
        return SECRETS.item(self.name, self.namespace)

    def __str__(self) -> str:
        return f"Secret {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class StoredRing:
    """The ring as read from the Secret, with the object it came from (for a guarded write)."""

    ring: KeyRing | None  # None: the Secret holds no key yet
    adoptions: tuple[Adoption, ...]
    obj: Obj | None  # None: no Secret

    @property
    def view(self) -> TrustView:
        if self.ring is None:
            raise ValueError("no key ring stored yet")
        version = str((self.obj or {}).get("metadata", {}).get("resourceVersion", ""))
        return TrustView.of(self.ring, self.adoptions, version)


def read_stored(obj: Obj | None, where: KeySecret) -> StoredRing:
    """The ring and adoption records in a Secret object as the API returns it. Raises RingError
    (with the Secret and field) when it holds something unreadable."""
    if obj is None:
        return StoredRing(None, (), None)
    data = obj.get("data") or {}
    meta = obj.get("metadata") or {}
    legacy_since = str(
        (meta.get("annotations") or {}).get(SINCE_ANNOTATION) or meta.get("creationTimestamp") or ""
    )
    ring = parse_ring(data, str(where), legacy_since)
    return StoredRing(ring, parse_adoptions(data, str(where)), obj)


def fetch(kube: Kube, where: KeySecret) -> StoredRing:
    try:
        return read_stored(kube.get(where.path), where)
    except APINotFoundError:
        return read_stored(None, where)


def write(
    kube: Kube, where: KeySecret, stored: StoredRing, ring: KeyRing, adoptions: tuple[Adoption, ...]
) -> StoredRing:
    """Writes `ring` and `adoptions` over `stored` (created when there was no Secret); other
    data fields are kept. Raises APIConflictError when the Secret changed since it was read."""
    data: dict[str, str] = {}
    if stored.obj is not None:
        data.update(stored.obj.get("data") or {})
    data.update(ring_data(ring))
    data.update(adoptions_data(adoptions))
    if stored.obj is None:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": where.name,
                "namespace": where.namespace,
                "labels": {"app.kubernetes.io/part-of": "gpuplace"},
            },
            "type": "Opaque",
            "data": data,
        }
        created = kube.create(SECRETS.collection(where.namespace), body)
        return read_stored(created, where)
    # resourceVersion kept: a write racing another fails with a conflict instead of losing it.
    return read_stored(kube.put(where.path, {**stored.obj, "data": data}), where)


def load_or_create(kube: Kube, where: KeySecret) -> TrustView:
    """The ring in the Secret; a new one (random key) when the Secret is missing or, as the chart
    renders it, empty; a ring of the one key of the releases before the ring, written back in the
    ring's format, when that is what it holds. Races between replicas end with one ring. Raises
    RingError when the Secret holds something unreadable: it is left as it is for an
    administrator to mend or delete (deleting it starts a new ring)."""

    def attempt() -> TrustView:
        stored = fetch(kube, where)
        if stored.ring is not None and stored.obj is not None:
            if "keyring.json" in (stored.obj.get("data") or {}):
                return stored.view
            action = "carried the key of the release before the key ring into a key ring"
            ring = stored.ring
        else:
            action = "made a new binding key ring"
            ring = new_ring(secrets.token_bytes(KEY_BYTES), now_time())
        written = write(kube, where, stored, ring, stored.adoptions)  # a conflict: read theirs
        log.info("%s in %s (signing key %s)", action, where, ring.signer.id)
        return written.view

    return on_conflict(attempt, f"{where}: storing a binding key ring")


def write_back(kube: Kube, where: KeySecret, held: TrustView) -> TrustView:
    """The Secret was deleted, or rendered again empty, under a running leader: the ring and the
    adoption records it holds are written back, so that no running pod's binding becomes
    unverifiable for a Secret lost by accident (an uninstall, a prune). A ring found there in the
    meantime wins. Revoking a key is `gpuplace key rotate`, not a deletion."""

    def attempt() -> TrustView:
        stored = fetch(kube, where)
        if stored.ring is not None:
            return load_or_create(kube, where)
        written = write(kube, where, stored, held.ring, tuple(held.adoptions.values()))
        log.warning(
            "%s was deleted or emptied: wrote back the key ring this leader holds (signing key %s)",
            where,
            held.ring.signer.id,
        )
        return written.view

    return on_conflict(attempt, f"{where}: writing the binding key ring back")
