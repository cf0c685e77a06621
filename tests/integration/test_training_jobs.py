"""Training jobs on the real apiserver and kube-controller-manager: a `batch/v1` Indexed Job whose
pods the Job controller makes (generated names, the completion index label and annotation), placed
by rank by a real controller process; a gang that binds all its ranks or none (docs/training.md).

kwok plays only the pods bound to its nodes (a pod of gpuplace waits unbound, Pending, until the
binder binds it) and completes a Job's pods as soon as they run. The restart scenario needs a rank
that stays on its node until it is deleted, so its slot is on a node that no kubelet runs: Ready
by its status and a node Lease the test renews, as a kubelet would, and whose pods stay Pending
once bound, as with an image still pulling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
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
    inventory_for,
    list_pods,
    map_status,
    map_yaml,
    now,
    publish_inventory,
    running_controller,
    scheduled_condition,
    unique,
    wait_for,
)
from tests.integration.trustkit import events

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "train") as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster) as proc:
        yield proc


def indexed_job(namespace: str, name: str, map_name: str, ranks: int) -> dict[str, Any]:
    """An Indexed Job of `ranks` ranks, all at once, whose pods are gpuplace's."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "completionMode": "Indexed",
            "completions": ranks,
            "parallelism": ranks,
            "backoffLimit": 6,
            "template": {
                "metadata": {"labels": {MAP_LABEL: map_name}},
                "spec": {
                    "schedulerName": "gpuplace",
                    "restartPolicy": "Never",
                    # What gpuplace's webhook wires into a map's pod (placement/admitted.py):
                    # the binder places only pods that carry it.
                    "containers": [admitted("rank", "busybox")],
                },
            },
        },
    }


def create_job(cluster: LocalCluster, body: dict[str, Any]) -> None:
    create(cluster, f"/apis/batch/v1/namespaces/{body['metadata']['namespace']}/jobs", body)


def job_pods(cluster: LocalCluster, namespace: str) -> dict[int, dict[str, Any]]:
    """The Job's live pods (not being deleted), by their completion index."""
    return {
        int(p["metadata"]["labels"][JOB_COMPLETION_INDEX]): p
        for p in list_pods(cluster, namespace)
        if JOB_COMPLETION_INDEX in (p["metadata"].get("labels") or {})
        and not p["metadata"].get("deletionTimestamp")
    }


def placed(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(node, slot index) a pod was bound to, or None while it is not bound."""
    node = pod["spec"].get("nodeName")
    if not node:
        return None
    return node, (pod["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION, "")


def cordon(cluster: LocalCluster, node: str, unschedulable: bool) -> None:
    status, body = cluster.request(
        "PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": unschedulable}}
    )
    assert status == 200, body


def waiting_with(cluster: LocalCluster, namespace: str, ranks: set[int], reason: str) -> bool:
    """Every pod of `ranks` is there, unbound, its PodScheduled condition False with `reason`."""
    pods = job_pods(cluster, namespace)
    for rank in ranks:
        pod = pods.get(rank)
        if pod is None or pod["spec"].get("nodeName"):
            return False
        cond = scheduled_condition(pod) or {}
        if cond.get("status") != "False" or cond.get("reason") != reason:
            return False
    return True


@contextmanager
def kubeletless_node(cluster: LocalCluster, name: str, gpus: int) -> Iterator[str]:
    """A Ready node no kubelet runs: its pods stay Pending once bound (see the module's docstring).
    Its Lease is renewed until the block ends, so the node lifecycle controller keeps it Ready."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
    }
    create(cluster, "/api/v1/nodes", node)
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "lastHeartbeatTime": now()[:19] + "Z",
        "lastTransitionTime": now()[:19] + "Z",
    }
    status = {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}
    code, body = cluster.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status})
    assert code == 200, body
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now()},
    }
    create(cluster, leases, lease)
    publish_inventory(cluster, inventory_for(name, gpus))
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(5.0):
            cluster.request("PATCH", f"{leases}/{name}", {"spec": {"renewTime": now()}})

    renewer = threading.Thread(target=renew, name=f"lease-{name}", daemon=True)
    renewer.start()
    try:
        yield name
    finally:
        stop.set()
        renewer.join()
        cluster.request("DELETE", f"/api/v1/nodes/{name}")


def test_ranks_of_an_indexed_job_take_their_own_slots_whatever_frees_first(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    # Slots 0 and 3 on a node in maintenance, 1 and 2 on another: the ranks of the free node bind
    # at once, on their own slots; ranks 0 and 3 wait for theirs, never taking a free one.
    busy, free = gpu_nodes(cluster, unique("rank"), 2)
    entries = [(0, busy, [0]), (1, free, [0]), (2, free, [1]), (3, busy, [1])]
    cordon(cluster, busy, True)
    apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
    create_job(cluster, indexed_job(namespace, "train", "llm", 4))
    wait_for(
        lambda: f"ranks 1 and 2 bound, 0 and 3 waiting: {describe_pending(cluster, namespace)}",
        lambda: (
            (pods := job_pods(cluster, namespace))
            and all(placed(pods[r]) for r in (1, 2) if r in pods)
            and len(pods) == 4
            and waiting_with(cluster, namespace, {0, 3}, "NodeCordoned")
        ),
    )
    pods = job_pods(cluster, namespace)
    assert {r: placed(pods[r]) for r in (1, 2)} == {1: (free, "1"), 2: (free, "2")}
    cordon(cluster, busy, False)
    pods = wait_for(
        lambda: f"all 4 ranks bound: {describe_pending(cluster, namespace)}",
        lambda: (p := job_pods(cluster, namespace)) and all(placed(x) for x in p.values()) and p,
    )
    assert {r: placed(p) for r, p in pods.items()} == {
        0: (busy, "0"),
        1: (free, "1"),
        2: (free, "2"),
        3: (busy, "3"),
    }


def test_a_deleted_rank_comes_back_to_its_own_slot(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    # Ranks 1 to 3 stay on their node once bound (a node no kubelet runs); rank 0 runs on a kwok
    # node, which completes it, so its slot 0 is free when rank 2's replacement comes: the lowest
    # free slot, which a pod placed without its rank would take.
    (done,) = gpu_nodes(cluster, unique("rank-done"), 1)
    with kubeletless_node(cluster, unique("rank-quiet"), 4) as node:
        entries = [(0, done, [0]), *((i, node, [i]) for i in range(1, 4))]
        want = {0: (done, "0"), **{i: (node, str(i)) for i in range(1, 4)}}
        apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
        create_job(cluster, indexed_job(namespace, "train", "llm", 4))
        pods = wait_for(
            lambda: f"all 4 ranks bound, rank 0 done: {describe_pending(cluster, namespace)}",
            lambda: (
                (p := job_pods(cluster, namespace))
                and len(p) == 4
                and all(placed(x) for x in p.values())
                and p[0]["status"].get("phase") == "Succeeded"
                and p
            ),
        )
        assert {r: placed(p) for r, p in pods.items()} == want
        old = pods[2]["metadata"]["name"]
        path = f"/api/v1/namespaces/{namespace}/pods/{old}?gracePeriodSeconds=0"
        code, body = cluster.request("DELETE", path)
        assert code == 200, body
        # A failed rank: its Job makes a new pod of index 2, which the binder binds to slot 2.
        back = wait_for(
            lambda: f"rank 2 recreated and bound: {describe_pending(cluster, namespace)}",
            lambda: (
                (p := job_pods(cluster, namespace).get(2))
                and p["metadata"]["name"] != old
                and placed(p)
                and p
            ),
        )
        assert placed(back) == (node, "2")
        others = job_pods(cluster, namespace)
        assert {r: placed(p) for r, p in others.items()} == want


def test_a_gang_binds_none_of_its_ranks_until_every_slot_frees_then_all(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    nodes = gpu_nodes(cluster, unique("gang"), 2)
    entries = [(0, nodes[0], [0]), (1, nodes[0], [1]), (2, nodes[0], [2]), (3, nodes[1], [0])]
    cordon(cluster, nodes[1], True)  # slot 3's node
    text = map_yaml(namespace, "llm", entries, gang="{timeoutSeconds: 600}")
    apply_map(cluster, namespace, "llm", text)
    create_job(cluster, indexed_job(namespace, "train", "llm", 4))
    # A rank reports the gang as it found it when decided: the first ones saw fewer pods, and
    # say so until they are decided again (the binder's periodic flush, flush_seconds).
    wait_for(
        lambda: (
            f"4 ranks waiting GangWaiting, 3 of 4 ready: {describe_pending(cluster, namespace)}"
        ),
        lambda: (
            waiting_with(cluster, namespace, {0, 1, 2, 3}, "GangWaiting")
            and all(
                "3 of 4 ranks ready; slot 3 waits NodeCordoned"
                in (scheduled_condition(p) or {}).get("message", "")
                for p in job_pods(cluster, namespace).values()
            )
        ),
        timeout=120,
    )
    pods = job_pods(cluster, namespace)
    assert [r for r, p in pods.items() if placed(p)] == []
    # The map's status says the same, as the rank decided last found the gang.
    status = wait_for(
        lambda: f"map status with the gang waiting: {map_status(cluster, namespace, 'llm')}",
        lambda: (
            (s := map_status(cluster, namespace, "llm"))
            and (s.get("gang") or {}).get("ready") == 3
            and s
        ),
    )
    assert status["gang"]["waiting"] == [{"slot": 3, "reason": "NodeCordoned"}]
    assert not status["gang"]["stuck"]
    assert "gang: 3 of 4 ranks ready; slot 3 waits NodeCordoned" in status["message"]
    cordon(cluster, nodes[1], False)
    pods = wait_for(
        lambda: f"all 4 ranks bound: {describe_pending(cluster, namespace)}",
        lambda: (
            (p := job_pods(cluster, namespace))
            and len(p) == 4
            and all(placed(x) for x in p.values())
            and p
        ),
    )
    assert {r: placed(p) for r, p in pods.items()} == {
        0: (nodes[0], "0"),
        1: (nodes[0], "1"),
        2: (nodes[0], "2"),
        3: (nodes[1], "3"),
    }
    # Bound: the map's status no longer shows a waiting gang.
    wait_for(
        lambda: f"map status without a gang: {map_status(cluster, namespace, 'llm')}",
        lambda: (s := map_status(cluster, namespace, "llm")) and "gang" not in s,
    )


def test_a_gang_past_its_timeout_is_stuck_on_its_map_and_still_binds_none(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    (node,) = gpu_nodes(cluster, unique("stuck"), 1)
    entries = [(0, node, [0]), (1, node, [1])]
    text = map_yaml(namespace, "llm", entries, gang="{timeoutSeconds: 1}")
    apply_map(cluster, namespace, "llm", text)
    # One rank of two: the gang can never be complete while slot 1 has no pod.
    create_job(cluster, indexed_job(namespace, "train", "llm", 1))
    status = wait_for(
        lambda: f"the map's gang stuck: {map_status(cluster, namespace, 'llm')}",
        lambda: (
            (s := map_status(cluster, namespace, "llm"))
            and (s.get("gang") or {}).get("stuck")
            and s
        ),
        timeout=120,
    )
    assert status["gang"]["waiting"] == [{"slot": 1, "reason": ""}]
    assert "gang stuck: 1 of 2 ranks ready; slot 1 has no pod" in status["message"]
    (event,) = wait_for(
        "a GangStuck Event on the map's ConfigMap",
        lambda: [e for e in events(cluster, namespace, "llm") if e["reason"] == "GangStuck"],
    )
    assert event["type"] == "Warning"
    assert "1 of 2 ranks ready; slot 1 has no pod" in event["message"]
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert [r for r, p in job_pods(cluster, namespace).items() if placed(p)] == []
