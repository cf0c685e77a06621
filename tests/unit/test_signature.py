"""The binder's signature over a Binding's annotations: what it covers, what breaks it."""

from __future__ import annotations

import pytest

from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_ANNOTATION,
    SIGNATURE_ANNOTATION,
    BindingDecision,
    decode_binding,
    signed_binding,
    verify_binding,
)
from placement.types import GpuUuid, MapKey, NodeName

KEY = b"k" * 32
DECISION = BindingDecision(
    MapKey("team", "llm"),
    3,
    NodeName("gpu-a-01"),
    (GpuUuid("GPU-aaaa"), GpuUuid("GPU-bbbb")),
    "0,1",
    7,
)


def test_signed_binding_verifies_and_decodes() -> None:
    annotations = signed_binding(KEY, "uid-1", "team", DECISION)
    assert annotations[SIGNATURE_ANNOTATION].startswith("v1:")
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
    ],
)
def test_any_change_breaks_the_signature(key: str, value: str) -> None:
    annotations = signed_binding(KEY, "uid-1", "team", DECISION)
    assert not verify_binding(KEY, "uid-1", "team", {**annotations, key: value})


def test_signature_is_bound_to_pod_namespace_and_key() -> None:
    annotations = signed_binding(KEY, "uid-1", "team", DECISION)
    assert not verify_binding(KEY, "uid-2", "team", annotations)  # copied onto another pod
    assert not verify_binding(KEY, "uid-1", "other", annotations)
    assert not verify_binding(b"x" * 32, "uid-1", "team", annotations)
    unsigned = dict(annotations)
    del unsigned[SIGNATURE_ANNOTATION]
    assert not verify_binding(KEY, "uid-1", "team", unsigned)
