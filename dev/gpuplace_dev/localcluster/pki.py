"""A throwaway certificate authority for the local control plane and for test TLS servers.

Certificates come from `kubeio.pki` (ECDSA P-256), backdated an hour so that a small clock skew never
makes them "not yet valid".
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from kubeio.pki import (
    CLIENT_AUTH,
    SERVER_AUTH,
    KeyPair,
    issue,
    private_pem,
    public_pem,
    self_signed_ca,
    write_private,
)

_BACKDATE = datetime.timedelta(hours=1)
_DEFAULT_VALIDITY = datetime.timedelta(days=365)

#: A PEM certificate and its PEM private key (`write` puts them in files).
CertKeyPair = KeyPair


@dataclass(frozen=True)
class SigningKey:
    """A key pair in PEM form, e.g. for signing service-account tokens."""

    private_pem: bytes
    public_pem: bytes

    @classmethod
    def generate(cls) -> SigningKey:
        key = ec.generate_private_key(ec.SECP256R1())
        return cls(private_pem=private_pem(key), public_pem=public_pem(key))

    def write(self, private_path: Path, public_path: Path) -> None:
        write_private(private_path, self.private_pem)
        public_path.write_bytes(self.public_pem)


class CertificateAuthority:
    """Issues server and client certificates signed by one self-signed CA certificate."""

    def __init__(self, pair: KeyPair) -> None:
        pair.private_key()  # fails early on a key that cannot sign
        self._pair = pair

    @classmethod
    def generate(
        cls,
        common_name: str = "gpuplace-local-ca",
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertificateAuthority:
        return cls(self_signed_ca(common_name, validity, path_length=None, backdate=_BACKDATE))

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        return cls(KeyPair(cert_pem, key_pem))

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate: what clients trust, e.g. a webhook's caBundle (base64 of this)."""
        return self._pair.cert_pem

    @property
    def pair(self) -> CertKeyPair:
        return self._pair

    def issue_server(
        self,
        common_name: str,
        *,
        dns_names: Iterable[str] = ("localhost",),
        ip_addresses: Iterable[str] = ("127.0.0.1",),
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertKeyPair:
        """A serving certificate valid for the given DNS names and IP addresses."""
        return issue(
            self._pair,
            common_name,
            usage=SERVER_AUTH,
            validity=validity,
            dns_names=tuple(dns_names),
            ip_addresses=tuple(ip_addresses),
            backdate=_BACKDATE,
        )

    def issue_client(
        self,
        common_name: str,
        *,
        organizations: Iterable[str] = (),
        validity: datetime.timedelta = _DEFAULT_VALIDITY,
    ) -> CertKeyPair:
        """A client certificate; Kubernetes reads CN as the user name and each O as a group."""
        return issue(
            self._pair,
            common_name,
            usage=CLIENT_AUTH,
            validity=validity,
            organizations=tuple(organizations),
            backdate=_BACKDATE,
        )
