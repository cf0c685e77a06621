"""The benchmark's reference webhook (Go): built from its source with the local toolchain, it
answers each AdmissionReview with its uid and the one patch it was given, over HTTP/1.1 only (as
gpuplace's webhook serves), and refuses what is not a review."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench import _refwebhook
from bench._refwebhook import ReferenceWebhook
from webhook.certs import generate_ca, issue_serving

PATCH = [
    {
        "op": "add",
        "path": "/spec/containers/0/env",
        "value": [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}],
    }
]


@pytest.fixture
def reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReferenceWebhook]:
    monkeypatch.setenv("GPUPLACE_CACHE", str(tmp_path / "cache"))
    ca = generate_ca("bench-ca", timedelta(days=1))
    serving = issue_serving(ca, ["localhost"], ["127.0.0.1"], timedelta(days=1))
    files = {"ca.pem": ca.cert_pem, "tls.crt": serving.cert_pem, "tls.key": serving.key_pem}
    for name, pem in files.items():
        (tmp_path / name).write_bytes(pem)
    server = ReferenceWebhook(
        tmp_path / "run", PATCH, tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.pem"
    )
    try:
        yield server
    finally:
        server.stop()


def _context(reference: ReferenceWebhook, tmp_path: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


def _post(reference: ReferenceWebhook, tmp_path: Path, body: bytes) -> tuple[int, bytes, str]:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", reference.port, context=_context(reference, tmp_path), timeout=10
    )
    try:
        conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert conn.sock is not None
        alpn = conn.sock.selected_alpn_protocol() or ""
        return answer.status, answer.read(), alpn
    finally:
        conn.close()


def test_it_answers_each_review_with_its_uid_and_the_given_patch(
    reference: ReferenceWebhook, tmp_path: Path
) -> None:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "4b1d0c2e-uid", "object": {"kind": "Pod"}},
    }
    status, body, alpn = _post(reference, tmp_path, json.dumps(review).encode())
    assert status == 200
    assert alpn != "h2"
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "4b1d0c2e-uid"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == PATCH
    assert reference.reviews() == 1


@pytest.mark.parametrize("body", [b"not json", b'{"kind": "AdmissionReview"}', b"[]"])
def test_what_is_not_a_review_gets_400_and_is_not_counted(
    reference: ReferenceWebhook, tmp_path: Path, body: bytes
) -> None:
    status, _, _ = _post(reference, tmp_path, body)
    assert status == 400
    assert reference.reviews() == 0


def test_the_binary_is_built_once_per_source(reference: ReferenceWebhook, tmp_path: Path) -> None:
    built = _refwebhook.binary()
    assert built.parent == tmp_path / "cache" / "bench"
    assert [p.name for p in built.parent.iterdir()] == [built.name]
    assert _refwebhook.binary() == built
