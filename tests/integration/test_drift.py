"""Maps that change under running pods, against the real apiserver and kwok nodes: drift made
visible, rollouts under control, allocation that falls back, provenance, last-known-good across a
restart, and a deleted node's inventory."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from gpuplace import inspect
from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from placement.annotations import (
    DEVICES_ANNOTATION,
    DRIFTED_CONDITION,
    INDEX_ANNOTATION,
    PLACEMENT_MAP_LABEL,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
    SOURCE_PATH_ANNOTATION,
)
from placement.inventory import INVENTORY_NAMESPACE
from placement.status import MapStatus
from tests.integration.controllerkit import (
    ControllerProcess,
    bound_pods,
    create,
    create_workload,
    deployment,
    fresh_namespace,
    get_pod,
    gpu_nodes,
    gpu_uuid,
    list_pods,
    map_status,
    map_yaml,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_map,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "drift") as name:
        yield name
        # The maps go now, not whenever the namespace finishes terminating: a controller of a
        # later test must not see them vanish in the middle of its own checks.
        selector = f"labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
        cluster.request("DELETE", f"/api/v1/namespaces/{name}/configmaps?{selector}")


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster, log_tail=6000) as proc:
        yield proc


def apply_at(
    cluster: LocalCluster, namespace: str, name: str, text: str, revision: str, file: str = ""
) -> None:
    """Applies a map as the ApplicationSet does: its text plus the revision it was rendered from
    and its file (directory stamped by the Application, file by the kustomization)."""
    annotations = {REVISION_ANNOTATION: revision, SOURCE_PATH_ANNOTATION: "clusters/dev"}
    if file:
        annotations[SOURCE_FILE_ANNOTATION] = file
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {PLACEMENT_MAP_LABEL: "true"},
        "annotations": annotations,
    }
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"placement.yaml": text},
    }
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    status, resp = cluster.request("POST", path, body)
    if status == 409:
        patch = {"metadata": {"annotations": annotations}, "data": body["data"]}
        status, resp = cluster.request("PATCH", f"{path}/{name}", patch)
    assert status in (200, 201), resp


def drifted_condition(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for cond in (pod or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == DRIFTED_CONDITION:
            return dict(cond)
    return None


def wait_for_drifted(
    cluster: LocalCluster, namespace: str, name: str, status: str = "True"
) -> dict[str, Any]:
    """Waits until pod `name` has a Drifted condition of `status`; returns the condition."""
    return dict(
        wait_for(
            f"{name} Drifted={status}",
            lambda: (
                (c := drifted_condition(get_pod(cluster, namespace, name)))
                and c["status"] == status
                and c
            ),
        )
    )


def running(pod: dict[str, Any]) -> bool:
    return bool(
        pod["spec"].get("nodeName")
        and pod.get("status", {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    )


def metrics_of(proc: ControllerProcess) -> str:
    port = wait_for(
        "metrics port in the log", lambda: re.search(r"metrics on port (\d+)", proc.log())
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def healthz(proc: ControllerProcess) -> int:
    port = wait_for(
        "metrics port in the log", lambda: re.search(r"metrics on port (\d+)", proc.log())
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/healthz", timeout=5) as resp:
        return int(resp.status)


def test_moved_slot_of_a_manual_map_marks_the_running_pod_drifted(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    a, b = gpu_nodes(cluster, unique("man"), 2)
    apply_at(
        cluster,
        namespace,
        "llm",
        map_yaml(namespace, "llm", [(0, a, [0, 1])]),
        "c0ffee1",
        "maps/llm.yaml",
    )
    create_workload(cluster, statefulset(namespace, "web", "llm", 1))
    pod = wait_for(
        "web-0 Running", lambda: (p := get_pod(cluster, namespace, "web-0")) and running(p) and p
    )
    uid = pod["metadata"]["uid"]
    assert pod["metadata"]["annotations"][REVISION_ANNOTATION] == "c0ffee1"
    assert pod["metadata"]["annotations"][SOURCE_FILE_ANNOTATION] == "clusters/dev/maps/llm.yaml"

    apply_at(
        cluster,
        namespace,
        "llm",
        map_yaml(namespace, "llm", [(0, b, [2, 3])]),
        "beef002",
        "maps/llm.yaml",
    )
    cond = wait_for_drifted(cluster, namespace, "web-0")
    assert cond["reason"] == "SlotMoved"
    message = cond["message"]
    assert f"node {a} GPUs {gpu_uuid(a, 0)},{gpu_uuid(a, 1)}" in message  # old placement
    assert f"node {b} GPUs {gpu_uuid(b, 2)},{gpu_uuid(b, 3)}" in message  # new placement
    assert "c0ffee1" in message and "beef002" in message  # placed by, drifted since
    status = wait_for(
        "map counts 1 drifted",
        lambda: (s := map_status(cluster, namespace, "llm")) and s["slots"]["drifted"] == 1 and s,
    )
    assert status["slots"]["bound"] == 1
    assert status["revision"] == "beef002"
    assert status["rollout"].startswith("manual")
    events = cluster.kubectl(
        "-n",
        namespace,
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web-0",
        "-o",
        "json",
    )
    assert any(e["reason"] == "Drifted" for e in json.loads(events.stdout)["items"])
    # Pods of earlier tests in the shared cluster may count too: at least this one.
    drifted = re.search(r"^gpuplace_drifted_pods (\S+)$", metrics_of(controller), re.MULTILINE)
    assert drifted is not None and float(drifted.group(1)) >= 1
    # Manual: nothing moves. The pod is the same pod, on the old node, not terminating.
    pod = get_pod(cluster, namespace, "web-0")
    assert pod is not None and pod["metadata"]["uid"] == uid and running(pod)
    assert pod["spec"]["nodeName"] == a

    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    explained = inspect.explain(kube, namespace, "web-0")
    assert "revision c0ffee1 (clusters/dev/maps/llm.yaml)" in explained
    assert "Drifted" in explained and "beef002" in explained
    rows = {
        r.name: r for r in inspect.gpuplace_pods(kube, ["gpuplace"]) if r.namespace == namespace
    }
    assert rows["web-0"].reason.startswith("Drifted")
    table = inspect.map_table([(f"{namespace}/llm", MapStatus.from_json(json.dumps(status)))])
    assert table.splitlines()[0].split()[:6] == [
        "MAP",
        "PHASE",
        "SLOTS",
        "BOUND",
        "DRIFTED",
        "BLOCKED",
    ]
    assert table.splitlines()[1].split()[:6] == [f"{namespace}/llm", "Valid", "1", "1", "1", "0"]

    # Back where the pod runs: no longer drifted.
    apply_at(
        cluster,
        namespace,
        "llm",
        map_yaml(namespace, "llm", [(0, a, [0, 1])]),
        "c0ffee3",
        "maps/llm.yaml",
    )
    wait_for_drifted(cluster, namespace, "web-0", "False")
    wait_for(
        "map counts 0 drifted",
        lambda: (s := map_status(cluster, namespace, "llm")) and s["slots"]["drifted"] == 0,
    )


def test_deleted_map_leaves_its_pods_drifted(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    (a,) = gpu_nodes(cluster, unique("del"), 1)
    apply_at(cluster, namespace, "gone", map_yaml(namespace, "gone", [(0, a, [0])]), "1111111")
    create_workload(cluster, statefulset(namespace, "g", "gone", 1))
    wait_for("g-0 bound", lambda: "g-0" in bound_pods(cluster, namespace))
    status, _ = cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/gone")
    assert status == 200
    cond = wait_for_drifted(cluster, namespace, "g-0")
    assert cond["reason"] == "MapDeleted"


def test_evict_rollout_moves_a_statefulset_one_pod_at_a_time(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    a, b = gpu_nodes(cluster, unique("ev"), 2, gpus=8)
    rollout = "  rollout:\n    strategy: evict\n    maxUnavailable: 1\n"

    def evict_map(node: str, first: int) -> str:
        text = map_yaml(namespace, "train", [(i, node, [first + i]) for i in range(4)])
        return text.replace("spec:\n", "spec:\n" + rollout, 1)

    apply_at(cluster, namespace, "train", evict_map(a, 0), "aaaa001")
    create_workload(cluster, statefulset(namespace, "t", "train", 4))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "t", "namespace": namespace},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "t"}}},
    }
    create(cluster, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb)
    names = [f"t-{i}" for i in range(4)]
    wait_for(
        "4 pods Running on the first node",
        lambda: all((p := get_pod(cluster, namespace, n)) and running(p) for n in names),
        timeout=90,
    )
    wait_for(
        "the PDB counts 4 healthy pods",
        lambda: (
            cluster.request(
                "GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/t"
            )[1]
            .get("status", {})
            .get("currentHealthy")
            == 4
        ),
    )

    # Watch every pod change from now on: the most pods of the StatefulSet down at once.
    worst = {"down": 0}
    stop = threading.Event()
    status, listed = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    assert status == 200
    pods: dict[str, dict[str, Any]] = {p["metadata"]["name"]: p for p in listed["items"]}
    resource_version = listed["metadata"]["resourceVersion"]

    def watch() -> None:
        kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
        query = {"resourceVersion": resource_version, "timeoutSeconds": 300}
        events = kube.stream(f"/api/v1/namespaces/{namespace}/pods", query, timeout=330)
        with contextlib.suppress(APIError):  # the stream closes under it at teardown
            follow(events)

    def follow(events: Iterator[dict[str, Any]]) -> None:
        for event in events:
            obj = event["object"]
            if event["type"] == "DELETED":
                pods.pop(obj["metadata"]["name"], None)
            else:
                pods[obj["metadata"]["name"]] = obj
            up = sum(1 for n in names if n in pods and running(pods[n]))
            worst["down"] = max(worst["down"], 4 - up)
            if stop.is_set():
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    apply_at(cluster, namespace, "train", evict_map(b, 4), "bbbb002")

    def all_moved() -> bool:
        for i, n in enumerate(names):
            p = get_pod(cluster, namespace, n)
            if p is None or not running(p) or p["spec"]["nodeName"] != b:
                return False
            if p["metadata"]["annotations"][DEVICES_ANNOTATION] != gpu_uuid(b, 4 + i):
                return False
        return True

    try:
        wait_for("all 4 pods Running on their new slots", all_moved, timeout=180)
    finally:
        stop.set()
        print(controller.log()[-20000:])
    assert worst["down"] == 1, f"at most {worst['down']} pods were down at once; expected exactly 1"
    wait_for(
        "no pod drifted any more",
        lambda: (
            (s := map_status(cluster, namespace, "train"))
            and s["slots"]["drifted"] == 0
            and s["slots"]["bound"] == 4
        ),
    )
    for n in names:
        pod = get_pod(cluster, namespace, n)
        assert pod is not None and pod["metadata"]["annotations"][REVISION_ANNOTATION] == "bbbb002"


def test_allocation_takes_the_next_servable_slot_when_the_lowest_node_is_cordoned(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    a, b = gpu_nodes(cluster, unique("cord"), 2)
    entries = [(0, a, [0]), (1, b, [0]), (2, b, [1])]
    # Cordoned before the map is applied, not after: the node's update then reaches the
    # controller's informer a whole map compile ahead of the pod (cordoning after it raced the
    # pod's creation on a loaded machine, and the pod could be bound to the cordoned node).
    cluster.kubectl("cordon", a)
    apply_at(
        cluster,
        namespace,
        "pool",
        map_yaml(namespace, "pool", entries, indexing="allocate"),
        "ccc0001",
    )
    wait_for_map(cluster, namespace, "pool", "Valid", what="map Valid")
    create_workload(cluster, deployment(namespace, "d", "pool", 1))
    pods = wait_for(
        "one replica bound", lambda: (p := bound_pods(cluster, namespace)) and p, timeout=20
    )
    (pod,) = pods.values()
    assert pod["spec"]["nodeName"] == b
    assert pod["metadata"]["annotations"][INDEX_ANNOTATION] == "1"
    cluster.kubectl("uncordon", a)


def test_restart_with_an_invalid_source_keeps_serving_the_last_valid_version(
    cluster: LocalCluster, namespace: str
) -> None:
    (a,) = gpu_nodes(cluster, unique("lkg"), 1)
    good = map_yaml(namespace, "svc", [(0, a, [0]), (1, a, [1])])
    apply_at(cluster, namespace, "svc", good, "9000001")
    first = ControllerProcess(cluster, unique("c1"), lease="gpuplace-lkg")
    try:
        create_workload(cluster, statefulset(namespace, "s", "svc", 1))
        wait_for("s-0 bound", lambda: "s-0" in bound_pods(cluster, namespace))
    finally:
        first.stop()
    broken = good.replace("devices: [1]", "devices: [1, 1]")
    apply_at(cluster, namespace, "svc", broken, "9000002")
    second = ControllerProcess(cluster, unique("c2"), lease="gpuplace-lkg")
    try:
        status = wait_for_map(
            cluster, namespace, "svc", "Invalid", "still serving", what="Invalid, still serving"
        )
        assert "restored from the stored model" in status["message"]
        assert status["servingVersion"]
        cluster.kubectl("-n", namespace, "scale", "statefulset/s", "--replicas=2")
        pods = wait_for(
            "s-1 bound", lambda: (p := bound_pods(cluster, namespace)) and "s-1" in p and p
        )
        assert pods["s-1"]["metadata"]["annotations"][DEVICES_ANNOTATION] == gpu_uuid(a, 1)
        assert pods["s-1"]["metadata"]["annotations"][REVISION_ANNOTATION] == "9000001"
        assert healthz(second) == 200
        metrics = metrics_of(second)
        assert 'gpuplace_slots{state="total"}' in metrics
        assert 'gpuplace_slots{state="total"} 0.0' not in metrics
    finally:
        second.stop()
        print(second.log()[-6000:])


def test_deleting_a_node_removes_its_inventory_and_lease(
    cluster: LocalCluster, controller: ControllerProcess
) -> None:
    (node,) = gpu_nodes(cluster, unique("rm"), 1)
    cm = f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{node}"
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{INVENTORY_NAMESPACE}/leases/{node}"
    assert cluster.request("GET", cm)[0] == 200
    wait_for("controller leading", lambda: "leading:" in controller.log())
    status, _ = cluster.request("DELETE", f"/api/v1/nodes/{node}")
    assert status == 200
    wait_for("inventory gone", lambda: cluster.request("GET", cm)[0] == 404)
    wait_for("lease gone", lambda: cluster.request("GET", lease)[0] == 404)
    assert not [p for p in list_pods(cluster, "default") if p["spec"].get("nodeName") == node]


def test_diff_names_the_running_pods_a_change_makes_drift(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess, tmp_path: Path
) -> None:
    a, b = gpu_nodes(cluster, unique("df"), 2)
    before = map_yaml(namespace, "m", [(0, a, [0]), (1, a, [1])])
    apply_at(cluster, namespace, "m", before, "d000001")
    create_workload(cluster, statefulset(namespace, "x", "m", 2))
    wait_for("2 bound", lambda: len(bound_pods(cluster, namespace)) == 2)
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    path = tmp_path / "repo" / "maps" / "m.yaml"
    path.parent.mkdir()
    path.write_text(before)
    repo.index.add([str(path)])
    repo.index.commit("before")
    path.write_text(map_yaml(namespace, "m", [(0, a, [0]), (1, b, [1])]))
    repo.index.add([str(path)])
    repo.index.commit("after")
    repo.close()
    argv = [sys.executable, "-m", "gpuplace", "diff", "HEAD~1", "HEAD"]
    argv += ["--repo", str(tmp_path / "repo"), "--kubeconfig", str(cluster.kubeconfig)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert "Running pods this change makes drift: 1" in out
    assert f"{namespace}/x-1 (SlotMoved): ~ index 1 moved: {a} devices 1 -> {b} devices 1" in out
    assert f"{namespace}/x-0" not in out


def test_a_restamped_unchanged_map_keeps_the_revision_its_text_came_from(
    cluster: LocalCluster, namespace: str
) -> None:
    (a,) = gpu_nodes(cluster, unique("rev"), 1)
    text = map_yaml(namespace, "keep", [(0, a, [0]), (1, a, [1])])
    apply_at(cluster, namespace, "keep", text, "1000001", "maps/keep.yaml")
    first = ControllerProcess(cluster, unique("c1"), lease="gpuplace-rev")
    try:
        create_workload(cluster, statefulset(namespace, "k", "keep", 1))
        wait_for("k-0 bound", lambda: "k-0" in bound_pods(cluster, namespace))
        # A later commit that leaves this map alone: ArgoCD stamps the new revision anyway.
        apply_at(cluster, namespace, "keep", text, "1000002", "maps/keep.yaml")
        time.sleep(1)
    finally:
        first.stop()
    second = ControllerProcess(cluster, unique("c2"), lease="gpuplace-rev")
    try:
        cluster.kubectl("-n", namespace, "scale", "statefulset/k", "--replicas=2")
        pods = wait_for(
            "k-1 bound", lambda: (p := bound_pods(cluster, namespace)) and "k-1" in p and p
        )
        assert pods["k-1"]["metadata"]["annotations"][REVISION_ANNOTATION] == "1000001"
        status = wait_for("status", lambda: map_status(cluster, namespace, "keep"))
        assert status["revision"] == "1000001"
    finally:
        second.stop()
