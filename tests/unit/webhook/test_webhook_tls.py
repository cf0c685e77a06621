"""Certificates, the HTTPS server with certificate swaps, and the configuration manifests."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from flask import Flask

from kubeio.server import Server
from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL, PLACEMENT_MAP_LABEL
from tests.unit.webhook_builders import (
    POD_CREATE_RULES,
    make_model,
    make_pod,
    review,
)
from webhook.app import create_app
from webhook.certs import KeyPair, generate_ca, issue_serving, merge_bundle, split_bundle
from webhook.manifests import (
    Endpoint,
    mutating_configuration,
    validating_configuration,
    with_ca_bundle,
)
from webhook.modelcache import StaticModel
from webhook.server import drain, https_server
from webhook.settings import ServerSettings, TLSSettings, WebhookSettings
from webhook.state import state_of
from webhook.tls import CertificateError, MountedFilesWatcher, ServingTLS
from webhook.tlsbootstrap import SharedCA, decode_secret, encode_secret, issued_by

DAY = timedelta(days=1)


def serving(ca: KeyPair, days: int = 30) -> KeyPair:
    return issue_serving(ca, ["gpuplace-webhook.gpuplace-system.svc"], ["127.0.0.1"], days * DAY)


# --- certificates -----------------------------------------------------------------------------


def test_serving_certificate_names_and_chain() -> None:
    ca = generate_ca("test-ca", 365 * DAY)
    pair = serving(ca)
    cert = pair.certificate()
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gpuplace-webhook.gpuplace-system.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert issued_by(pair, ca)
    assert not issued_by(pair, generate_ca("other", 365 * DAY))
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca = generate_ca("short", 10 * DAY)
    assert serving(ca, days=365).not_after <= ca.not_after


def test_renewal_point_is_a_fraction_of_the_lifetime() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    pair = issue_serving(generate_ca("ca", 3650 * DAY, now), ["a"], [], 90 * DAY, now)
    lifetime = pair.not_after - pair.not_before
    assert pair.renew_at(2 / 3) == pair.not_before + lifetime * 2 / 3


def test_tls_settings_cover_the_service_names() -> None:
    names = TLSSettings(namespace="ops", service_name="hook", extra_dns_names=("x.example",))
    assert names.dns_names() == (
        "hook",
        "hook.ops",
        "hook.ops.svc",
        "hook.ops.svc.cluster.local",
        "x.example",
    )


def test_bundle_keeps_unexpired_cas_newest_first() -> None:
    now = datetime.now(UTC)
    old = generate_ca("old", 30 * DAY, now - 20 * DAY)
    expired = generate_ca("expired", 5 * DAY, now - 20 * DAY)
    new = generate_ca("new", 365 * DAY, now)
    bundle = merge_bundle(new.cert_pem, old.cert_pem + expired.cert_pem + new.cert_pem, now=now)
    names = [c.subject.rfc4514_string() for c in split_bundle(bundle)]
    assert names == ["CN=new", "CN=old"]


def test_secret_round_trip_and_broken_secrets() -> None:
    ca = generate_ca("ca", 365 * DAY)
    shared = SharedCA(ca, ca.cert_pem, "42")
    secret = encode_secret("gpuplace-system", "gpuplace-webhook-ca", shared)
    assert secret["type"] == "Opaque"  # as the chart renders it: a Secret's type is immutable
    assert decode_secret(secret) == shared
    # Over the Secret as read (the chart's, with helm's metadata): only the data changes.
    found = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": "gpuplace-webhook-ca",
            "annotations": {"meta.helm.sh/release-name": "g"},
        },
        "data": {"other": "eA=="},
    }
    rewritten = encode_secret("gpuplace-system", "gpuplace-webhook-ca", shared, found)
    assert rewritten["metadata"]["annotations"] == {"meta.helm.sh/release-name": "g"}
    assert rewritten["metadata"]["resourceVersion"] == "42"
    assert rewritten["data"]["other"] == "eA==" and decode_secret(rewritten) == shared
    assert decode_secret({"data": {}}) is None
    assert decode_secret({"data": {"tls.crt": "bm9wZQ==", "tls.key": "bm9wZQ=="}}) is None


# --- the HTTPS server -------------------------------------------------------------------------


@pytest.fixture
def ca() -> KeyPair:
    return generate_ca("test-ca", 365 * DAY)


@pytest.fixture
def app() -> Flask:
    settings = WebhookSettings(
        server=ServerSettings(host="127.0.0.1", port=0, shutdown_delay_seconds=0)
    )
    return create_app(settings, StaticModel(make_model().map("llm").obj()))


@pytest.fixture
def running(ca: KeyPair, app: Flask) -> Iterator[tuple[Server, ServingTLS]]:
    settings = state_of(app).settings
    tls = ServingTLS(serving(ca))
    server = https_server(app, tls, settings.server).start()
    try:
        yield server, tls
    finally:
        server.stop()
        tls.close()


def https(
    port: int, trust: bytes, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    context = ssl.create_default_context(cadata=trust.decode())
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_https_mutate_and_health(running: tuple[Server, ServingTLS], ca: KeyPair) -> None:
    server, _ = running
    body = json.dumps(review(make_pod("web-0").label(MAP_LABEL, "llm").obj())).encode()
    status, data = https(server.port, ca.cert_pem, "POST", "/mutate", body)
    assert status == 200
    assert json.loads(data)["response"]["patchType"] == "JSONPatch"
    assert https(server.port, ca.cert_pem, "GET", "/healthz")[0] == 200


def test_https_refuses_bodies_over_the_limit_from_content_length(
    running: tuple[Server, ServingTLS], ca: KeyPair
) -> None:
    """Refused from the header alone: the server never reads the 4 MiB."""
    server, _ = running
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.putrequest("POST", "/mutate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(4 * 1024 * 1024))
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()


def test_plain_http_is_refused(running: tuple[Server, ServingTLS]) -> None:
    server, _ = running
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    except (ConnectionError, http.client.HTTPException):
        return  # dropped: fine
    finally:
        conn.close()
    assert status == 400  # answered, if at all, with 400


def test_certificate_swap_applies_to_new_connections(
    running: tuple[Server, ServingTLS], ca: KeyPair
) -> None:
    server, tls = running
    other_ca = generate_ca("rotated", 365 * DAY)
    assert tls.update(serving(other_ca)) is True
    assert tls.update(tls.pair) is False
    assert https(server.port, other_ca.cert_pem, "GET", "/healthz")[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        https(server.port, ca.cert_pem, "GET", "/healthz")


def test_mounted_files_are_reloaded_when_they_change(tmp_path: Path, ca: KeyPair) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = serving(ca)
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    changes: list[KeyPair] = []
    tls = ServingTLS(first, on_change=changes.append)
    watcher = MountedFilesWatcher(tls, str(cert), str(key), interval=3600)
    try:
        assert watcher.check() is False
        second = serving(ca)
        cert.write_bytes(second.cert_pem)  # half-way through a rotation: the key is the old one
        assert watcher.check() is False
        assert tls.pair == first
        key.write_bytes(second.key_pem)
        assert watcher.check() is True
        assert tls.pair == second
        assert changes == [first, second]
        key.unlink()
        assert watcher.check() is False  # unreadable: keep serving
    finally:
        tls.close()


def test_mismatched_pair_is_refused_at_start(ca: KeyPair) -> None:
    one, two = serving(ca), serving(ca)
    with pytest.raises(CertificateError, match="do not load as a pair"):
        ServingTLS(KeyPair(one.cert_pem, two.key_pem))


def test_draining_fails_readiness(
    running: tuple[Server, ServingTLS], app: Flask, ca: KeyPair
) -> None:
    server, _ = running
    assert https(server.port, ca.cert_pem, "GET", "/readyz")[0] == 200
    drain(app, state_of(app).settings.server, server)
    assert https(server.port, ca.cert_pem, "GET", "/readyz")[0] == 503
    assert state_of(app).draining.is_set()


# --- webhook configurations -------------------------------------------------------------------


def test_mutating_configuration_shape() -> None:
    config = mutating_configuration(
        "gpuplace", Endpoint(ca_bundle=b"PEM", url="https://127.0.0.1:8443/")
    )
    assert config["kind"] == "MutatingWebhookConfiguration"
    (pods,) = config["webhooks"]
    assert pods["clientConfig"] == {
        "url": "https://127.0.0.1:8443/mutate",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert pods["objectSelector"] == {
        "matchExpressions": [{"key": MAP_LABEL, "operator": "Exists"}]
    }
    assert pods["rules"] == POD_CREATE_RULES
    assert (pods["failurePolicy"], pods["sideEffects"], pods["timeoutSeconds"]) == (
        "Fail",
        "None",
        5,
    )
    assert pods["admissionReviewVersions"] == ["v1"]


def test_legacy_webhook_is_selected_by_cel_conditions() -> None:
    service = Endpoint(service_namespace="gpuplace-system", service_name="gpuplace-webhook")
    config = mutating_configuration(
        "gpuplace", service, legacy_scheduler_names=["gpu-scheduler", "b"]
    )
    _pods, legacy = config["webhooks"]
    assert legacy["clientConfig"] == {
        "service": {
            "namespace": "gpuplace-system",
            "name": "gpuplace-webhook",
            "path": "/mutate",
            "port": 443,
        }
    }
    # A map's pod is left out by its label, before any CEL condition is evaluated.
    assert legacy["objectSelector"] == {
        "matchExpressions": [{"key": MAP_LABEL, "operator": "DoesNotExist"}]
    }
    expressions = " && ".join(c["expression"] for c in legacy["matchConditions"])
    assert f'"{LEGACY_ANNOTATION}" in object.metadata.annotations' in expressions
    assert 'object.spec.schedulerName in ["gpu-scheduler", "b"]' in expressions


def test_validating_configuration_shape() -> None:
    config = validating_configuration("gpuplace", Endpoint(url="https://h:1"))
    (maps,) = config["webhooks"]
    assert maps["clientConfig"] == {"url": "https://h:1/validate"}
    assert maps["objectSelector"] == {"matchLabels": {PLACEMENT_MAP_LABEL: "true"}}
    assert maps["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert maps["rules"][0]["resources"] == ["configmaps"]
    assert maps["failurePolicy"] == "Fail"
    # A 1 MiB map takes seconds to validate; pod admission keeps its short timeout.
    assert maps["timeoutSeconds"] == 15


def test_with_ca_bundle_sets_every_webhook_once() -> None:
    config = mutating_configuration("g", Endpoint(url="https://h"), legacy_scheduler_names=["s"])
    updated = with_ca_bundle(config, b"CA")
    assert updated is not None
    assert {w["clientConfig"]["caBundle"] for w in updated["webhooks"]} == {"Q0E="}
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]  # the input is not changed
    assert with_ca_bundle(updated, b"CA") is None
