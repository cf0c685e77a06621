"""The controller and binder against the real apiserver and kwok nodes (issue: controller/binder)."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_ANNOTATION,
    NODE_ANNOTATION,
)
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create,
    create_workload,
    deployment,
    describe_pending,
    fresh_namespace,
    get_pod,
    gpu_nodes,
    gpu_uuid,
    inventory_for,
    leader_killed_during_burst,
    list_pods,
    map_status,
    map_yaml,
    now,
    pending_reason,
    publish_inventory,
    refused_binds,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
    wait_for_map,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


def model_generation(cluster: LocalCluster) -> int:
    status, body = cluster.request(
        "GET", "/api/v1/namespaces/gpuplace-system/configmaps/gpuplace-model"
    )
    assert status == 200, body
    return int(json.loads(body["data"]["manifest.json"])["generation"])


def assert_no_feedback(cluster: LocalCluster, windows: int = 3, seconds: float = 3.0) -> None:
    """The model's generation holds still for one of `windows` windows of `seconds`: a status
    patch that fed back into the model would bump it in every window. A bump from outside is
    allowed: the cluster is shared with earlier tests whose namespaces may still be going away
    (their maps leave the model when they do)."""
    generations = [model_generation(cluster)]
    for _ in range(windows):
        time.sleep(seconds)
        generations.append(model_generation(cluster))
        if generations[-1] == generations[-2]:
            return
    raise AssertionError(
        f"the model's generation moved in every {seconds:.0f}-s window: {generations}"
    )


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "ctl") as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster) as proc:
        yield proc


def test_statefulset_pods_bound_exactly_as_declared(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    nodes = gpu_nodes(cluster, unique("sts"), 2)
    entries = [
        (0, nodes[0], [0, 1]),
        (1, nodes[0], [2]),
        (2, nodes[1], [3]),
        (3, nodes[1], [0, 1, 2]),
    ]
    apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
    create_workload(cluster, statefulset(namespace, "web", "llm", 4))
    pods = wait_for_bound(cluster, namespace, 4, "4 bound pods")
    for index, node, devices in entries:
        pod = pods[f"web-{index}"]
        ann = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == node
        assert ann[NODE_ANNOTATION] == node
        assert ann[INDEX_ANNOTATION] == str(index)
        assert ann[DEVICES_ANNOTATION] == ",".join(gpu_uuid(node, d) for d in devices)
        assert ann[CUDA_ANNOTATION] == ",".join(map(str, devices))
    wait_for(
        "pods Running under kwok",
        lambda: all(p["status"].get("phase") == "Running" for p in list_pods(cluster, namespace)),
        timeout=60,
    )
    status = wait_for(
        "status with 4 bound",
        lambda: (s := map_status(cluster, namespace, "llm")) and s["slots"]["bound"] == 4 and s,
    )
    assert status["phase"] == "Valid"
    # Quiet maps, quiet controller: status patches must not feed back into new model generations.
    assert_no_feedback(cluster)


def test_deployment_allocates_lowest_free_slots(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    nodes = gpu_nodes(cluster, unique("dep"), 1)
    entries = [(i, nodes[0], [i]) for i in range(3)]
    apply_map(
        cluster, namespace, "batch", map_yaml(namespace, "batch", entries, indexing="allocate")
    )
    create_workload(cluster, deployment(namespace, "work", "batch", 2))
    pods = wait_for_bound(cluster, namespace, 2)
    assert sorted(p["metadata"]["annotations"][INDEX_ANNOTATION] for p in pods.values()) == [
        "0",
        "1",
    ]
    cluster.kubectl("-n", namespace, "scale", "deployment/work", "--replicas=4")
    wait_for("3 bound", lambda: len(bound_pods(cluster, namespace)) == 3)

    def extra_pending() -> bool:
        pending = [
            p["metadata"]["name"]
            for p in list_pods(cluster, namespace)
            if not p["spec"].get("nodeName")
        ]
        return len(pending) == 1 and pending_reason(cluster, namespace, pending[0]) == "NoFreeSlot"

    wait_for("the 4th pod Pending with NoFreeSlot", extra_pending)
    cluster.kubectl("-n", namespace, "scale", "deployment/work", "--replicas=1")
    wait_for("one pod left", lambda: len(list_pods(cluster, namespace)) == 1, timeout=90)
    cluster.kubectl("-n", namespace, "scale", "deployment/work", "--replicas=3")
    pods = wait_for_bound(cluster, namespace, 3, "3 bound again")
    assert sorted(p["metadata"]["annotations"][INDEX_ANNOTATION] for p in pods.values()) == [
        "0",
        "1",
        "2",
    ]


def test_invalid_update_keeps_serving_last_valid_version(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    nodes = gpu_nodes(cluster, unique("inv"), 1)
    good = map_yaml(namespace, "svc", [(0, nodes[0], [0]), (1, nodes[0], [1])])
    apply_map(cluster, namespace, "svc", good)
    create_workload(cluster, statefulset(namespace, "svc", "svc", 1))
    wait_for("svc-0 bound", lambda: "svc-0" in bound_pods(cluster, namespace))
    broken = good.replace("devices: [1]", "devices: [1, 1]")
    apply_map(cluster, namespace, "svc", broken)
    status = wait_for_map(cluster, namespace, "svc", "Invalid", what="Invalid status")
    error = status["errors"][0]
    line = broken.splitlines().index("      devices: [1, 1]") + 1
    column = "      devices: [1, 1]".index("1]") + 1  # the second 1
    assert (error["line"], error["column"]) == (line, column)
    assert "listed twice" in error["message"]
    assert "still serving" in status["message"]
    # The last valid version still serves: a new replica takes index 1 as declared before.
    cluster.kubectl("-n", namespace, "scale", "statefulset/svc", "--replicas=2")
    pods = wait_for(
        "svc-1 bound", lambda: (p := bound_pods(cluster, namespace)) and "svc-1" in p and p
    )
    assert pods["svc-1"]["metadata"]["annotations"][CUDA_ANNOTATION] == "1"
    assert pods["svc-0"]["spec"]["nodeName"] == nodes[0]
    apply_map(cluster, namespace, "svc", good)
    wait_for_map(cluster, namespace, "svc", "Valid", what="Valid again")


def test_conflicting_maps_name_each_other_and_never_share_a_gpu(
    cluster: LocalCluster, controller: ControllerProcess
) -> None:
    ns_a, ns_b = unique("ca"), unique("cb")
    for ns in (ns_a, ns_b):
        cluster.create_namespace(ns)
    nodes = gpu_nodes(cluster, unique("cfl"), 1)
    apply_map(cluster, ns_a, "a", map_yaml(ns_a, "a", [(0, nodes[0], [0])]))
    wait_for_map(cluster, ns_a, "a", "Valid", what="a Valid")
    apply_map(cluster, ns_b, "b", map_yaml(ns_b, "b", [(0, nodes[0], [0])]))
    sa = wait_for_map(cluster, ns_a, "a", "Conflict", what="a Conflict")
    sb = wait_for_map(cluster, ns_b, "b", "Conflict", what="b Conflict")
    assert f"{ns_b}/b[0]" in sa["message"]
    assert f"{ns_a}/a[0]" in sb["message"]
    for ns, map_name in ((ns_a, "a"), (ns_b, "b")):
        create_workload(cluster, statefulset(ns, "w", map_name, 1))
    wait_for("a's pod bound (incumbent)", lambda: "w-0" in bound_pods(cluster, ns_a))
    wait_for(
        "b's pod Pending with SlotConflict",
        lambda: pending_reason(cluster, ns_b, "w-0") == "SlotConflict",
    )
    holders = [
        p
        for ns in (ns_a, ns_b)
        for p in bound_pods(cluster, ns).values()
        if p["metadata"]["annotations"][DEVICES_ANNOTATION] == gpu_uuid(nodes[0], 0)
    ]
    assert len(holders) == 1
    for ns in (ns_a, ns_b):
        cluster.delete_namespace(ns)


def test_node_and_device_problems_wait_then_bind(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    prefix = unique("nd")
    ready_nodes = gpu_nodes(cluster, prefix, 2)
    late = f"{prefix}-late"
    # A node no kwok manages has no Ready condition until something reports one.
    status, _ = cluster.request(
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": late}, "spec": {}},
    )
    assert status == 201
    publish_inventory(cluster, inventory_for(late, 4))
    entries = [(0, late, [0]), (1, ready_nodes[0], [7]), (2, ready_nodes[1], [0])]
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", entries))
    cluster.kubectl("cordon", ready_nodes[1])
    create_workload(cluster, statefulset(namespace, "p", "m", 3))
    wait_for(
        "p-0 NodeNotReady", lambda: pending_reason(cluster, namespace, "p-0") == "NodeNotReady"
    )
    wait_for(
        "p-1 DeviceMissing", lambda: pending_reason(cluster, namespace, "p-1") == "DeviceMissing"
    )
    wait_for(
        "p-2 NodeCordoned", lambda: pending_reason(cluster, namespace, "p-2") == "NodeCordoned"
    )
    degraded = wait_for_map(cluster, namespace, "m", "Degraded", "device 7 not found")
    assert ready_nodes[0] in degraded["message"]
    # Act as the node's kubelet would: report Ready.
    ready = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "test",
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": now(),
                }
            ]
        }
    }
    status, body = cluster.request("PATCH", f"/api/v1/nodes/{late}/status", ready)
    assert status == 200, body
    cluster.kubectl("uncordon", ready_nodes[1])
    publish_inventory(cluster, inventory_for(ready_nodes[0], 8))
    pods = wait_for(
        lambda: f"all 3 bound ({describe_pending(cluster, namespace)})",
        lambda: (p := bound_pods(cluster, namespace)) and len(p) == 3 and p,
        timeout=30,
    )
    assert pods["p-0"]["spec"]["nodeName"] == late
    assert pods["p-1"]["metadata"]["annotations"][CUDA_ANNOTATION] == "7"


def test_restart_rebuilds_the_slot_cache_without_rebinding(
    cluster: LocalCluster, namespace: str
) -> None:
    nodes = gpu_nodes(cluster, unique("rs"), 1)
    apply_map(
        cluster,
        namespace,
        "r",
        map_yaml(namespace, "r", [(i, nodes[0], [i]) for i in range(3)], indexing="allocate"),
    )
    first = ControllerProcess(cluster, unique("c1"), lease="gpuplace-restart")
    try:
        create_workload(cluster, deployment(namespace, "d", "r", 2))
        before = wait_for_bound(cluster, namespace, 2)
    finally:
        first.stop()
    second = ControllerProcess(cluster, unique("c2"), lease="gpuplace-restart")
    try:
        cluster.kubectl("-n", namespace, "scale", "deployment/d", "--replicas=3")
        after = wait_for_bound(cluster, namespace, 3)
    finally:
        second.stop()
    for name, pod in before.items():
        assert after[name]["metadata"]["annotations"] == pod["metadata"]["annotations"]
        assert after[name]["spec"]["nodeName"] == pod["spec"]["nodeName"]
    assert refused_binds(second, after) == []
    indices = sorted(p["metadata"]["annotations"][INDEX_ANNOTATION] for p in after.values())
    assert indices == ["0", "1", "2"]


@pytest.mark.slow
def test_leader_failover_while_pods_are_created(cluster: LocalCluster, namespace: str) -> None:
    nodes = gpu_nodes(cluster, unique("fo"), 25, gpus=8)
    with leader_killed_during_burst(
        cluster,
        namespace,
        nodes,
        lease=unique("gpuplace-failover"),
        first_timeout=120,
        all_timeout=240,
        interval=1.0,
    ) as pods:
        seen_slots: set[str] = set()
        seen_gpus: set[tuple[str, str]] = set()
        for name, pod in pods.items():
            ann = pod["metadata"]["annotations"]
            index = int(name.rsplit("-", 1)[1])
            assert ann[INDEX_ANNOTATION] == str(index)
            assert pod["spec"]["nodeName"] == nodes[index // 8]
            assert ann[INDEX_ANNOTATION] not in seen_slots
            seen_slots.add(ann[INDEX_ANNOTATION])
            for gpu in ann[DEVICES_ANNOTATION].split(","):
                assert (pod["spec"]["nodeName"], gpu) not in seen_gpus
                seen_gpus.add((pod["spec"]["nodeName"], gpu))


def test_seed_scenario_legacy_annotation(cluster: LocalCluster, namespace: str) -> None:
    prefix = unique("seed")
    for i in (1, 2, 3):
        cluster.create_nodes(
            [FakeNode(f"{prefix}-{i}", gpus=4, labels={"gpu-node-name": f"node{i}"})]
        )
        publish_inventory(cluster, inventory_for(f"{prefix}-{i}", 4))
    proc = ControllerProcess(cluster, unique("seed"), "--legacy-scheduler-name=gpu-scheduler")
    text = textwrap.dedent("""\
        0=node1:0,1
        1=node2:2
        2=node3:0,1,2
    """)
    try:
        for i in range(3):
            create(
                cluster,
                f"/api/v1/namespaces/{namespace}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"webhook-test-{i}",
                        "annotations": {"gpu-scheduling-map": text},
                    },
                    "spec": {
                        "schedulerName": "gpu-scheduler",
                        "containers": [{"name": "main", "image": "busybox"}],
                    },
                },
            )
        pods = wait_for_bound(cluster, namespace, 3, "3 legacy pods bound")
    finally:
        proc.stop()
        # Logical names node1..3 must not stay taken: a later test's nodes use them too.
        for i in (1, 2, 3):
            cluster.request("DELETE", f"/api/v1/nodes/{prefix}-{i}")
    expected = {0: (1, "0,1"), 1: (2, "2"), 2: (3, "0,1,2")}
    for i, (node, devices) in expected.items():
        pod = pods[f"webhook-test-{i}"]
        assert pod["spec"]["nodeName"] == f"{prefix}-{node}"
        assert pod["metadata"]["annotations"][CUDA_ANNOTATION] == devices
        uuids = [gpu_uuid(f"{prefix}-{node}", int(d)) for d in devices.split(",")]
        assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == ",".join(uuids)
    assert get_pod(cluster, namespace, "webhook-test-0") is not None
