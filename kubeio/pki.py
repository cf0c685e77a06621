"""Certificates for Kubernetes components, with `cryptography` and no I/O but `KeyPair.write`.

One builder for every certificate gpuplace makes: the webhook's self-bootstrapped CA and serving
certificates, and the local control plane's CA, serving and client certificates. ECDSA P-256
throughout: the apiserver, etcd, kubectl and Python's ssl all accept it, and a key takes microseconds
to generate where RSA takes tens of milliseconds.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Certificates start this much in the past: the peer's clock may be a little behind ours.
BACKDATE = timedelta(minutes=5)

SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the key must be an ECDSA key")
        return key

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

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Writes both files; the key is readable by its owner only."""
        cert_path.write_bytes(self.cert_pem)
        write_private(key_path, self.key_pem)


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write_private(path: Path, data: bytes) -> None:
    """Writes a private key, never readable by others, not even for a moment."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def self_signed_ca(
    common_name: str,
    validity: timedelta,
    *,
    path_length: int | None = 0,
    now: datetime | None = None,
    backdate: timedelta = BACKDATE,
) -> KeyPair:
    """A self-signed CA certificate (`path_length` None: it may sign intermediate CAs)."""
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), private_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    usage: x509.ObjectIdentifier,
    validity: timedelta,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    now: datetime | None = None,
    backdate: timedelta = BACKDATE,
) -> KeyPair:
    """A leaf certificate signed by `ca`, never outliving it. Kubernetes reads a client
    certificate's CN as the user name and each O as a group."""
    now = now or datetime.now(UTC)
    ca_cert, ca_key = ca.certificate(), ca.private_key()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), private_pem(key))
