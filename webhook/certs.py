"""The webhook's CA, serving certificates and caBundle (no I/O); built by `kubeio.pki`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from kubeio.pki import SERVER_AUTH, KeyPair, issue, self_signed_ca

__all__ = ["KeyPair", "generate_ca", "issue_serving", "merge_bundle", "split_bundle"]


def generate_ca(common_name: str, validity: timedelta, now: datetime | None = None) -> KeyPair:
    return self_signed_ca(common_name, validity, path_length=0, now=now)


def issue_serving(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    validity: timedelta,
    now: datetime | None = None,
) -> KeyPair:
    """A server certificate for the names the apiserver dials, never outliving its CA."""
    common_name = dns_names[0] if dns_names else (ip_addresses[0] if ip_addresses else "webhook")
    return issue(
        ca,
        common_name,
        usage=SERVER_AUTH,
        validity=validity,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        now=now,
    )


def split_bundle(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle) if bundle.strip() else []


def merge_bundle(*pems: bytes, now: datetime | None = None) -> bytes:
    """The distinct, unexpired certificates of `pems`, newest first: a caBundle that trusts the
    serving certificates of the current CA and, during a rotation, of the previous one."""
    now = now or datetime.now(UTC)
    seen: dict[bytes, x509.Certificate] = {}
    for pem in pems:
        for cert in split_bundle(pem):
            if cert.not_valid_after_utc > now:
                seen.setdefault(cert.fingerprint(hashes.SHA256()), cert)
    ordered = sorted(seen.values(), key=lambda c: c.not_valid_before_utc, reverse=True)
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in ordered)
