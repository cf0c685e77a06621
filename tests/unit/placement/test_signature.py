"""The binder's signature over a Binding's annotations: what it covers, what breaks it."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_ANNOTATION,
    SIGNATURE_ANNOTATION,
    BindingDecision,
    Signature,
    decode_binding,
    encode_binding,
    signature_of,
    signed_binding,
    verify_binding,
)
from placement.keyring import key_id
from placement.types import GpuUuid, MapKey, NodeName

KEY = b"k" * 32
KID = key_id(KEY)
DECISION = BindingDecision(
    MapKey("team", "llm"),
    3,
    NodeName("gpu-a-01"),
    (GpuUuid("GPU-aaaa"), GpuUuid("GPU-bbbb")),
    "0,1",
    7,
)


def sign(key: bytes = KEY, kid: str = KID) -> dict[str, str]:
    return signed_binding(key, kid, "uid-1", "team", DECISION)


def test_signed_binding_names_its_key_verifies_and_decodes() -> None:
    annotations = sign()
    assert annotations[SIGNATURE_ANNOTATION].startswith(f"v2:{KID}:")
    assert Signature.parse(annotations[SIGNATURE_ANNOTATION]) == signature_of(annotations)
    assert signature_of(annotations) is not None and signature_of(annotations).key_id == KID  # type: ignore[union-attr]
    assert verify_binding(KEY, "uid-1", "team", annotations)
    assert decode_binding("team", annotations) == DECISION
    # Annotations outside gpuplace.io/ are the pod owner's business, not the binding's.
    assert verify_binding(KEY, "uid-1", "team", {**annotations, "team/owner": "me"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (CUDA_ANNOTATION, "2,3"),
        (DEVICES_ANNOTATION, "GPU-cccc"),
        (INDEX_ANNOTATION, "4"),
        ("gpuplace.io/node", "gpu-b-01"),
        ("gpuplace.io/map", "other"),
        ("gpuplace.io/model-generation", "8"),
        ("gpuplace.io/added-later", "x"),
        (SIGNATURE_ANNOTATION, "v1:forged"),
        (SIGNATURE_ANNOTATION, f"v2:{KID}:forged"),
    ],
)
def test_any_change_breaks_the_signature(key: str, value: str) -> None:
    annotations = sign()
    assert not verify_binding(KEY, "uid-1", "team", {**annotations, key: value})


def test_the_key_id_is_covered_by_the_mac() -> None:
    annotations = sign()
    mac = annotations[SIGNATURE_ANNOTATION].rsplit(":", 1)[1]
    renamed = {**annotations, SIGNATURE_ANNOTATION: f"v2:{'0' * 16}:{mac}"}
    assert not verify_binding(KEY, "uid-1", "team", renamed)


def sign_v1(key: bytes, uid: str, namespace: str) -> dict[str, str]:
    """What the binder wrote before key ids: HMAC-SHA256 over "v1", uid, namespace, fields."""
    annotations = encode_binding(DECISION)
    fields = sorted((k, v) for k, v in annotations.items())
    text = "\n".join(["v1", uid, namespace, *(f"{k}={v}" for k, v in fields)]).encode()
    digest = hmac.new(key, text, hashlib.sha256).digest()
    mac = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    return {**annotations, SIGNATURE_ANNOTATION: f"v1:{mac}"}


def test_v1_signatures_of_the_releases_before_the_ring_still_verify() -> None:
    annotations = sign_v1(KEY, "uid-1", "team")
    assert verify_binding(KEY, "uid-1", "team", annotations)
    assert not verify_binding(b"x" * 32, "uid-1", "team", annotations)


@pytest.mark.parametrize("value", ["", "v1:", "v2:abc", "v2::mac", "v3:a:b", "garbage", "v2:a:b:c"])
def test_malformed_signatures_parse_to_nothing(value: str) -> None:
    assert Signature.parse(value) is None


def test_signature_is_bound_to_pod_namespace_and_key() -> None:
    annotations = sign()
    assert not verify_binding(KEY, "uid-2", "team", annotations)  # copied onto another pod
    assert not verify_binding(KEY, "uid-1", "other", annotations)
    assert not verify_binding(b"x" * 32, "uid-1", "team", annotations)
    unsigned = dict(annotations)
    del unsigned[SIGNATURE_ANNOTATION]
    assert not verify_binding(KEY, "uid-1", "team", unsigned)
