"""One owner per GPU in `dra` enforcement, against the real apiserver, kube-controller-manager
and kube-scheduler, as an `edit` tenant: the chart's gpu-claims policy refuses a tenant's claim or
claim template of the managed DeviceClass (so kube-scheduler never allocates a managed GPU beside
gpuplace); a claim that someone allocated anyway (before the install, or as an administrator)
holds its device, whatever its labels say; a device found in two claims is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster import policies as local_policies
from placement.annotations import MAP_LABEL
from placement.dra import POD_CLAIM_ANNOTATION, device_name
from placement.grants import POLICY_CONFIGMAP
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create,
    create_workload,
    fresh_namespace,
    gpu_uuid,
    map_yaml,
    pending_reason,
    statefulset,
    wait_for,
)
from tests.integration.tenantkit import Tenant
from tests.integration.test_dra import (
    SCOPE_LABEL,
    SETTINGS,
    Dra,
    allocated,
    claim_of,
    no_device_twice,
)
from tests.integration.test_dra import controller as controller  # noqa: PLC0414 - fixture
from tests.integration.test_dra import dra as dra  # noqa: PLC0414 - fixture
from tests.integration.test_grants import published_grants, put_policy

pytestmark = pytest.mark.integration

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
REFUSED = "gpuplace allocates those GPUs"


@pytest.fixture(scope="module")
def gpu_claims_policy(cluster: LocalCluster) -> Iterator[None]:
    """The chart's gpu-claims policy as it renders for dra enforcement, and the driver's
    DeviceClass (what the driver's chart installs) for kube-scheduler to allocate from."""
    objects = local_policies.local_copies(local_policies.GPU_CLAIMS, dra=True)
    for obj in objects:
        status, body = cluster.request("POST", policy_path(obj), obj)
        assert status in (201, 409), body
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": SETTINGS.device_class},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{SETTINGS.driver}"'}}]},
    }
    status, body = cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
    assert status in (201, 409), body
    # Policies reach the apiserver's admission through an informer: wait until one refuses.
    probe = fresh_namespace(cluster, "gpu-claims-probe")
    with probe as namespace:
        tenant = Tenant(cluster, namespace)
        wait_for(
            "the gpu-claims policy to refuse a tenant's claim",
            lambda: REFUSED in tenant.create(claim_body("probe")).stderr,
            timeout=60,
        )
    try:
        yield
    finally:
        for obj in reversed(objects):
            cluster.request("DELETE", f"{policy_path(obj)}/{obj['metadata']['name']}")


def policy_path(obj: dict[str, Any]) -> str:
    return POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS


@pytest.fixture
def scheduler(cluster: LocalCluster) -> Iterator[None]:
    """kube-scheduler running, as in every real cluster, for this test only."""
    cluster.start_scheduler()
    try:
        yield
    finally:
        cluster.stop_scheduler()


def claim_body(
    name: str,
    *,
    uuid: str | None = None,
    forged: bool = False,
    device_class: str = SETTINGS.device_class,
    first_available: bool = False,
) -> dict[str, Any]:
    """A claim of `device_class`, for the GPU of `uuid` (a CEL selector) when given; `forged`
    adds the label and annotation of a claim generated from a gpuplace template."""
    request: dict[str, Any] = {"deviceClassName": device_class}
    if uuid is not None:
        selector = f'device.attributes["{SETTINGS.driver}"].{SETTINGS.attribute} == "{uuid}"'
        request["selectors"] = [{"cel": {"expression": selector}}]
    entry: dict[str, Any] = {"name": "gpu"}
    if first_available:
        entry["firstAvailable"] = [{"name": "any", **request}]
    else:
        entry["exactly"] = request
    meta: dict[str, Any] = {"name": name}
    if forged:
        meta["labels"] = {MAP_LABEL: "whatever"}
        meta["annotations"] = {POD_CLAIM_ANNOTATION: "gpuplace-gpus"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [entry]}},
    }


def plain_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of kube-scheduler's (no map label, default schedulerName) using `claim`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def test_a_tenant_cannot_create_a_claim_of_the_managed_class(
    cluster: LocalCluster, gpu_claims_policy: None, dra: Dra
) -> None:
    (node,) = dra.nodes("tenant-claims", 1, gpus=2)
    with fresh_namespace(cluster, "tenant-a") as namespace:
        tenant = Tenant(cluster, namespace)
        assert tenant.can("create", "resourceclaims")  # RBAC lets it: the policy decides
        uuid = gpu_uuid(node, 0)
        for body in (
            claim_body("squat", uuid=uuid, forged=True),
            claim_body("plain", uuid=uuid),
            claim_body("any"),
            claim_body("first", uuid=uuid, first_available=True),
        ):
            refused = tenant.create(body)
            assert refused.returncode != 0, body
            assert REFUSED in refused.stderr, refused.stderr
            assert f"ResourceClaim {body['metadata']['name']} requests" in refused.stderr
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpuplace-llm"},
            "spec": {"spec": claim_body("t", uuid=uuid)["spec"]},
        }
        refused = tenant.create(template)
        assert refused.returncode != 0 and REFUSED in refused.stderr, refused.stderr
        assert "ResourceClaimTemplate gpuplace-llm requests" in refused.stderr
        # A DeviceClass gpuplace does not manage is the tenant's business.
        other = tenant.create(claim_body("nic", device_class="nic.example.com"))
        assert other.returncode == 0, other.stderr
        assert [c["metadata"]["name"] for c in claims_in(cluster, namespace)] == ["nic"]


def claims_in(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    status, body = cluster.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    )
    assert status == 200, body
    return list(body["items"])


def test_a_claim_kube_scheduler_allocated_holds_its_gpu_and_a_second_owner_is_reported(
    cluster: LocalCluster,
    gpu_claims_policy: None,
    dra: Dra,
    controller: ControllerProcess,
    scheduler: None,
) -> None:
    """The attack of a GPU allocated twice, where a claim got past the policy (made before the
    install, or by an administrator): kube-scheduler allocates GPU 0 of the node to the tenant's
    claim, labelled as if gpuplace's; prod's map then declares GPUs 0 and 1 there. Its pod 0
    waits DeviceBusy, naming the claim, and GPU 0 is never in two claims; freed, it goes to
    prod. Then a second allocation of a held GPU, written by hand, is reported on both pods and
    the map, and `gpuplace gpus` shows it."""
    node, elsewhere = dra.nodes("owners", 2, gpus=2)
    with (
        fresh_namespace(cluster, "tenant-a") as tenant_ns,
        fresh_namespace(cluster, "prod", labels={SCOPE_LABEL: "true"}) as prod,
    ):
        # prod is granted the node, the tenant another one (as in the attack).
        put_policy(cluster, two_grants(prod, node, tenant_ns, elsewhere))
        try:
            wait_for(
                "grants published",
                lambda: node in published_grants(cluster).get("namespaces", {}).get(prod, {}),
            )
            a_foreign_allocation_holds_and_a_second_is_reported(cluster, node, tenant_ns, prod)
        finally:
            cluster.request(
                "DELETE", f"/api/v1/namespaces/gpuplace-system/configmaps/{POLICY_CONFIGMAP}"
            )


def two_grants(prod: str, node: str, tenant: str, elsewhere: str) -> str:
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: cluster}\n"
        f"spec:\n  grants:\n    - namespaces: [{prod}]\n      nodes: [{node}]\n"
        f"    - namespaces: [{tenant}]\n      nodes: [{elsewhere}]\n"
    )


def a_foreign_allocation_holds_and_a_second_is_reported(
    cluster: LocalCluster, node: str, tenant_ns: str, prod: str
) -> None:
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{tenant_ns}/resourceclaims"
    create(cluster, claims_path, claim_body("squat", uuid=gpu_uuid(node, 0), forged=True))
    create(cluster, f"/api/v1/namespaces/{tenant_ns}/pods", plain_pod("thief", "squat"))
    squat = wait_for(
        "kube-scheduler allocates the tenant's claim",
        lambda: (c := claim_get(cluster, tenant_ns, "squat")) and allocated(c) and c,
        timeout=90,
    )
    assert allocated(squat) == [(SETTINGS.driver, node, device_name(0))]

    apply_map(cluster, prod, "llm", map_yaml(prod, "llm", [(0, node, [0]), (1, node, [1])]))
    create_workload(cluster, statefulset(prod, "llm", "llm", 2))
    wait_for("llm-1 bound", lambda: "llm-1" in bound_pods(cluster, prod), timeout=90)
    wait_for(
        "llm-0 waits for GPU 0",
        lambda: pending_reason(cluster, prod, "llm-0") == "DeviceBusy",
        timeout=60,
    )
    message = pending_message(cluster, prod, "llm-0")
    assert f"ResourceClaim {tenant_ns}/squat" in message, message
    no_device_twice(cluster)

    # The tenant's pod and claim go: GPU 0 goes to the map that declares it.
    cluster.request("DELETE", f"/api/v1/namespaces/{tenant_ns}/pods/thief?gracePeriodSeconds=0")
    cluster.request("DELETE", f"{claims_path}/squat")
    pod = wait_for("llm-0 bound", lambda: bound_pods(cluster, prod).get("llm-0"), timeout=90)
    no_device_twice(cluster)

    # A second allocation of llm-0's GPU, written by an administrator: reported.
    ours = claim_of(cluster, pod)
    assert ours is not None
    create(cluster, claims_path, claim_body("second"))
    second = claim_get(cluster, tenant_ns, "second")
    assert second is not None
    second["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": SETTINGS.driver,
                        "pool": node,
                        "device": device_name(0),
                    }
                ]
            }
        },
    }
    status, body = cluster.request("PUT", f"{claims_path}/second/status", second)
    assert status == 200, body
    for namespace, kind, name in (
        (prod, "Pod", "llm-0"),
        (prod, "ConfigMap", "llm"),
    ):
        event = wait_for(
            f"GPUHeldTwice on {kind} {namespace}/{name}",
            lambda ns=namespace, k=kind, n=name: held_twice_event(cluster, ns, k, n),
            timeout=60,
        )
        assert f"{tenant_ns}/second" in event and ours["metadata"]["name"] in event, event
    gpus = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace",
            "gpus",
            f"--kubeconfig={cluster.kubeconfig}",
            "--node",
            node,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cells = {c["index"]: c for c in json.loads(gpus.stdout)["gpus"]}
    assert cells[0]["state"] == "held-twice", cells[0]
    assert f"{tenant_ns}/second" in cells[0]["claims"]
    assert cells[1]["state"] == "held"


def claim_get(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status, body = cluster.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    )
    return dict(body) if status == 200 else None


def pending_message(cluster: LocalCluster, namespace: str, name: str) -> str:
    status, pod = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert status == 200, pod
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled":
            return str(cond.get("message", ""))
    return ""


def held_twice_event(cluster: LocalCluster, namespace: str, kind: str, name: str) -> str:
    status, body = cluster.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=reason%3DGPUHeldTwice,"
        f"involvedObject.kind%3D{kind},involvedObject.name%3D{name}",
    )
    assert status == 200, body
    return " ".join(str(e.get("message", "")) for e in body["items"])
