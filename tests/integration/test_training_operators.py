"""JobSet and LeaderWorkerSet, each run by its own controller manager (built from its Go module by
hack/build-training-operators.sh, its webhooks called by the apiserver on loopback), their pods
placed by rank over one gpuplace map by a real controller process (docs/training.md).

The managers are built on first use (minutes); the pods are gpuplace's without its webhook, so
each template carries the wiring the webhook would give it (placement/admitted.py). kwok plays
the pods once bound: a JobSet's pods are Job pods, which kwok completes at once, after they were
bound, which is all the test reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localtraining.launcher import LocalTrainingOperators
from placement.annotations import (
    INDEX_ANNOTATION,
    JOB_COMPLETION_INDEX,
    MAP_LABEL,
)
from tests.integration.controllerkit import (
    ControllerProcess,
    admitted,
    apply_map,
    create,
    describe_pending,
    fresh_namespace,
    gpu_nodes,
    list_pods,
    map_yaml,
    running_controller,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

JOBSET_INDEX = "jobset.sigs.k8s.io/job-global-index"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def operators(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    workdir = Path(tmp_path_factory.mktemp("training-operators"))
    with LocalTrainingOperators(cluster, workdir):
        yield


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "operators") as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster) as proc:
        yield proc


def pod_template(map_name: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {MAP_LABEL: map_name}},
        "spec": {
            "schedulerName": "gpuplace",
            "terminationGracePeriodSeconds": 0,
            "containers": [admitted("rank", "busybox")],
        },
    }


def four_slots(
    cluster: LocalCluster, prefix: str
) -> tuple[list[tuple[int, str, list[int]]], dict[int, str]]:
    """Slots 0..3 over two kwok nodes, crosswise (0 and 3 on one, 1 and 2 on the other), so a
    pod on the lowest free slot would show."""
    a, b = gpu_nodes(cluster, unique(prefix), 2)
    nodes = {0: a, 1: b, 2: b, 3: a}
    entries = [(i, nodes[i], [i // 2]) for i in range(4)]
    return entries, nodes


def placed(pod: dict[str, Any]) -> tuple[str, str] | None:
    node = pod["spec"].get("nodeName")
    if not node:
        return None
    return node, (pod["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION, "")


def labelled(cluster: LocalCluster, namespace: str, *keys: str) -> list[dict[str, Any]]:
    """The live pods carrying every label of `keys`."""
    return [
        p
        for p in list_pods(cluster, namespace)
        if all(k in (p["metadata"].get("labels") or {}) for k in keys)
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_jobset_of_two_jobs_of_two_pods_takes_its_ranks_slots(
    cluster: LocalCluster, operators: None, namespace: str, controller: ControllerProcess
) -> None:
    entries, nodes = four_slots(cluster, "jobset")
    apply_map(cluster, namespace, "train", map_yaml(namespace, "train", entries, podsPerJob="2"))
    job = {
        "parallelism": 2,
        "completions": 2,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {
            **pod_template("train"),
            "spec": {**pod_template("train")["spec"], "restartPolicy": "Never"},
        },
    }
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "replicatedJobs": [
                {"name": "a", "replicas": 1, "template": {"spec": job}},
                {"name": "b", "replicas": 1, "template": {"spec": job}},
            ]
        },
    }
    create(cluster, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets", body)
    ranks = bound_ranks(cluster, namespace, "the JobSet's", JOBSET_INDEX, JOB_COMPLETION_INDEX)
    assert ranks == {r: (nodes[r], str(r)) for r in range(4)}


def test_a_leaderworkerset_of_two_groups_of_two_takes_its_ranks_slots(
    cluster: LocalCluster, operators: None, namespace: str, controller: ControllerProcess
) -> None:
    entries, nodes = four_slots(cluster, "lws")
    apply_map(cluster, namespace, "serve", map_yaml(namespace, "serve", entries))
    body = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": pod_template("serve")},
        },
    }
    create(
        cluster,
        f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets",
        body,
    )
    ranks = bound_ranks(cluster, namespace, "the LeaderWorkerSet's", LWS_GROUP, LWS_WORKER)
    assert ranks == {r: (nodes[r], str(r)) for r in range(4)}


def bound_ranks(
    cluster: LocalCluster, namespace: str, whose: str, outer: str, inner: str
) -> dict[int, Any]:
    """Once the workload's 4 pods (labelled `outer` and `inner` by their controller) are bound:
    where each rank (outer x 2 + inner) is placed."""
    pods = wait_for(
        lambda: f"{whose} 4 pods bound: {describe_pending(cluster, namespace)}",
        lambda: (
            (p := labelled(cluster, namespace, outer, inner))
            and len(p) == 4
            and all(placed(x) for x in p)
            and p
        ),
        timeout=120,
    )
    labels = [pod["metadata"]["labels"] for pod in pods]
    return {
        int(lab[outer]) * 2 + int(lab[inner]): placed(pod)
        for lab, pod in zip(labels, pods, strict=True)
    }
