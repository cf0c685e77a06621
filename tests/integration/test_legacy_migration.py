"""The earlier tools' users, moving over: their own examples, placed as their text says whatever the
order in which the pods are created, and every message they meet on the way.

Everything runs as in a cluster: `gpuplace controller` as a process (binder included, legacy mode
on), the webhook over HTTPS registered with the apiserver for this module's namespaces, kwok nodes
named as the texts name them, inventories as agents publish them. What a user sees is read the way
they would read it: `kubectl create` warnings, `kubectl describe`, `gpuplace status` and `explain`.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import CUDA_ANNOTATION, DEVICES_ANNOTATION, LEGACY_ANNOTATION, MAP_LABEL
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    create_system_namespaces,
    describe_pending,
    fresh_namespace,
    get_pod,
    gpu_uuid,
    inventory_for,
    list_pods,
    map_status,
    pending_reason,
    pod_body,
    publish_inventory,
    wait_for,
)
from tests.integration.test_webhook import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import (
    MUTATING_PATH,
    VALIDATING_PATH,
    Endpoint,
    mutating_configuration,
    validating_configuration,
)
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCOPE_LABEL = "gpuplace.io/legacy-it"
CONFIGURATION = "gpuplace-legacy-it"
STS = "gpu-scheduler-check"
#: The nodes of the earlier tools' AKS example, named as their text names them.
AKS_NODES = [f"aks-workerpool-25338008-vmss00000{i}" for i in (0, 1, 3, 4)]
#: Their published mapping: lines 3 and 4 give GPU 3 of the fourth node to two pods on purpose.
AKS_TEXT = textwrap.dedent(f"""\
    0={AKS_NODES[0]}:0,1
    1={AKS_NODES[1]}:2
    2={AKS_NODES[2]}:0,1,2
    3={AKS_NODES[3]}:3
    4={AKS_NODES[3]}:3
""")
AKS_EXPECTED = {
    0: (AKS_NODES[0], "0,1"),
    1: (AKS_NODES[1], "2"),
    2: (AKS_NODES[2], "0,1,2"),
    3: (AKS_NODES[3], "3"),
    4: (AKS_NODES[3], "3"),
}
SHARING_WARNING = (
    f"Warning: annotation gpu-scheduling-map: GPU 3 on node {AKS_NODES[3]} is listed by lines 4 "
    "and 5 (indices 3 and 4): their pods share it, as the earlier tools did; every other map and "
    "pod is kept off it"
)
#: The migration example of docs/migrating.md: nodes labelled gpu-node-name=node1..3.
MIGRATION_MAP = REPO / "examples/gitops/clusters/dev/maps/webhook-test.yaml"
MIGRATION_EXPECTED = {0: (1, "0,1"), 1: (2, "2"), 2: (3, "0,1,2")}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def gpuplace(cluster: LocalCluster, *args: str) -> str:
    """The CLI as a user runs it; returns stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "gpuplace", *args, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@dataclass
class Placement:
    controller: ControllerProcess
    #: The nodes labelled gpu-node-name=node1..3, by logical number.
    migration_nodes: dict[int, str]


@pytest.fixture(scope="module")
def placement(cluster: LocalCluster) -> Iterator[Placement]:
    """Nodes, inventories, the controller and the webhook of this module."""
    create_system_namespaces(cluster)
    prefix = unique("mig")
    migration_nodes = [
        FakeNode(f"{prefix}-node-{i}", gpus=4, labels={"gpu-node-name": f"node{i}"})
        for i in (1, 2, 3)
    ]
    nodes = [FakeNode(n, gpus=4) for n in AKS_NODES] + migration_nodes
    cluster.create_nodes(nodes)
    for node in nodes:
        publish_inventory(cluster, inventory_for(node.name, 4))
    controller = ControllerProcess(
        cluster, unique("legacy"), "--legacy-scheduler-name=gpu-scheduler"
    )
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, "gpuplace-system").start()
    webhook = RunningWebhook(
        cluster, generate_ca("legacy-it-ca", timedelta(days=2)), models, port=free_port()
    )
    webhook.start()
    endpoint = Endpoint(ca_bundle=webhook.ca.cert_pem, url=f"https://127.0.0.1:{webhook.port}")
    selector = {"matchLabels": {SCOPE_LABEL: "true"}}
    apply_configuration(
        kube,
        mutating_configuration(
            CONFIGURATION,
            endpoint,
            legacy_scheduler_names=["gpu-scheduler"],
            namespace_selector=selector,
        ),
    )
    apply_configuration(
        kube, validating_configuration(CONFIGURATION, endpoint, namespace_selector=selector)
    )
    try:
        yield Placement(controller, {i + 1: n.name for i, n in enumerate(migration_nodes)})
    finally:
        for collection in (MUTATING_PATH, VALIDATING_PATH):
            cluster.request("DELETE", f"{collection}/{CONFIGURATION}")
        webhook.stop()
        models.stop()
        controller.stop()
        print(controller.log()[-4000:])
        # Logical names node1..3 must not stay taken for later tests.
        for node in nodes:
            cluster.request("DELETE", f"/api/v1/nodes/{node.name}")
            cluster.request(
                "DELETE", f"/api/v1/namespaces/gpuplace-inventory/configmaps/{node.name}"
            )


@pytest.fixture
def ns(cluster: LocalCluster, placement: Placement) -> Iterator[str]:
    with fresh_namespace(cluster, "legacy-it", labels={SCOPE_LABEL: "true"}) as name:
        yield name
    assert placement.controller.alive(), placement.controller.log()[-4000:]


def wait_webhook(cluster: LocalCluster, namespace: str) -> None:
    """The apiserver picks up configurations asynchronously: probe with a dry-run legacy pod."""

    def mutated() -> bool:
        probe = legacy_pod(namespace, "probe-0", "0=n:0\n")
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe
        )
        env = body["spec"]["containers"][0].get("env") if status == 201 else None
        return bool(env)

    wait_for("the apiserver to call the webhook", mutated)


def legacy_pod(namespace: str, name: str, text: str) -> dict[str, Any]:
    spec = {
        "schedulerName": "gpu-scheduler",
        "containers": [{"name": "check", "image": "busybox:1.35"}],
    }
    return pod_body(namespace, name, spec, annotations={LEGACY_ANNOTATION: text})


def statefulset(namespace: str) -> dict[str, Any]:
    """Their check service: a Parallel StatefulSet of 5 carrying the map in its pod template."""
    template = legacy_pod(namespace, STS, AKS_TEXT)
    template["metadata"] = {
        "labels": {"app": STS},
        "annotations": {LEGACY_ANNOTATION: AKS_TEXT},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": STS, "namespace": namespace},
        "spec": {
            "replicas": 5,
            "serviceName": STS,
            "podManagementPolicy": "Parallel",
            # OnDelete: the controller never replaces the pods this test creates in its place.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": STS}},
            "template": template,
        },
    }


def hold_statefulset_controller(cluster: LocalCluster, namespace: str) -> None:
    """Refuses pod creation by the StatefulSet controller in `namespace`, so that this test creates
    the StatefulSet's pods itself, in the order it chooses, with the controller's ownership."""
    name = f"hold-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "request.userInfo.username != "
                    "'system:serviceaccount:kube-system:statefulset-controller'",
                    "message": "this test creates the StatefulSet's pods itself",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    base = "/apis/admissionregistration.k8s.io/v1"
    for collection, body in (
        ("validatingadmissionpolicies", policy),
        ("validatingadmissionpolicybindings", binding),
    ):
        status, resp = cluster.request("POST", f"{base}/{collection}", body)
        assert status == 201, resp

    def held() -> bool:
        # Policies apply asynchronously: probe as the StatefulSet controller would create.
        result = cluster.kubectl(
            "create",
            "--dry-run=server",
            "--as=system:serviceaccount:kube-system:statefulset-controller",
            "-f",
            "-",
            input=json.dumps(legacy_pod(namespace, "probe-0", "0=n:0\n")),
            check=False,
        )
        return result.returncode != 0 and "creates the StatefulSet's pods itself" in result.stderr

    wait_for("the admission policy to hold the StatefulSet controller", held)


def release_statefulset_controller(cluster: LocalCluster, namespace: str) -> None:
    base = "/apis/admissionregistration.k8s.io/v1"
    for collection in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        cluster.request("DELETE", f"{base}/{collection}/hold-{namespace}")


def sts_pod(namespace: str, owner: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """Pod <sts>-<n> as the StatefulSet controller makes it: its template, labels, ownership."""
    name = f"{STS}-{ordinal}"
    pod = legacy_pod(namespace, name, AKS_TEXT)
    pod["metadata"]["labels"] = {
        "app": STS,
        "statefulset.kubernetes.io/pod-name": name,
        "apps.kubernetes.io/pod-index": str(ordinal),
    }
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": STS,
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod["spec"]["hostname"] = name
    pod["spec"]["subdomain"] = STS
    return pod


def kubectl_create(cluster: LocalCluster, obj: dict[str, Any]) -> str:
    """Creates like a user does; returns what kubectl printed on stderr (the warnings)."""
    return cluster.kubectl("create", "-f", "-", input=json.dumps(obj)).stderr


def bound(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = get_pod(cluster, namespace, name)
    return pod if pod and pod["spec"].get("nodeName") else None


def wait_bound(cluster: LocalCluster, namespace: str, name: str, context: str) -> dict[str, Any]:
    return dict(
        wait_for(
            lambda: f"{context}: {name} bound; {describe_pending(cluster, namespace)}",
            lambda: bound(cluster, namespace, name),
        )
    )


def wait_running(cluster: LocalCluster, namespace: str, context: str) -> dict[str, Any]:
    """The StatefulSet's 5 pods, once all of them run."""
    names = [f"{STS}-{i}" for i in range(5)]

    def running() -> dict[str, Any]:
        pods = {p["metadata"]["name"]: p for p in list_pods(cluster, namespace)}
        ready = {
            n: pods[n] for n in names if n in pods and pods[n]["status"].get("phase") == "Running"
        }
        return ready if len(ready) == len(names) else {}

    return dict(wait_for(f"{context}: 5 pods Running", running))


def delete_pods(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    wait_for("the pods to be gone", lambda: not list_pods(cluster, namespace))


def assert_placed(pod: dict[str, Any], node: str, cvd: str) -> None:
    ann = pod["metadata"]["annotations"]
    assert (pod["spec"]["nodeName"], ann[CUDA_ANNOTATION]) == (node, cvd), pod["metadata"]["name"]
    uuids = ",".join(gpu_uuid(node, int(d)) for d in cvd.split(","))
    assert ann[DEVICES_ANNOTATION] == uuids


@pytest.mark.slow
def test_aks_example_statefulset_in_shuffled_order_runs_as_its_text_says(
    cluster: LocalCluster, ns: str
) -> None:
    wait_webhook(cluster, ns)
    hold_statefulset_controller(cluster, ns)
    try:
        status, owner = cluster.request(
            "POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", statefulset(ns)
        )
        assert status == 201, owner
        orders = []
        for run in range(10):
            order = random.Random(1900 + run).sample(range(5), 5)
            orders.append(order)
            for ordinal in order:
                name = f"{STS}-{ordinal}"
                warnings = kubectl_create(cluster, sts_pod(ns, owner, ordinal))
                # The pods that share GPU 3 are told so at admission; the others are not.
                assert (SHARING_WARNING in warnings) == (ordinal in (3, 4)), warnings
                # Each pod is placed before the next one exists: the order is the binder's too.
                wait_bound(cluster, ns, name, f"run {run} order {order}")
            pods = wait_running(cluster, ns, f"run {run}")
            for ordinal, (node, cvd) in AKS_EXPECTED.items():
                assert_placed(pods[f"{STS}-{ordinal}"], node, cvd)
            shared = {
                pods[f"{STS}-{i}"]["metadata"]["annotations"][DEVICES_ANNOTATION] for i in (3, 4)
            }
            assert shared == {gpu_uuid(AKS_NODES[3], 3)}
            if run < 9:
                delete_pods(cluster, ns)
    finally:
        release_statefulset_controller(cluster, ns)
    # The order really varied, and pod 4 came before pod 3 (the order that once left 3 Pending).
    assert len({tuple(o) for o in orders}) == 10
    assert any(o.index(4) < o.index(3) for o in orders)
    assert any(o.index(3) < o.index(4) for o in orders)

    # What a legacy pod's user reads: its line, the GPU it shares, no model generation.
    explained = gpuplace(cluster, "explain", f"{ns}/{STS}-4")
    assert f"bound to node {AKS_NODES[3]} by gpuplace" in explained
    assert "model generation:" not in explained
    assert (
        "legacy mode: placed by line 4 of the pod's own gpu-scheduling-map annotation (no "
        "placement map, so no model generation applies)"
    ) in explained
    assert f"GPU 3 on node {AKS_NODES[3]} is listed by lines 4 and 5 (indices 3 and 4)" in explained

    # Every other pod stays off the shared GPU, and is told which pod holds it.
    other = legacy_pod(ns, "intruder-0", f"0={AKS_NODES[3]}:3\n")
    kubectl_create(cluster, other)
    wait_for(
        "intruder-0 to wait", lambda: pending_reason(cluster, ns, "intruder-0") == "DeviceBusy"
    )
    described = cluster.kubectl("describe", "pod", "intruder-0", "-n", ns).stdout
    holder = [f"{ns}/{STS}-3", f"{ns}/{STS}-4"]
    busy = (
        f"legacy.intruder index 0: GPU {gpu_uuid(AKS_NODES[3], 3)} on node {AKS_NODES[3]} is "
        "still used by pod "
    )
    assert "DeviceBusy" in described
    assert any(f"{busy}{h} (uid " in " ".join(described.split()) for h in holder), described
    status = gpuplace(cluster, "status")
    line = next(ln for ln in status.splitlines() if "intruder-0" in ln)
    assert "Pending" in line and "DeviceBusy: " in line and "still used by pod" in line
    assert "REASON" in status.splitlines()[status.splitlines().index("Pods") + 1]

    # Another namespace's pod with the same name and text that shares line 3's GPU: only lines of
    # one workload share, so it waits too.
    elsewhere = unique("legacy-it")
    cluster.create_namespace(elsewhere, labels={SCOPE_LABEL: "true"})
    try:
        text = f"3={AKS_NODES[3]}:3\n5={AKS_NODES[3]}:3\n"
        kubectl_create(cluster, legacy_pod(elsewhere, f"{STS}-5", text))
        wait_for(
            "the other namespace's pod to wait",
            lambda: pending_reason(cluster, elsewhere, f"{STS}-5") == "DeviceBusy",
        )
    finally:
        cluster.delete_namespace(elsewhere)
    # The nodes are this module's: free their GPUs for the next test.
    cluster.kubectl("delete", "statefulset", STS, "-n", ns, "--cascade=orphan")
    delete_pods(cluster, ns)


def test_aks_example_as_the_statefulset_controller_creates_it(
    cluster: LocalCluster, ns: str
) -> None:
    wait_webhook(cluster, ns)
    status, body = cluster.request(
        "POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", statefulset(ns)
    )
    assert status == 201, body
    pods = wait_running(cluster, ns, "Parallel StatefulSet")
    for ordinal, (node, cvd) in AKS_EXPECTED.items():
        assert_placed(pods[f"{STS}-{ordinal}"], node, cvd)


def migration_pod(namespace: str, index: int) -> dict[str, Any]:
    """examples/workloads/legacy-webhook-test.yaml as docs/migrating.md says: the annotation
    replaced by the label gpuplace.io/map."""
    spec = {"containers": [{"name": "test", "image": "busybox:1.35"}]}
    return pod_body(namespace, f"webhook-test-{index}", spec, labels={MAP_LABEL: "webhook-test"})


@pytest.mark.slow
def test_migration_example_places_bare_pods_as_the_text_says_in_every_order(
    cluster: LocalCluster, ns: str, placement: Placement
) -> None:
    text = MIGRATION_MAP.read_text().replace("namespace: legacy", f"namespace: {ns}")
    apply_map(cluster, ns, "webhook-test", text)
    wait_for(
        "the map to be Valid",
        lambda: (map_status(cluster, ns, "webhook-test") or {}).get("phase") == "Valid",
    )
    wait_webhook(cluster, ns)
    nodes = placement.migration_nodes
    orders = list(itertools.permutations(range(3)))
    assert len(orders) == 6
    for order in orders:
        for index in order:
            kubectl_create(cluster, migration_pod(ns, index))
            wait_bound(cluster, ns, f"webhook-test-{index}", f"order {order}")
        for index, (node, cvd) in MIGRATION_EXPECTED.items():
            pod = bound(cluster, ns, f"webhook-test-{index}")
            assert pod is not None
            assert_placed(pod, nodes[node], cvd)
        # The map's status counts what the binder holds: all three bound, then one fewer.
        wait_for(
            "bound: 3",
            lambda: (
                (map_status(cluster, ns, "webhook-test") or {}).get("slots", {}).get("bound") == 3
            ),
        )
        cluster.kubectl("delete", "pod", "webhook-test-2", "-n", ns, "--grace-period=0", "--force")
        wait_for(
            "bound: 2 once webhook-test-2 is gone",
            lambda: (
                (map_status(cluster, ns, "webhook-test") or {}).get("slots", {}).get("bound") == 2
            ),
        )
        delete_pods(cluster, ns)
    maps = gpuplace(cluster, "status")
    assert any(
        ln.startswith(f"{ns}/webhook-test ") and " Valid " in ln for ln in maps.splitlines()
    ), maps


@pytest.mark.slow
def test_pending_pod_in_status_and_a_map_bound_count_that_follows_its_pod(
    cluster: LocalCluster, ns: str
) -> None:
    """A map's only pod bound, deleted, and its successor waiting: the status says bound: 0."""
    text = textwrap.dedent(f"""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementMap
        metadata:
          name: solo
          namespace: {ns}
        spec:
          placements:
            - {{index: 0, node: {AKS_NODES[0]}, devices: [2]}}
    """)
    apply_map(cluster, ns, "solo", text)
    wait_for("solo Valid", lambda: (map_status(cluster, ns, "solo") or {}).get("phase") == "Valid")
    wait_webhook(cluster, ns)
    pod = migration_pod(ns, 0)
    pod["metadata"]["name"] = "solo-0"
    pod["metadata"]["labels"] = {MAP_LABEL: "solo"}
    kubectl_create(cluster, pod)
    wait_for("solo-0 bound", lambda: bound(cluster, ns, "solo-0"))
    wait_for("bound: 1", lambda: (map_status(cluster, ns, "solo") or {})["slots"]["bound"] == 1)
    # A legacy line does not take the GPU the map declares while the map's pod is away ...
    delete_pods(cluster, ns)
    kubectl_create(cluster, legacy_pod(ns, "waiter-0", f"0={AKS_NODES[0]}:2\n"))
    wait_for("waiter-0 waits", lambda: pending_reason(cluster, ns, "waiter-0") == "DeviceBusy")
    delete_pods(cluster, ns)
    # ... but a pod the earlier tools bound there before the map declared it runs on it: the
    # map's next pod has to wait. (Created bound while the map declares the GPU, it is refused.)
    squatter = legacy_pod(ns, "squatter-0", f"0={AKS_NODES[0]}:2\n")
    squatter["spec"]["nodeName"] = AKS_NODES[0]
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(squatter), check=False)
    assert refused.returncode != 0 and "is declared by map" in refused.stderr, refused.stderr
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/solo")

    def created_before_the_map() -> bool:
        done = cluster.kubectl("create", "-f", "-", input=json.dumps(squatter), check=False)
        return done.returncode == 0

    wait_for("squatter-0 bound before the map declares GPU 2", created_before_the_map)
    apply_map(cluster, ns, "solo", text)
    wait_for("solo Valid", lambda: (map_status(cluster, ns, "solo") or {}).get("phase") == "Valid")
    kubectl_create(cluster, pod)
    wait_for("solo-0 waits", lambda: pending_reason(cluster, ns, "solo-0") == "DeviceBusy")
    wait_for("bound: 0", lambda: (map_status(cluster, ns, "solo") or {})["slots"]["bound"] == 0)
    explained = gpuplace(cluster, "explain", f"{ns}/solo-0")
    assert f"still used by pod {ns}/squatter-0 (uid " in explained
    status = gpuplace(cluster, "status")
    solo = next(ln for ln in status.splitlines() if ln.startswith(f"{ns}/solo "))
    assert solo.split()[1:5] == ["Valid", "1", "0", "0"], solo
