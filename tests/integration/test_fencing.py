"""Fenced leadership, judged from the apiserver's side: its audit log records every Binding it
received, with the User-Agent of the replica that sent it (`gpuplace-controller/<identity>`).

A replica that lost its lease (paused past it, or slower to start than it) must send no Binding
after that, even with decisions from its old cache still queued."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from kubeio.errors import FencedError
from placement.annotations import DEVICES_ANNOTATION
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    map_yaml,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """Removed, pods and maps with it, before the next test: its controllers find a quiet cluster."""
    with fresh_namespace(cluster, "fence", wait=True, timeout=180) as name:
        yield name


def bindings_by(cluster: LocalCluster, identity: str, namespace: str) -> list[datetime]:
    """When the apiserver received each Binding that `identity` sent to pods of `namespace`,
    accepted or refused."""
    return [
        datetime.fromisoformat(e["requestReceivedTimestamp"])
        for e in cluster.audit_events()
        if e.get("userAgent") == f"gpuplace-controller/{identity}"
        and e.get("objectRef", {}).get("subresource") == "binding"
        and e.get("objectRef", {}).get("namespace") == namespace
    ]


def audit_barrier(cluster: LocalCluster, namespace: str) -> None:
    """Returns once the audit log holds every Binding answered before it was called: the
    apiserver writes each request's event as the request completes, so the event of a Binding
    this sends now (to a pod that does not exist: refused, and audited all the same) comes after
    theirs."""
    marker = unique("audit-barrier")
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": marker, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "nowhere"},
    }
    status, _ = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods/{marker}/binding", body
    )
    assert status == 404, status
    wait_for(
        "the audit log to reach the barrier",
        lambda: any(e.get("objectRef", {}).get("name") == marker for e in cluster.audit_events()),
    )


def lease(cluster: LocalCluster, name: str) -> dict[str, Any]:
    status, body = cluster.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/gpuplace-system/leases/{name}"
    )
    assert status == 200, body
    spec: dict[str, Any] = body["spec"]
    return spec


def no_gpu_held_twice(pods: dict[str, dict[str, Any]]) -> None:
    seen: set[tuple[str, str]] = set()
    for pod in pods.values():
        for gpu in pod["metadata"]["annotations"][DEVICES_ANNOTATION].split(","):
            assert (pod["spec"]["nodeName"], gpu) not in seen
            seen.add((pod["spec"]["nodeName"], gpu))


@pytest.mark.slow
def test_a_leader_paused_past_its_lease_sends_no_binding_after_it(
    cluster: LocalCluster, namespace: str
) -> None:
    nodes = gpu_nodes(cluster, unique("pause"), 25, gpus=8)
    entries = [(i, nodes[i // 8], [i % 8]) for i in range(200)]
    apply_map(cluster, namespace, "big", map_yaml(namespace, "big", entries))
    name = unique("gpuplace-pause")
    a_id, b_id = unique("a"), unique("b")
    a = ControllerProcess(cluster, a_id, lease=name)
    wait_for("a leads", lambda: "leading: model generation" in a.log())
    b = ControllerProcess(cluster, b_id, lease=name)
    try:
        create_workload(cluster, statefulset(namespace, "big", "big", 200))
        wait_for("a binds", lambda: len(bindings_by(cluster, a_id, namespace)) >= 10, interval=0.05)
        os.killpg(a.proc.pid, signal.SIGSTOP)  # mid-burst: its queue still holds decisions
        stopped = datetime.now(UTC)
        wait_for("b takes over", lambda: lease(cluster, name)["holderIdentity"] == b_id)
        wait_for("b binds", lambda: len(bindings_by(cluster, b_id, namespace)) >= 1)
        resumed = datetime.now(UTC)
        os.killpg(a.proc.pid, signal.SIGCONT)
        pods = wait_for(
            "all 200 bound",
            lambda: (p := bound_pods(cluster, namespace)) and len(p) == 200 and p,
            timeout=240,
            interval=1.0,
        )
        wait_for("a exits", lambda: not a.alive(), timeout=30)
        audit_barrier(cluster, namespace)
    finally:
        if a.alive():
            os.killpg(a.proc.pid, signal.SIGCONT)
        a.kill()
        b.stop()
    sent = bindings_by(cluster, a_id, namespace)
    taken_over = datetime.fromisoformat(lease(cluster, name)["acquireTime"])
    assert stopped < taken_over < resumed
    assert sent, "a bound nothing before it was paused"
    late = [t for t in sent if t >= taken_over]
    assert not late, f"{len(late)} Bindings from {a_id} after {b_id} took the lease"
    assert a.proc.returncode == 1
    assert "exiting with status 1" in a.log()
    no_gpu_held_twice(pods)


@pytest.mark.slow
def test_a_start_up_slower_than_the_lease_keeps_it(cluster: LocalCluster, namespace: str) -> None:
    nodes = gpu_nodes(cluster, unique("slow"), 2, gpus=8)
    entries = [(i, nodes[i // 8], [i % 8]) for i in range(16)]
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", entries))
    create_workload(cluster, statefulset(namespace, "m", "m", 16))
    name = unique("gpuplace-slow")
    a_id, b_id = unique("a"), unique("b")
    # Lease 3 s; a start-up of 8 s: the lease is renewed throughout.
    a = ControllerProcess(cluster, a_id, "--startup-delay-seconds=8", lease=name)
    try:
        wait_for("a wins the lease", lambda: "became leader" in a.log())
        b = ControllerProcess(cluster, b_id, lease=name)
        try:
            pods = wait_for_bound(cluster, namespace, 16, "all 16 bound", timeout=60)
            spec = lease(cluster, name)
            assert spec["holderIdentity"] == a_id
            assert spec.get("leaseTransitions", 0) == 0
            assert "became leader" not in b.log()
        finally:
            b.stop()
    finally:
        a.stop()
    audit_barrier(cluster, namespace)
    assert len(bindings_by(cluster, a_id, namespace)) == 16
    assert bindings_by(cluster, b_id, namespace) == []
    no_gpu_held_twice(pods)


def test_a_lease_lost_during_start_up_means_no_binding(
    cluster: LocalCluster, namespace: str
) -> None:
    nodes = gpu_nodes(cluster, unique("lost"), 1, gpus=8)
    entries = [(i, nodes[0], [i]) for i in range(8)]
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", entries))
    create_workload(cluster, statefulset(namespace, "m", "m", 8))
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    wait_for("8 pods", lambda: len(cluster.request("GET", pods_path)[1]["items"]) == 8)
    name = unique("gpuplace-lost")
    a_id = unique("a")
    a = ControllerProcess(cluster, a_id, "--startup-delay-seconds=6", lease=name)
    try:
        wait_for("a wins the lease", lambda: "became leader" in a.log())
        # Another holder takes the lease while a is still starting up (as a replica would
        # after a partition): a must notice and never start binding.
        path = f"/apis/coordination.k8s.io/v1/namespaces/gpuplace-system/leases/{name}"

        def take() -> bool:
            status, body = cluster.request("GET", path)
            assert status == 200, body
            body["spec"].update(holderIdentity="intruder", leaseDurationSeconds=3600)
            return cluster.request("PUT", path, body)[0] == 200  # 409 when a renewed meanwhile

        wait_for("the lease taken", take)
        wait_for("a exits", lambda: not a.alive(), timeout=30)
    finally:
        a.kill()
    audit_barrier(cluster, namespace)
    assert bindings_by(cluster, a_id, namespace) == []
    assert bound_pods(cluster, namespace) == {}
    assert a.proc.returncode == 1
    assert "lost leadership: intruder holds the lease" in a.log()


def test_a_guarded_request_whose_guard_fails_is_not_sent(
    cluster: LocalCluster, namespace: str
) -> None:
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    kube.create(path, {"metadata": {"name": "warm"}})  # a pooled connection, ready to reuse
    calls: list[bool] = []

    def guard() -> bool:
        calls.append(False)
        return False

    with pytest.raises(FencedError):
        kube.create(path, {"metadata": {"name": "fenced"}}, guard=guard)
    assert calls == [False]
    assert cluster.request("GET", f"{path}/fenced")[0] == 404
    kube.create(path, {"metadata": {"name": "sent"}}, guard=lambda: True)
    assert cluster.request("GET", f"{path}/sent")[0] == 200


@pytest.mark.slow
def test_a_leader_stopped_mid_burst_drains_before_it_releases_the_lease(
    cluster: LocalCluster, namespace: str
) -> None:
    """SIGTERM while Bindings are in flight: the old leader stops sending, waits for the answers,
    and only then releases the Lease. The audit log's completion time of each of its Bindings
    comes before the standby took the Lease over (its acquireTime); a Binding of the old leader's
    completing after that would be one that a second leader could race."""
    nodes = gpu_nodes(cluster, unique("drain"), 25, gpus=8)
    entries = [(i, nodes[i // 8], [i % 8]) for i in range(200)]
    apply_map(cluster, namespace, "big", map_yaml(namespace, "big", entries))
    name = unique("gpuplace-drain")
    a_id, b_id = unique("a"), unique("b")
    a = ControllerProcess(cluster, a_id, lease=name)
    wait_for("a leads", lambda: "leading: model generation" in a.log())
    b = ControllerProcess(cluster, b_id, lease=name)
    try:
        create_workload(cluster, statefulset(namespace, "big", "big", 200))
        wait_for("a binds", lambda: len(bindings_by(cluster, a_id, namespace)) >= 10, interval=0.05)
        a.stop()  # mid-burst
        wait_for("a exits", lambda: not a.alive(), timeout=30)
        wait_for("b takes over", lambda: lease(cluster, name)["holderIdentity"] == b_id)
        pods = wait_for(
            "all 200 bound",
            lambda: (p := bound_pods(cluster, namespace)) and len(p) == 200 and p,
            timeout=240,
            interval=1.0,
        )
        audit_barrier(cluster, namespace)
    finally:
        a.kill()
        b.stop()
    completed = [
        datetime.fromisoformat(e["stageTimestamp"])
        for e in cluster.audit_events()
        if e.get("userAgent") == f"gpuplace-controller/{a_id}"
        and e.get("objectRef", {}).get("subresource") == "binding"
        and e.get("objectRef", {}).get("namespace") == namespace
    ]
    taken_over = datetime.fromisoformat(lease(cluster, name)["acquireTime"])
    assert completed, "a bound nothing before it was stopped"
    late = [t for t in completed if t >= taken_over]
    assert not late, f"{len(late)} Bindings from {a_id} completed after {b_id} took the lease"
    assert a.proc.returncode == 0
    assert "the lease is not released" not in a.log()
    assert bindings_by(cluster, b_id, namespace), "b bound the rest"
    no_gpu_held_twice(pods)
