"""kubeio.pod: the one reader of a pod, for the controller, the webhook and the CLI; and
placement.podmeta: what gpuplace reads in its labels and annotations."""

from __future__ import annotations

from typing import Any

import pytest

from kubeio.pod import MalformedPodError, Pod
from placement.annotations import (
    INDEX_ANNOTATION,
    LEGACY_ANNOTATION,
    MAP_LABEL,
    UNVERIFIABLE_CONDITION,
)
from placement.errors import PlacementError
from placement.podmeta import has_binding, identity_of, legacy_line, map_name_of, prebound_line


def pod_obj(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ml",
            "name": "web-3",
            "uid": "u3",
            "generateName": "web-",
            "labels": {MAP_LABEL: "llm"},
            "annotations": {LEGACY_ANNOTATION: "3=node-a:0,1\n4=node-a:1"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "controller": False},
                {"kind": "StatefulSet", "controller": True},
            ],
            "creationTimestamp": "2026-11-26T10:00:00Z",
            **meta,
        },
        "spec": {
            "nodeName": "node-a",
            "schedulerName": "gpuplace",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": UNVERIFIABLE_CONDITION, "status": "True", "reason": "R", "message": "m"},
            ],
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "web-3-gpus-x"}],
        },
    }


def test_the_trusted_and_the_checked_reader_give_the_same_view() -> None:
    obj = pod_obj()
    assert Pod.of(obj) == Pod.read(obj)
    pod = Pod.of(obj)
    assert (pod.key, str(pod), pod.uid, map_name_of(pod)) == ("ml/web-3", "ml/web-3", "u3", "llm")
    assert pod.owner_kind == "StatefulSet" and pod.generated and pod.bound and not pod.finished
    assert pod.ref.kind == "Pod" and pod.ref.uid == "u3"
    assert identity_of(pod).name == "web-3"


def test_conditions_claims_and_the_legacy_line() -> None:
    pod = Pod.of(pod_obj())
    cond = pod.condition(UNVERIFIABLE_CONDITION)
    assert cond is not None and (cond.reason, cond.message) == ("R", "m")
    assert pod.condition("PodScheduled", status="False") is None
    assert pod.has_claim("gpus") and not pod.has_claim("other")
    assert pod.generated_claim("gpus") == "web-3-gpus-x" and pod.generated_claim("x") is None
    line = legacy_line(pod)
    assert line.index == 3 and line.entry is not None and line.entry.node == "node-a"
    assert [e.index for e in line.entries] == [3, 4]


def test_a_broken_legacy_line_names_the_pod_and_the_annotation() -> None:
    pod = Pod.of(pod_obj(annotations={LEGACY_ANNOTATION: "3=node-a"}))
    with pytest.raises(PlacementError) as err:
        legacy_line(pod)
    assert f"pod ml/web-3 annotation {LEGACY_ANNOTATION}:1:" in err.value.format()


def test_a_prebound_line_is_read_only_for_a_pod_without_a_gpuplace_binding() -> None:
    plain = Pod.of(pod_obj())
    line = prebound_line(plain)
    assert not has_binding(plain) and line is not None and line.index == 3
    bound = Pod.of(pod_obj(annotations={LEGACY_ANNOTATION: "3=node-a:0", INDEX_ANNOTATION: "3"}))
    assert has_binding(bound) and prebound_line(bound) is None
    broken = Pod.of(pod_obj(annotations={LEGACY_ANNOTATION: "3=node-a"}))
    assert prebound_line(broken) is None
    other_index = Pod.of(pod_obj(annotations={LEGACY_ANNOTATION: "4=node-a:0"}))
    assert prebound_line(other_index) is None
    assert prebound_line(Pod.of(pod_obj(annotations={}))) is None


def test_a_new_pod_without_a_name_reads_as_generated() -> None:
    obj = {"metadata": {"generateName": "job-"}, "spec": {}}
    pod = Pod.read(obj, "batch")
    assert str(pod) == "batch/job-<generated>" and not pod.bound and pod.uid == ""


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (None, "carries no pod"),
        ({"metadata": {"namespace": "a"}}, "spec must be an object"),
        ({"metadata": [], "spec": {}}, "metadata must be an object"),
        ({"metadata": {"labels": {"a": 1}}, "spec": {}}, "metadata.labels['a']"),
        ({"metadata": {"name": 5}, "spec": {}}, "metadata.name must be a string"),
        ({"metadata": {"ownerReferences": {}}, "spec": {}}, "ownerReferences must be a list"),
        ({"metadata": {}, "spec": {"nodeName": []}}, "spec.nodeName must be a string"),
        ({"metadata": {}, "spec": {}, "status": []}, "status must be an object"),
    ],
)
def test_the_checked_reader_names_the_malformed_field(obj: Any, field: str) -> None:
    with pytest.raises(MalformedPodError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Pod.read(obj, "ns")


def test_a_namespace_comes_from_the_request_or_the_object() -> None:
    assert Pod.read({"metadata": {"namespace": "own"}, "spec": {}}).namespace == "own"
    assert Pod.read({"metadata": {"namespace": "own"}, "spec": {}}, "req").namespace == "req"
    with pytest.raises(MalformedPodError, match="names a namespace"):
        Pod.read({"metadata": {}, "spec": {}})
