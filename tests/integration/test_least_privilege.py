"""Least privilege with real identities on the real apiserver: the chart's RBAC applied for real, the
chart's ValidatingAdmissionPolicies (LocalCluster installs the same objects under its own names),
and ServiceAccount tokens issued by the apiserver's TokenRequest API.

An agent's token is bound to a pod on its node, as the kubelet mounts it: the apiserver then adds
the node's name to the user's extra info, which the agent policy compares with the object's name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.bindingkey import KeySecret, load_or_create
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from gpuplace_dev.localcluster.policies import LOCAL_PREFIX
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError, APIForbiddenError
from kubeio.paths import (
    SECRETS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from placement.annotations import PLACEMENT_MAP_LABEL
from tests.chartkit import INVENTORY, NAMESPACE, SCENARIOS, render
from tests.integration.controllerkit import wait_for, write_kubeconfig

pytestmark = pytest.mark.integration

RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
#: What the apiserver puts into a pod-bound token's identity: the name of the pod's node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{INVENTORY}/leases"
CONFIGMAPS = f"/api/v1/namespaces/{INVENTORY}/configmaps"


@pytest.fixture(scope="module")
def chart(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[dict[str, Any]]]:
    """The default chart's objects; its RBAC applied for real (and removed after the module). Its
    policies are those LocalCluster installed (the first test checks that they are the same), so
    that `helm install` in later tests does not meet objects it does not own."""
    for namespace in (NAMESPACE, INVENTORY):
        cluster.create_namespace(namespace)
    objects = render(SCENARIOS[0], tmp_path_factory.mktemp("least"))
    applied = [o for o in objects if o["kind"] in RBAC_KINDS]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(applied))
    yield objects
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        input=yaml.safe_dump_all(applied),
    )


def as_token(cluster: LocalCluster, token: str, tmp: Path) -> Kube:
    path = write_kubeconfig(
        cluster, tmp / f"kubeconfig-{uuid.uuid4().hex[:6]}", "u", {"token": token}
    )
    return Kube.connect(ClientSettings(kubeconfig=str(path)))


def token_for(cluster: LocalCluster, account: str, pod: dict[str, Any] | None = None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    status, body = cluster.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    assert status == 201, body
    token: str = body["status"]["token"]
    return token


def agent_pod_on(cluster: LocalCluster, node: str) -> dict[str, Any]:
    """An agent pod bound to `node` (as the DaemonSet's would be)."""
    cluster.create_nodes([FakeNode(node, gpus=1)])
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"agent-{node}", "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": "gpuplace-agent",
            "nodeName": node,
            "containers": [{"name": "agent", "image": "gpuplace:test"}],
        },
    }
    status, pod = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    assert status == 201, pod
    return pod


def configmap(name: str, namespace: str = INVENTORY, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"inventory.json": "{}"},
    }


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": INVENTORY},
        "spec": {"holderIdentity": f"agent-{name}", "leaseDurationSeconds": 40},
    }


def refused(call: Any) -> str:
    with pytest.raises(APIForbiddenError) as caught:
        call()
    return str(caught.value)


def test_the_local_cluster_enforces_the_policies_the_chart_renders(
    cluster: LocalCluster, chart: list[dict[str, Any]]
) -> None:
    """What the apiserver holds under the local prefix is the chart's render, spec for spec."""
    ours = {"gpuplace-agent", "gpuplace-controller", "gpuplace-pod-bindings"}
    rendered = {
        (o["kind"], o["metadata"]["name"]): o["spec"]
        for o in chart
        if o["kind"] in POLICY_KINDS and o["metadata"]["name"] in ours
    }
    assert len(rendered) == 6
    paths = {
        "ValidatingAdmissionPolicy": VALIDATING_ADMISSION_POLICIES,
        "ValidatingAdmissionPolicyBinding": VALIDATING_ADMISSION_POLICY_BINDINGS,
    }
    for (kind, name), spec in rendered.items():
        status, body = cluster.request("GET", paths[kind].item(LOCAL_PREFIX + name))
        assert status == 200, (kind, name, body)
        installed = body["spec"]
        if kind == "ValidatingAdmissionPolicyBinding":
            assert installed.pop("policyName") == LOCAL_PREFIX + spec.pop("policyName")
        # The apiserver fills in defaults the chart leaves out; what the chart says is kept.
        assert_subset(spec, installed, f"{kind} {name}")


def assert_subset(want: Any, have: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(have, dict), where
        for key, value in want.items():
            assert key in have, f"{where}.{key}"
            assert_subset(value, have[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(have, list) and len(have) == len(want), where
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            assert_subset(w, h, f"{where}[{i}]")
    else:
        assert want == have, f"{where}: {want!r} != {have!r}"


def test_an_agent_writes_only_its_own_nodes_inventory_and_lease(
    cluster: LocalCluster, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    mine, other = f"lp-{uuid.uuid4().hex[:6]}", f"lp-{uuid.uuid4().hex[:6]}"
    pod = agent_pod_on(cluster, mine)
    agent = as_token(cluster, token_for(cluster, "gpuplace-agent", pod), tmp_path)
    # The apiserver put the pod's node into the token's identity.
    review = agent.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:gpuplace-agent"
    assert user["extra"][NODE_NAME_EXTRA] == [mine]

    agent.create(CONFIGMAPS, configmap(mine))
    agent.put(f"{CONFIGMAPS}/{mine}", agent.get(f"{CONFIGMAPS}/{mine}"))
    agent.create(LEASES, lease(mine))
    agent.patch(f"{LEASES}/{mine}", {"spec": {"leaseDurationSeconds": 41}})

    # Another node's objects, written by that node's agent (here: the admin).
    assert cluster.request("POST", CONFIGMAPS, configmap(other))[0] == 201
    assert cluster.request("POST", LEASES, lease(other))[0] == 201
    message = refused(lambda: agent.create(CONFIGMAPS, configmap(f"{other}-new")))
    assert f"this token is bound to node {mine}" in message
    refused(lambda: agent.patch(f"{CONFIGMAPS}/{other}", {"data": {"inventory.json": "[]"}}))
    refused(lambda: agent.put(f"{CONFIGMAPS}/{other}", agent.get(f"{CONFIGMAPS}/{other}")))
    message = refused(lambda: agent.patch(f"{LEASES}/{other}", {"spec": {"holderIdentity": "me"}}))
    assert f"not {other}" in message
    refused(lambda: agent.create(LEASES, lease(f"{other}-new")))
    assert cluster.request("GET", f"{LEASES}/{other}")[1]["spec"]["holderIdentity"] == (
        f"agent-{other}"
    )


def test_an_agent_token_without_a_node_writes_nothing(
    cluster: LocalCluster, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    agent = as_token(cluster, token_for(cluster, "gpuplace-agent"), tmp_path)
    name = f"lp-{uuid.uuid4().hex[:6]}"
    message = refused(lambda: agent.create(CONFIGMAPS, configmap(name)))
    assert "this token names no node" in message
    refused(lambda: agent.create(LEASES, lease(name)))


def test_the_controller_patches_only_placement_maps(
    cluster: LocalCluster, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    controller = as_token(cluster, token_for(cluster, "gpuplace-controller"), tmp_path)
    workloads = f"lp-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(workloads)
    base = f"/api/v1/namespaces/{workloads}/configmaps"
    labelled = configmap("llm", workloads, **{PLACEMENT_MAP_LABEL: "true"})
    labelled["data"] = {"other": "not a map: the webhook is not registered in this module"}
    assert cluster.request("POST", base, labelled)[0] == 201
    assert cluster.request("POST", base, configmap("app-config", workloads))[0] == 201
    status = {"metadata": {"annotations": {"gpuplace.io/status": "{}"}}}

    controller.patch(f"{base}/llm", status)
    message = refused(lambda: controller.patch(f"{base}/app-config", status))
    assert f"{workloads}/app-config is not one" in message
    refused(lambda: controller.put(f"{base}/app-config", controller.get(f"{base}/app-config")))
    unlabel = {"metadata": {"labels": {PLACEMENT_MAP_LABEL: None}}}
    refused(lambda: controller.patch(f"{base}/llm", unlabel))
    relabel = {"metadata": {"labels": {PLACEMENT_MAP_LABEL: "true"}}}
    refused(lambda: controller.patch(f"{base}/app-config", relabel))
    # kube-system's ConfigMaps (aws-auth on EKS) are no exception.
    assert (
        cluster.request(
            "POST",
            "/api/v1/namespaces/kube-system/configmaps",
            configmap(f"aws-auth-{workloads}", "kube-system"),
        )[0]
        == 201
    )
    refused(
        lambda: controller.patch(
            f"/api/v1/namespaces/kube-system/configmaps/aws-auth-{workloads}", status
        )
    )
    # In its own namespace the model is its to write.
    model = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    controller.create(model, configmap(f"gpuplace-model-lp-{workloads}", NAMESPACE))
    controller.patch(f"{model}/gpuplace-model-lp-{workloads}", status)
    with pytest.raises(APIError):
        controller.create(base, configmap("new", workloads))  # RBAC: no create outside
    cluster.delete_namespace(workloads)


def test_the_controller_reads_and_watches_its_binding_key_ring_by_name_only(
    cluster: LocalCluster, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    controller = as_token(cluster, token_for(cluster, "gpuplace-controller"), tmp_path)
    where = KeySecret(NAMESPACE, "gpuplace-binding-key")
    # The chart renders the Secret without data; a Secret already there is kept as it is.
    cluster.request("POST", SECRETS.collection(NAMESPACE), {"metadata": {"name": where.name}})
    view = load_or_create(controller, where)  # filled in (or read) with the controller's token
    assert view.ring.signer.id
    # Its informer lists and watches the one Secret, by name (fieldSelector metadata.name).
    listed = controller.get(
        SECRETS.collection(NAMESPACE), fieldSelector=f"metadata.name={where.name}"
    )
    assert [s["metadata"]["name"] for s in listed["items"]] == [where.name]
    refused(lambda: controller.get(SECRETS.collection(NAMESPACE)))
    refused(
        lambda: controller.get(
            SECRETS.collection(NAMESPACE), fieldSelector="metadata.name=gpuplace-webhook-ca"
        )
    )


def test_a_tenant_with_edit_writes_its_maps_not_their_status_nor_the_policy(
    cluster: LocalCluster, chart: list[dict[str, Any]]
) -> None:
    """The chart's aggregated roles: a ServiceAccount bound to the built-in `edit` role in its
    own namespace may write PlacementMaps there, and nothing the controller owns."""
    namespace = f"tenant-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    try:
        cluster.kubectl("-n", namespace, "create", "serviceaccount", "dev")
        cluster.kubectl(
            "-n",
            namespace,
            "create",
            "rolebinding",
            "dev-edit",
            "--clusterrole=edit",
            f"--serviceaccount={namespace}:dev",
        )
        who = f"--as=system:serviceaccount:{namespace}:dev"

        def can(*args: str) -> str:
            result = cluster.kubectl("auth", "can-i", *args, who, check=False)
            return result.stdout.strip()

        # Aggregation is asynchronous (the clusterrole-aggregation controller).
        wait_for(
            "the edit role to aggregate placementmaps",
            lambda: can("create", "placementmaps.gpuplace.io", "-n", namespace) == "yes",
        )
        assert can("delete", "placementmaps.gpuplace.io", "-n", namespace) == "yes"
        assert (
            can("patch", "placementmaps.gpuplace.io", "--subresource=status", "-n", namespace)
            == "no"
        )
        assert can("create", "placementmaps.gpuplace.io", "-n", "default") == "no"
        assert can("create", "placementpolicies.gpuplace.io") == "no"
        assert can("patch", "placementpolicies.gpuplace.io", "--subresource=status") == "no"
    finally:
        cluster.delete_namespace(namespace)
