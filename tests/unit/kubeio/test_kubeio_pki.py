"""kubeio.pki: the one certificate builder of the webhook and the local control plane."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuplace_dev.localcluster.pki import CertificateAuthority
from kubeio.pki import CLIENT_AUTH, SERVER_AUTH, KeyPair, issue, self_signed_ca

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def test_a_leaf_never_outlives_its_ca() -> None:
    ca = self_signed_ca("ca", 10 * DAY, now=NOW)
    leaf = issue(ca, "svc", usage=SERVER_AUTH, validity=365 * DAY, dns_names=["svc"], now=NOW)
    assert leaf.not_after == ca.not_after
    assert leaf.certificate().issuer == ca.certificate().subject


def test_a_client_certificate_carries_user_and_groups_without_names() -> None:
    ca = self_signed_ca("ca", 10 * DAY, now=NOW)
    leaf = issue(ca, "alice", usage=CLIENT_AUTH, validity=DAY, organizations=["g1", "g2"], now=NOW)
    cert = leaf.certificate()
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["g1", "g2"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_serving_names_and_addresses_become_subject_alternative_names() -> None:
    ca = self_signed_ca("ca", 10 * DAY, now=NOW)
    leaf = issue(
        ca,
        "w",
        usage=SERVER_AUTH,
        validity=DAY,
        dns_names=["a", "b"],
        ip_addresses=["127.0.0.1"],
        now=NOW,
    )
    sans = leaf.certificate().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["a", "b"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_backdate_and_path_length_are_the_callers() -> None:
    ca = self_signed_ca("ca", DAY, path_length=None, now=NOW, backdate=timedelta(hours=1))
    assert ca.not_before == NOW - timedelta(hours=1)
    constraints = ca.certificate().extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length is None


def test_the_private_key_file_is_the_owners_only(tmp_path: Path) -> None:
    pair = CertificateAuthority.generate().issue_client("bob")
    pair.write(tmp_path / "c.pem", tmp_path / "k.pem")
    assert stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    assert KeyPair((tmp_path / "c.pem").read_bytes(), (tmp_path / "k.pem").read_bytes()) == pair


def test_a_key_that_cannot_sign_is_refused_when_loaded() -> None:
    ca = self_signed_ca("ca", DAY)
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ValueError, match="ECDSA"):
        CertificateAuthority.load(ca.cert_pem, rsa_pem)
