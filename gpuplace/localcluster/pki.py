"""A throwaway certificate authority for the local control plane and for test TLS servers.

ECDSA P-256 throughout: the apiserver, etcd clients, kubectl and Python's ssl all accept it, and a
key takes microseconds to generate where RSA takes tens of milliseconds per key.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Certificates start an hour in the past so that a small clock skew never makes them "not yet valid".
_BACKDATE = datetime.timedelta(hours=1)
_DEFAULT_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class CertKeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Writes both files; the key is readable by its owner only."""
        cert_path.write_bytes(self.cert_pem)
        _write_private(key_path, self.key_pem)


@dataclass(frozen=True)
class SigningKey:
    """A key pair in PEM form, e.g. for signing service-account tokens."""

    private_pem: bytes
    public_pem: bytes

    @classmethod
    def generate(cls) -> SigningKey:
        key = ec.generate_private_key(ec.SECP256R1())
        return cls(private_pem=_private_pem(key), public_pem=_public_pem(key))

    def write(self, private_path: Path, public_path: Path) -> None:
        _write_private(private_path, self.private_pem)
        public_path.write_bytes(self.public_pem)


class CertificateAuthority:
    """Issues server and client certificates signed by one self-signed CA certificate."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self._certificate = certificate
        self._key = key

    @classmethod
    def generate(
        cls,
        common_name: str = "gpuplace-local-ca",
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("the CA key must be an ECDSA key")
        return cls(x509.load_pem_x509_certificate(cert_pem), key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate: what clients trust, e.g. a webhook's caBundle (base64 of this)."""
        return self._certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def pair(self) -> CertKeyPair:
        return CertKeyPair(cert_pem=self.cert_pem, key_pem=_private_pem(self._key))

    def issue_server(
        self,
        common_name: str,
        *,
        dns_names: Iterable[str] = ("localhost",),
        ip_addresses: Iterable[str] = ("127.0.0.1",),
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertKeyPair:
        """A serving certificate valid for the given DNS names and IP addresses."""
        return self._issue(
            common_name,
            organizations=(),
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            dns_names=tuple(dns_names),
            ip_addresses=tuple(ip_addresses),
            validity=validity,
        )

    def issue_client(
        self,
        common_name: str,
        *,
        organizations: Iterable[str] = (),
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertKeyPair:
        """A client certificate; Kubernetes reads CN as the user name and each O as a group."""
        return self._issue(
            common_name,
            organizations=tuple(organizations),
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            dns_names=(),
            ip_addresses=(),
            validity=validity,
        )

    def _issue(
        self,
        common_name: str,
        *,
        organizations: tuple[str, ...],
        usage: x509.ObjectIdentifier,
        dns_names: tuple[str, ...],
        ip_addresses: tuple[str, ...],
        validity: datetime.timedelta,
    ) -> CertKeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + validity)
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
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return CertKeyPair(
            cert_pem=certificate.public_bytes(serialization.Encoding.PEM),
            key_pem=_private_pem(key),
        )


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
