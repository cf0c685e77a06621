"""What the controller's informers keep of a pod and a node (controller/trim.py): everything
gpuplace reads reads the same from the trimmed object, and what it does not read is gone."""

from __future__ import annotations

import json
from typing import Any

import orjson

from controller import podfacts
from controller.nodekeeper import node_state
from controller.trim import (
    MAX_LABEL_BYTES,
    NODE_SHAPE,
    POD_SHAPE,
    same_node,
    trim_namespace,
    trim_node,
    trim_pod,
)
from kubeio.pod import Pod
from placement.annotations import (
    CUDA_ANNOTATION,
    INDEX_LABEL,
    JOB_COMPLETION_INDEX,
    LEGACY_ANNOTATION,
    MAP_LABEL,
    SIGNATURE_ANNOTATION,
)
from placement.dra import POD_CLAIM_NAME
from tests.unit.webhook_builders import admitted_container


def full_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "ml",
            "name": "web-3",
            "uid": "u3",
            "resourceVersion": "17",
            "generateName": "web-",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "labels": {MAP_LABEL: "llm", INDEX_LABEL: "3", "team": "a"},
            "annotations": {
                CUDA_ANNOTATION: "0,1",
                SIGNATURE_ANNOTATION: "v2:k1:abc",
                JOB_COMPLETION_INDEX: "3",
                LEGACY_ANNOTATION: "3=gpu-node-01:0",
                "unrelated": "x" * 200_000,
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s",
                 "controller": True, "blockOwnerDeletion": True}
            ],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:x": {}}}],
        },
        "spec": {
            "schedulerName": "gpuplace",
            "nodeName": "gpu-node-01",
            "containers": [
                {
                    **admitted_container("main"),
                    "image": "cuda",
                    "args": ["y" * 50_000],
                    "resources": {"claims": [{"name": POD_CLAIM_NAME}], "limits": {"cpu": "1"}},
                }
            ],
            "initContainers": [{"name": "setup", "env": [{"name": "OTHER", "value": "z"}]}],
            "resourceClaims": [{"name": POD_CLAIM_NAME, "resourceClaimTemplateName": "t"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SlotTaken",
                 "message": "m" * 5000}
            ],
            "resourceClaimStatuses": [{"name": POD_CLAIM_NAME, "resourceClaimName": "c-1"}],
            "containerStatuses": [{"name": "main", "image": "cuda", "ready": True}],
        },
    }  # fmt: skip


def view(pod: Pod) -> tuple[Any, ...]:
    return (
        pod.namespace, pod.name, pod.uid, pod.generate_name, dict(pod.labels), pod.owner_kind,
        pod.created, pod.deleting, pod.node_name, pod.scheduler_name, pod.phase,
        pod.has_claim(POD_CLAIM_NAME), pod.generated_claim(POD_CLAIM_NAME),
        pod.condition("PodScheduled", "False") is not None,
    )  # fmt: skip


def test_a_trimmed_pod_reads_as_the_whole_one_for_every_reader() -> None:
    whole = Pod.of(full_pod())
    trimmed = Pod.of(trim_pod(full_pod(), legacy=True))
    assert view(trimmed) == view(whole)
    for legacy in (False, True):
        assert podfacts.facts(trimmed, legacy) == podfacts.facts(whole, legacy)
    assert trimmed.annotations == {k: v for k, v in whole.annotations.items() if k != "unrelated"}
    # The init container's own variable is not one gpuplace wires: dropped.
    assert [c.env for c in trimmed.containers()] == [(), tuple(admitted_container("main")["env"])]
    assert trimmed.obj["metadata"]["resourceVersion"] == "17"


def test_what_gpuplace_does_not_read_is_dropped() -> None:
    trimmed = trim_pod(full_pod(), legacy=False)
    assert len(json.dumps(trimmed)) < 2500
    assert LEGACY_ANNOTATION not in trimmed["metadata"]["annotations"]  # not an earlier tool's pod
    assert "managedFields" not in trimmed["metadata"]
    assert "volumes" not in trimmed["spec"]
    assert "containerStatuses" not in trimmed["status"]
    assert len(trimmed["status"]["conditions"][0]["message"]) == 1024


def test_labels_past_the_budget_keep_only_those_gpuplace_knows() -> None:
    obj = full_pod()
    obj["metadata"]["labels"].update({f"l{i}": "v" * 60 for i in range(MAX_LABEL_BYTES // 60)})
    labels = trim_pod(obj, legacy=False)["metadata"]["labels"]
    assert labels == {MAP_LABEL: "llm", INDEX_LABEL: "3"}


def test_a_pod_of_odd_shape_is_trimmed_without_failing() -> None:
    obj = {"metadata": {"namespace": "ml", "name": "p"}, "spec": {"containers": ["x", {}]},
           "status": {"conditions": "no"}}  # fmt: skip
    trimmed = trim_pod(obj, legacy=False)
    assert Pod.of(trimmed).containers()[0].name == ""


def full_node() -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-node-01", "resourceVersion": "5", "labels": {"gpu-node-name": "a"},
                     "annotations": {"big": "x" * 10_000}},
        "spec": {"unschedulable": True, "podCIDR": "10.0.0.0/24"},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": "True"}],
            "images": [{"names": ["i" * 200], "sizeBytes": 1}] * 50,
            "capacity": {"cpu": "8"},
        },
    }  # fmt: skip


def test_a_trimmed_node_keeps_its_state_and_labels() -> None:
    node = full_node()
    trimmed = trim_node(node)
    assert node_state(trimmed, "gpu-node-name") == node_state(node, "gpu-node-name")
    assert trimmed["metadata"]["labels"] == {"gpu-node-name": "a"}
    assert len(json.dumps(trimmed)) < 300


def heartbeat(node: dict[str, Any], version: str) -> dict[str, Any]:
    """The node as its next heartbeat writes it: a new resourceVersion and heartbeat time."""
    beat = json.loads(json.dumps(node))
    beat["metadata"]["resourceVersion"] = version
    for cond in beat["status"]["conditions"]:
        cond["lastHeartbeatTime"] = f"2026-01-01T00:00:{version}Z"
    return beat


def test_a_heartbeat_leaves_the_trimmed_node_the_same_but_for_its_version() -> None:
    before = trim_node(full_node())
    after = trim_node(heartbeat(full_node(), "6"))
    assert after != before
    assert same_node(before, after)


def test_any_change_the_controller_reads_makes_the_node_another() -> None:
    before = trim_node(full_node())
    changes = [
        lambda n: n["metadata"]["labels"].update({"team": "b"}),
        lambda n: n["metadata"].update({"deletionTimestamp": "2026-01-02T00:00:00Z"}),
        lambda n: n["spec"].pop("unschedulable"),
        lambda n: n["status"]["conditions"][1].update({"status": "False"}),
        lambda n: n["status"].pop("conditions"),
        lambda n: n.pop("spec"),
    ]
    for change in changes:
        node = heartbeat(full_node(), "6")
        change(node)
        assert not same_node(before, trim_node(node)), node


def test_a_trimmed_namespace_keeps_its_labels() -> None:
    ns = {"metadata": {"name": "a", "resourceVersion": "1", "labels": {"x": "y"},
                       "annotations": {"big": "z" * 1000}}, "spec": {"finalizers": ["kubernetes"]}}  # fmt: skip
    assert trim_namespace(ns) == {
        "metadata": {"name": "a", "resourceVersion": "1", "labels": {"x": "y"}}
    }


def listed(*items: dict[str, Any]) -> bytes:
    return orjson.dumps({"kind": "List", "metadata": {"resourceVersion": "9"}, "items": items})


def test_a_pod_decoded_by_its_shape_trims_to_what_the_whole_pod_trims_to() -> None:
    nulls = full_pod()
    nulls["metadata"]["labels"] = None  # a Go nil map without omitempty
    nulls["spec"]["containers"][0]["env"] = None
    nulls["status"]["conditions"][0]["lastProbeTime"] = None
    for obj in (full_pod(), nulls):
        page = POD_SHAPE.page(listed(obj))
        assert page["metadata"] == {"resourceVersion": "9"}
        (shaped,) = page["items"]
        assert "managedFields" not in shaped["metadata"]  # never built
        assert "volumes" not in shaped["spec"]
        for legacy in (False, True):
            assert trim_pod(shaped, legacy=legacy) == trim_pod(obj, legacy=legacy)
        event = POD_SHAPE.event(orjson.dumps({"type": "MODIFIED", "object": obj}))
        assert event["type"] == "MODIFIED"
        assert trim_pod(event["object"], legacy=True) == trim_pod(obj, legacy=True)


def test_a_node_decoded_by_its_shape_trims_to_what_the_whole_node_trims_to() -> None:
    (shaped,) = NODE_SHAPE.page(listed(full_node()))["items"]
    assert "images" not in shaped["status"]
    assert trim_node(shaped) == trim_node(full_node())


def test_a_pod_the_shape_does_not_fit_is_decoded_whole_and_trimmed_as_before() -> None:
    odd = {"metadata": {"namespace": "ml", "name": "p", "generateName": 5},
           "spec": {"containers": ["x", {}]}, "status": {"conditions": "no"}}  # fmt: skip
    (item,) = POD_SHAPE.page(listed(odd))["items"]
    assert item == odd
    assert trim_pod(item, legacy=False) == trim_pod(odd, legacy=False)
