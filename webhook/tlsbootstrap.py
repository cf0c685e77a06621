"""Self-bootstrapped TLS: a CA shared by all replicas through a Secret, serving certificates
issued from it, and the caBundle kept in the webhook configurations.

- The CA lives in Secret `gpuplace-webhook-ca` (namespace gpuplace-system): the first replica
  creates it, the others get it (create-or-get, so a race costs one 409).
- Each replica issues its own serving certificate from the CA at start and again once 2/3 of its
  lifetime has passed, and swaps it in without a restart.
- The CA is rotated the same way; the Secret's `ca.crt` keeps the previous CA next to the new one
  until it expires, so serving certificates of either stay trusted while replicas catch up.
- The caBundle written into the configurations is always the Secret's `ca.crt`, so replicas never
  fight over it. A watch on the configurations re-writes it at once when something (a Helm upgrade)
  resets it.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography.exceptions import InvalidSignature

from kubeio.client import Kube, Obj
from kubeio.errors import APIError, APINotFoundError
from kubeio.informer import Informer
from kubeio.paths import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS
from kubeio.retry import on_conflict
from webhook.certs import KeyPair, generate_ca, issue_serving, merge_bundle
from webhook.manifests import MUTATING_PATH, VALIDATING_PATH, with_ca_bundle
from webhook.register import patch_ca_bundle
from webhook.settings import RegistrationSettings, TLSSettings
from webhook.tls import ServingTLS

log = logging.getLogger(__name__)

CA_CERT_KEY = "tls.crt"
CA_KEY_KEY = "tls.key"
BUNDLE_KEY = "ca.crt"
#: Wake at least this often to compare with the Secret, in case an event was missed.
MAX_SLEEP_SECONDS = 3600.0
RETRY_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class SharedCA:
    ca: KeyPair
    bundle: bytes  # PEM: the current CA, and the previous one while it is still valid
    resource_version: str = ""


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def decode_secret(obj: Obj) -> SharedCA | None:
    """The CA in a Secret; None if it is missing pieces or does not parse."""
    data = obj.get("data") or {}
    try:
        ca = KeyPair(base64.b64decode(data[CA_CERT_KEY]), base64.b64decode(data[CA_KEY_KEY]))
        ca.certificate()
        bundle = base64.b64decode(data.get(BUNDLE_KEY, "")) or ca.cert_pem
    except (KeyError, ValueError, TypeError):
        return None
    return SharedCA(ca, bundle, str(obj.get("metadata", {}).get("resourceVersion", "")))


def encode_secret(namespace: str, name: str, shared: SharedCA, found: Obj | None = None) -> Obj:
    """The CA Secret holding `shared`. Written over `found` (the Secret as read), only its data
    changes: the type a Secret was created with is immutable, and the chart's (Opaque, rendered
    without data) keeps helm's labels and annotations."""
    data = {
        CA_CERT_KEY: _b64(shared.ca.cert_pem),
        CA_KEY_KEY: _b64(shared.ca.key_pem),
        BUNDLE_KEY: _b64(shared.bundle),
    }
    if found is not None:
        kept = dict(found.get("metadata") or {})
        if shared.resource_version:
            kept["resourceVersion"] = shared.resource_version
        return {**found, "metadata": kept, "data": {**(found.get("data") or {}), **data}}
    metadata: dict[str, object] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "gpuplace", "app.kubernetes.io/component": "webhook"},
    }
    if shared.resource_version:
        metadata["resourceVersion"] = shared.resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "data": data,
    }


class CASecret:
    """Create-or-get and rotation of the shared CA."""

    def __init__(self, kube: Kube, settings: TLSSettings) -> None:
        self._kube = kube
        self._settings = settings
        self._collection = SECRETS.collection(settings.namespace)
        self._path = SECRETS.item(settings.ca_secret, settings.namespace)

    def _new_ca(self, now: datetime) -> KeyPair:
        return generate_ca(
            f"gpuplace-webhook-ca@{int(now.timestamp())}",
            timedelta(days=self._settings.ca_validity_days),
            now,
        )

    def _due(self, pair: KeyPair, now: datetime) -> bool:
        return now >= pair.renew_at(self._settings.renew_after_fraction)

    def ensure(self, now: datetime | None = None) -> SharedCA:
        at = now or datetime.now(UTC)
        return on_conflict(lambda: self._ensure_once(at), self._path)

    def _ensure_once(self, now: datetime) -> SharedCA:
        """One read and at most one write; a write conflict (another replica created or rotated
        first) is retried by `ensure`, which then reads theirs."""
        try:
            obj = self._kube.get(self._path)
        except APINotFoundError:
            ca = self._new_ca(now)
            body = encode_secret(
                self._settings.namespace, self._settings.ca_secret, SharedCA(ca, ca.cert_pem)
            )
            created = self._kube.create(self._collection, body)
            log.info("created CA Secret %s/%s", self._settings.namespace, self._settings.ca_secret)
            return decode_secret(created) or SharedCA(ca, ca.cert_pem)
        shared = decode_secret(obj)
        if shared is not None and not self._due(shared.ca, now):
            return shared
        ca = self._new_ca(now)
        previous = shared.bundle if shared is not None else b""
        rotated = SharedCA(
            ca,
            merge_bundle(ca.cert_pem, previous, now=now),
            str(obj.get("metadata", {}).get("resourceVersion", "")),
        )
        updated = self._kube.put(
            self._path,
            encode_secret(self._settings.namespace, self._settings.ca_secret, rotated, obj),
        )
        log.info(
            "rotated the CA in Secret %s/%s (%s)",
            self._settings.namespace,
            self._settings.ca_secret,
            "it was unreadable" if shared is None else "it was due",
        )
        return decode_secret(updated) or rotated


def issued_by(pair: KeyPair, ca: KeyPair) -> bool:
    try:
        pair.certificate().verify_directly_issued_by(ca.certificate())
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class TLSBootstrap:
    """Keeps a `ServingTLS` issued from the shared CA and the caBundle in the configurations."""

    def __init__(
        self,
        kube: Kube,
        tls: TLSSettings,
        registration: RegistrationSettings,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._tls = tls
        self._registration = registration
        self._clock = clock
        self._secret = CASecret(kube, tls)
        self._shared: SharedCA | None = None
        self._serving: ServingTLS | None = None
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._missing_reported: set[str] = set()
        self._informers = [
            Informer(
                kube,
                path,
                field_selector=f"metadata.name={registration.configuration_name}",
                name=path.rsplit("/", 1)[-1],
            )
            for path in (MUTATING_PATH, VALIDATING_PATH)
        ]
        for informer in self._informers:
            informer.add_handler(self._configuration_changed)
        self._thread = threading.Thread(target=self._run, name="tls-bootstrap", daemon=True)

    @property
    def bundle(self) -> bytes:
        return self._shared.bundle if self._shared else b""

    def issue(self) -> KeyPair:
        """Reads (or creates) the shared CA and issues a serving certificate from it."""
        self._shared = self._secret.ensure(self._clock())
        return self._issue(self._shared)

    def _issue(self, shared: SharedCA) -> KeyPair:
        return issue_serving(
            shared.ca,
            self._tls.dns_names(),
            self._tls.ip_addresses,
            timedelta(days=self._tls.cert_validity_days),
            self._clock(),
        )

    def start(self, serving: ServingTLS) -> TLSBootstrap:
        self._serving = serving
        if self._registration.patch_ca_bundle:
            for informer in self._informers:
                informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        for informer in self._informers:
            informer.stop()

    def _configuration_changed(self, _event: str, obj: Obj, _old: Obj | None) -> None:
        if self._shared is None or with_ca_bundle(obj, self._shared.bundle) is not None:
            self._kick.set()

    def reconcile(self) -> None:
        """One pass: CA current, serving certificate current, caBundle written."""
        if self._serving is None:
            raise RuntimeError("start() the bootstrap with the ServingTLS first")
        with self._lock:  # the timer thread and callers never interleave a rotation
            self._reconcile(self._serving)

    def _reconcile(self, serving: ServingTLS) -> None:
        now = self._clock()
        self._shared = self._secret.ensure(now)
        pair = serving.pair
        if not issued_by(pair, self._shared.ca) or now >= pair.renew_at(
            self._tls.renew_after_fraction
        ):
            serving.update(self._issue(self._shared))
        if self._registration.patch_ca_bundle:
            self.write_bundle()

    def write_bundle(self) -> None:
        name = self._registration.configuration_name
        for resource in (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS):
            written = patch_ca_bundle(self._kube, resource, name, self.bundle)
            kind = resource.plural
            if written is None and kind not in self._missing_reported:
                self._missing_reported.add(kind)
                log.warning(
                    "%s %s not found; its caBundle will be written once it exists", kind, name
                )

    def _next_wake(self) -> float:
        deadlines = []
        if self._serving is not None:
            deadlines.append(self._serving.pair.renew_at(self._tls.renew_after_fraction))
        if self._shared is not None:
            deadlines.append(self._shared.ca.renew_at(self._tls.renew_after_fraction))
        seconds = min((d - self._clock()).total_seconds() for d in deadlines) if deadlines else 0
        return min(max(seconds, 1.0), MAX_SLEEP_SECONDS)

    def _run(self) -> None:
        delay = 0.0  # the first pass writes the caBundle right away
        while not self._stop.is_set():
            self._kick.wait(delay)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile()
                delay = self._next_wake()
            except APIError as exc:
                log.warning("TLS bootstrap: %s; retrying in %.0fs", exc, RETRY_SECONDS)
                delay = RETRY_SECONDS
