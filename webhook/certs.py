"""A small CA and serving certificates for the webhook, with `cryptography` (no I/O).

ECDSA P-256 keys: generated in a millisecond, accepted by the apiserver's Go TLS client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Certificates start this much in the past: the apiserver's clock may be a little behind ours.
BACKDATE = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def not_before(self) -> datetime:
        return self.certificate().not_valid_before_utc

    @property
    def not_after(self) -> datetime:
        return self.certificate().not_valid_after_utc

    def renew_at(self, fraction: float) -> datetime:
        """When `fraction` of the certificate's lifetime has passed."""
        start, end = self.not_before, self.not_after
        return start + (end - start) * fraction


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def generate_ca(common_name: str, validity: timedelta, now: datetime | None = None) -> KeyPair:
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    validity: timedelta,
    now: datetime | None = None,
) -> KeyPair:
    """A server certificate for the names the apiserver dials, never outliving its CA."""
    now = now or datetime.now(UTC)
    ca_cert = ca.certificate()
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    common_name = dns_names[0] if dns_names else (ip_addresses[0] if ip_addresses else "webhook")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


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
