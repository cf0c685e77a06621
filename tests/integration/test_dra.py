"""`dra` enforcement against the real apiserver, kube-controller-manager and kwok nodes: the
webhook gives pods the map's claim, kube-controller-manager generates it, the binder allocates it
to the declared devices from the driver's ResourceSlices, reserves it for the pod, then binds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    ENV_NVIDIA_VISIBLE_DEVICES,
    INDEX_ANNOTATION,
    MAP_LABEL,
)
from placement.dra import (
    DELETE_PROTECTION,
    POD_CLAIM_NAME,
    DraSettings,
    Enforcement,
    device_name,
    slice_for,
    template_name,
)
from placement.grants import POLICY_CONFIGMAP
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create,
    create_system_namespaces,
    create_workload,
    deployment,
    fresh_namespace,
    get_pod,
    gpu_uuid,
    inventory_for,
    leader_killed_during_burst,
    list_pods,
    map_status,
    map_yaml,
    pending_reason,
    publish_inventory,
    scheduled_condition,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
    wait_for_map,
)
from tests.integration.test_grants import published_grants, put_policy
from tests.integration.test_webhook import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import Endpoint, mutating_configuration
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration
from webhook.settings import AdmissionSettings

pytestmark = pytest.mark.integration

SCOPE_LABEL = "gpuplace.io/dra-it"
CONFIGURATION = "gpuplace-dra-it"
SETTINGS = DraSettings()
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


@dataclass
class Dra:
    cluster: LocalCluster

    def nodes(self, prefix: str, count: int, gpus: int, sliced: int | None = None) -> list[str]:
        """kwok GPU nodes with agent inventories and the driver's ResourceSlices (the first
        `sliced` GPUs of each node published, all by default)."""
        names = [unique(f"{prefix}-{i}") for i in range(count)]
        self.cluster.create_nodes([FakeNode(n, gpus=gpus) for n in names])
        for name in names:
            inventory = inventory_for(name, gpus)
            publish_inventory(self.cluster, inventory)
            body = slice_for(inventory, SETTINGS)
            body["spec"]["devices"] = body["spec"]["devices"][: gpus if sliced is None else sliced]
            status, resp = self.cluster.request(
                "POST", "/apis/resource.k8s.io/v1/resourceslices", body
            )
            assert status == 201, resp
        return names


@pytest.fixture(scope="module")
def dra(cluster: LocalCluster) -> Iterator[Dra]:
    create_system_namespaces(cluster)
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, "gpuplace-system").start()
    webhook = RunningWebhook(
        cluster,
        generate_ca("dra-it-ca", timedelta(days=2)),
        models,
        port=free_port(),
        admission=AdmissionSettings(enforcement=Enforcement.DRA),
    )
    webhook.start()
    endpoint = Endpoint(ca_bundle=webhook.ca.cert_pem, url=f"https://127.0.0.1:{webhook.port}")
    selector = {"matchLabels": {SCOPE_LABEL: "true"}}
    apply_configuration(
        kube, mutating_configuration(CONFIGURATION, endpoint, namespace_selector=selector)
    )
    try:
        yield Dra(cluster)
    finally:
        cluster.request(
            "DELETE",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIGURATION}",
        )
        webhook.stop()
        models.stop()


@pytest.fixture
def namespace(cluster: LocalCluster, dra: Dra) -> Iterator[str]:
    with fresh_namespace(cluster, "dra-it", labels={SCOPE_LABEL: "true"}) as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster, dra: Dra) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(cluster, unique("dra"), "--enforcement=dra")
    yield proc
    alive = proc.alive()
    proc.stop()
    print(proc.log()[-6000:])
    assert alive


def claims(cluster: LocalCluster, namespace: str | None = None) -> list[dict[str, Any]]:
    path = (
        CLAIMS
        if namespace is None
        else f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    )
    status, body = cluster.request("GET", path)
    assert status == 200, body
    return list(body["items"])


def claim_of(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, Any] | None:
    names = [
        s["resourceClaimName"]
        for s in pod["status"].get("resourceClaimStatuses") or []
        if s["name"] == POD_CLAIM_NAME
    ]
    if not names:
        return None
    ns = pod["metadata"]["namespace"]
    status, body = cluster.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{names[0]}"
    )
    return body if status == 200 else None


def allocated(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    return [(r["driver"], r["pool"], r["device"]) for r in results.get("results") or []]


def assert_claim_is_the_binding(cluster: LocalCluster, pod: dict[str, Any]) -> None:
    """The pod's claim holds exactly the pod's declared devices, on its node, reserved for it."""
    node = pod["spec"]["nodeName"]
    ann = pod["metadata"]["annotations"]
    claim = claim_of(cluster, pod)
    assert claim is not None, pod["status"]
    uuids = ann[DEVICES_ANNOTATION].split(",")
    indices = [next(i for i in range(64) if gpu_uuid(node, i) == u) for u in uuids]
    assert allocated(claim) == [(SETTINGS.driver, node, device_name(i)) for i in indices]
    selector = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert selector == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    ]
    assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
    # Inside the container only its own GPUs exist: the env names them by UUID.
    assert ann[CUDA_ANNOTATION] == ann[DEVICES_ANNOTATION]


def no_device_twice(cluster: LocalCluster) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for claim in claims(cluster):
        for device in allocated(claim):
            name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            assert device not in seen, f"{device} allocated to {seen.get(device)} and {name}"
            seen[device] = name


def test_statefulset_claims_hold_exactly_the_declared_gpus(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    nodes = dra.nodes("sts", 2, gpus=4)
    entries = [(0, nodes[0], [0, 1]), (1, nodes[0], [3]), (2, nodes[1], [2])]
    apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
    body = statefulset(namespace, "web", "llm", 3)
    body["spec"]["template"]["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    create_workload(cluster, body)
    pods = wait_for_bound(cluster, namespace, 3)
    for index, node, devices in entries:
        pod = pods[f"web-{index}"]
        assert pod["spec"]["nodeName"] == node
        assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == ",".join(
            gpu_uuid(node, d) for d in devices
        )
        assert_claim_is_the_binding(cluster, pod)
        assert pod["spec"]["resourceClaims"] == [
            {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": template_name("llm")}
        ]
        for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
            assert container["resources"]["claims"] == [{"name": POD_CLAIM_NAME}]
            names = [e["name"] for e in container["env"]]
            assert ENV_NVIDIA_VISIBLE_DEVICES not in names
    no_device_twice(cluster)

    # Deleting a pod frees its claim (kube-controller-manager deallocates and deletes it); the
    # StatefulSet's next pod gets a new claim with the same devices.
    old = pods["web-1"]
    old_claim = claim_of(cluster, old)
    assert old_claim is not None
    cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web-1")

    def replaced() -> dict[str, Any] | None:
        pod = bound_pods(cluster, namespace).get("web-1")
        return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None

    new = wait_for("web-1 replaced and bound", replaced, timeout=90)
    assert_claim_is_the_binding(cluster, new)
    names = {c["metadata"]["name"] for c in claims(cluster, namespace)}
    wait_for(
        "the old claim gone",
        lambda: (
            old_claim["metadata"]["name"]
            not in {c["metadata"]["name"] for c in claims(cluster, namespace)}
        ),
        timeout=60,
    )
    assert names
    no_device_twice(cluster)


def test_deployment_and_two_maps_never_share_a_device(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    (node,) = dra.nodes("dep", 1, gpus=4)
    apply_map(
        cluster,
        namespace,
        "batch",
        map_yaml(namespace, "batch", [(0, node, [0]), (1, node, [1])], indexing="allocate"),
    )
    apply_map(cluster, namespace, "other", map_yaml(namespace, "other", [(0, node, [2, 3])]))
    # A claim that someone else allocated (as kube-scheduler would) holds GPU 3.
    foreign = create(
        cluster,
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "foreign"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": SETTINGS.device_class}}
                    ]
                }
            },
        },
    )
    foreign["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": SETTINGS.driver,
                        "pool": node,
                        "device": device_name(3),
                    }
                ]
            }
        }
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/foreign"
    status, resp = cluster.request("PUT", f"{path}/status", foreign)
    assert status == 200, resp
    create_workload(cluster, deployment(namespace, "work", "batch", 3))
    create_workload(cluster, statefulset(namespace, "other", "other", 1))

    def two_work_bound() -> bool:
        pods = bound_pods(cluster, namespace)
        return len([n for n in pods if n.startswith("work-")]) == 2

    wait_for("2 of 3 Deployment pods bound", two_work_bound)
    wait_for(
        "other-0 waits for GPU 3",
        lambda: pending_reason(cluster, namespace, "other-0") == "DeviceBusy",
    )
    pods = bound_pods(cluster, namespace)
    for pod in pods.values():
        assert_claim_is_the_binding(cluster, pod)
    assert sorted(p["metadata"]["annotations"][INDEX_ANNOTATION] for p in pods.values()) == [
        "0",
        "1",
    ]
    no_device_twice(cluster)
    # Freed by its owner, the GPU goes to the map that declares it.
    cluster.request("DELETE", path)
    pod = wait_for(
        "other-0 bound", lambda: bound_pods(cluster, namespace).get("other-0"), timeout=60
    )
    assert_claim_is_the_binding(cluster, pod)
    no_device_twice(cluster)


def test_a_declared_device_missing_from_the_slices_blocks_the_slot(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    (node,) = dra.nodes("miss", 1, gpus=4, sliced=2)
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [1]), (1, node, [3])]))
    create_workload(cluster, statefulset(namespace, "m", "m", 2))
    pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"))
    assert_claim_is_the_binding(cluster, pod)
    wait_for(
        "m-1 DeviceMissing", lambda: pending_reason(cluster, namespace, "m-1") == "DeviceMissing"
    )
    claim = claim_of(
        cluster, next(p for p in list_pods(cluster, namespace) if p["metadata"]["name"] == "m-1")
    )
    assert claim is None or not allocated(claim)


def test_pods_carrying_their_own_claims_are_refused(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    (node,) = dra.nodes("own", 1, gpus=2)
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [0])]))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "m-0", "labels": {MAP_LABEL: "m"}},
        "spec": {
            "resourceClaims": [{"name": "mine", "resourceClaimTemplateName": "any-gpu"}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "mine"}]}}
            ],
        },
    }
    status, body = wait_for(
        "the webhook to know map m",
        lambda: (
            (r := cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod))
            and "does not exist" not in str(r[1].get("message"))
            and r
        ),
    )
    assert status == 403, body
    message = body["message"]
    assert "spec.resourceClaims[0] 'mine'" in message
    assert "spec.containers[0].resources.claims[0] 'mine'" in message
    assert f"placement map {namespace}/m is enforced through DRA" in message


@pytest.mark.slow
def test_leader_killed_during_a_burst_leaves_no_device_twice_and_no_orphan_claim(
    cluster: LocalCluster, dra: Dra, namespace: str
) -> None:
    nodes = dra.nodes("fo", 25, gpus=8)
    with leader_killed_during_burst(
        cluster,
        namespace,
        nodes,
        "--enforcement=dra",
        lease=unique("gpuplace-dra-failover"),
        first_timeout=180,
        all_timeout=400,
        interval=2.0,
    ) as pods:
        for pod in pods.values():
            assert_claim_is_the_binding(cluster, pod)
        no_device_twice(cluster)
        # Half the pods go away: their claims are deallocated and deleted, none stays allocated
        # for a pod that is gone, and the rest keep theirs.
        cluster.kubectl("-n", namespace, "scale", "statefulset/big", "--replicas=100")

        def orphans() -> list[str]:
            uids = {p["metadata"]["uid"] for p in list_pods(cluster, namespace)}
            out = []
            for claim in claims(cluster, namespace):
                holders = {r["uid"] for r in claim["status"].get("reservedFor") or []}
                if allocated(claim) and (not holders or not holders <= uids):
                    out.append(claim["metadata"]["name"])
            return out

        wait_for("100 pods", lambda: len(list_pods(cluster, namespace)) == 100, timeout=180)
        wait_for("no claim allocated for a gone pod", lambda: not orphans(), timeout=120)
        no_device_twice(cluster)


def test_a_template_someone_else_made_under_the_maps_name_is_replaced(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    (node,) = dra.nodes("tpl", 1, gpus=2)
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    request = {"name": "any", "exactly": {"deviceClassName": "other.example.com"}}
    create(
        cluster,
        path,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name("m")},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
    )
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [1])]))

    def ours() -> bool:
        status, body = cluster.request("GET", f"{path}/{template_name('m')}")
        requests = body["spec"]["spec"]["devices"]["requests"] if status == 200 else []
        return [r["name"] for r in requests] == ["gpus"]

    wait_for("the map's own template", ours)
    create_workload(cluster, statefulset(namespace, "m", "m", 1))
    pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"))
    assert_claim_is_the_binding(cluster, pod)


# -- device taints ------------------------------------------------------------------------------
XID_TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


def tainted_node(cluster: LocalCluster, prefix: str, gpus: int, taints: dict[int, Any]) -> str:
    """A kwok GPU node whose driver slice taints the given GPUs (as an XID makes NVIDIA's)."""
    name = unique(prefix)
    cluster.create_nodes([FakeNode(name, gpus=gpus)])
    inventory = inventory_for(name, gpus)
    publish_inventory(cluster, inventory)
    body = slice_for(inventory, SETTINGS)
    for index, device_taints in taints.items():
        body["spec"]["devices"][index]["taints"] = device_taints
    status, resp = cluster.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert status == 201, resp
    return name


def tolerating_map(
    namespace: str, name: str, entries: list[tuple[int, str, list[int]]], tolerations: str
) -> str:
    """`map_yaml` whose last entry has `tolerations` (a YAML flow list)."""
    return map_yaml(namespace, name, entries) + f"      tolerations: {tolerations}\n"


def pending_message(cluster: LocalCluster, namespace: str, name: str) -> str:
    pod = get_pod(cluster, namespace, name)
    cond = scheduled_condition(pod) if pod else None
    return str((cond or {}).get("message", ""))


def test_a_tainted_device_degrades_its_slot_until_the_map_tolerates_it(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    node = tainted_node(cluster, "taint", 2, {1: [XID_TAINT]})
    stored = next(
        s
        for s in cluster.request("GET", "/apis/resource.k8s.io/v1/resourceslices")[1]["items"]
        if s["spec"]["nodeName"] == node
    )
    # The apiserver keeps device taints only with the DRADeviceTaints gate on.
    assert stored["spec"]["devices"][1]["taints"][0]["key"] == "gpu.nvidia.com/xid"
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [1]), (1, node, [0])]))
    create_workload(cluster, statefulset(namespace, "m", "m", 2))
    wait_for("m-1 bound", lambda: bound_pods(cluster, namespace).get("m-1"))
    wait_for(
        "m-0 DeviceTainted", lambda: pending_reason(cluster, namespace, "m-0") == "DeviceTainted"
    )
    assert "gpu.nvidia.com/xid=79:NoSchedule" in pending_message(cluster, namespace, "m-0")
    claim = claim_of(cluster, get_pod(cluster, namespace, "m-0") or {"status": {}})
    assert claim is None or not allocated(claim)

    apply_map(
        cluster,
        namespace,
        "m",
        tolerating_map(
            namespace,
            "m",
            [(1, node, [0]), (0, node, [1])],
            "[{key: gpu.nvidia.com/xid, operator: Exists}]",
        ),
    )
    pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"), timeout=60)
    assert_claim_is_the_binding(cluster, pod)
    claim = claim_of(cluster, pod)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["tolerations"] == [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]


TAINT_RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"


def test_a_device_taint_rule_degrades_the_slot_it_selects_until_removed(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    status, _ = cluster.request("GET", TAINT_RULES)
    if status == 404:
        pytest.skip("this apiserver does not serve DeviceTaintRules (resource.k8s.io/v1alpha3)")
    node = tainted_node(cluster, "rule", 2, {})
    rule_name = unique("drain")
    rule = {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name},
        "spec": {
            "deviceSelector": {"driver": SETTINGS.driver, "pool": node, "device": device_name(0)},
            "taint": {"key": "example.com/maintenance", "value": "now", "effect": "NoSchedule"},
        },
    }
    created, resp = cluster.request("POST", TAINT_RULES, rule)
    assert created == 201, resp
    try:
        apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [0])]))
        create_workload(cluster, statefulset(namespace, "m", "m", 1))
        wait_for(
            "m-0 DeviceTainted",
            lambda: pending_reason(cluster, namespace, "m-0") == "DeviceTainted",
        )
        message = pending_message(cluster, namespace, "m-0")
        assert f"example.com/maintenance=now:NoSchedule (by DeviceTaintRule {rule_name})" in (
            message
        )
    finally:
        cluster.request("DELETE", f"{TAINT_RULES}/{rule_name}")
    pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"), timeout=60)
    assert_claim_is_the_binding(cluster, pod)


def retaint(cluster: LocalCluster, node: str, index: int, taints: list[dict[str, str]]) -> None:
    """Rewrites the taints of GPU `index` in the node's driver slice, as the driver would."""
    body = next(
        s
        for s in cluster.request("GET", "/apis/resource.k8s.io/v1/resourceslices")[1]["items"]
        if s["spec"]["nodeName"] == node
    )
    body["spec"]["devices"][index]["taints"] = taints
    path = f"/apis/resource.k8s.io/v1/resourceslices/{body['metadata']['name']}"
    status, resp = cluster.request("PUT", path, body)
    assert status == 200, resp


XID_SHOWN = "gpu.nvidia.com/xid=79:NoSchedule (in its ResourceSlice)"


def test_a_device_tainted_after_the_fact_degrades_the_map_status_until_tolerated(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    node = tainted_node(cluster, "tstatus", 2, {})
    apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [1])]))
    wait_for_map(cluster, namespace, "m", "Valid")
    retaint(cluster, node, 1, [XID_TAINT])
    status = wait_for_map(cluster, namespace, "m", "Degraded", XID_SHOWN)
    assert f"index 0 on node {node}: device 1 is tainted {XID_SHOWN}" in status["message"]
    apply_map(
        cluster,
        namespace,
        "m",
        tolerating_map(
            namespace, "m", [(0, node, [1])], "[{key: gpu.nvidia.com/xid, operator: Exists}]"
        ),
    )
    wait_for_map(cluster, namespace, "m", "Valid")


def test_a_fallback_device_serves_in_place_of_a_tainted_one(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    node = tainted_node(cluster, "tspare", 4, {1: [XID_TAINT], 2: [XID_TAINT]})
    # Spare 2 is tainted too: 3 stands in.
    text = map_yaml(namespace, "m", [(0, node, [0, 1])]) + "      fallback: [2, 3]\n"
    apply_map(cluster, namespace, "m", text)
    status = wait_for_map(cluster, namespace, "m", "Degraded", "serving from fallback")
    assert (
        f"device 1 tainted {XID_SHOWN}: fallback device 3 ({gpu_uuid(node, 3)}) stands in"
        in status["message"]
    )
    create_workload(cluster, statefulset(namespace, "m", "m", 1))
    pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"), timeout=60)
    assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == (
        f"{gpu_uuid(node, 0)},{gpu_uuid(node, 3)}"
    )
    assert_claim_is_the_binding(cluster, pod)
    retaint(cluster, node, 1, [])
    wait_for_map(cluster, namespace, "m", "Valid")


# -- tolerating is a grant ----------------------------------------------------------------------
RESERVED_TAINT = {"key": "example.com/reserved", "value": "platform", "effect": "NoSchedule"}


def granting(namespace: str, node: str, tolerations: str = "") -> str:
    """A policy that grants `namespace` the node (and, if given, these toleration grants)."""
    text = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: cluster}\n"
        f"spec:\n  grants:\n    - namespaces: [{namespace}]\n      nodes: [{node}]\n"
    )
    return text + (f"      tolerations: {tolerations}\n" if tolerations else "")


def test_a_toleration_is_honoured_only_where_the_policy_grants_it(
    cluster: LocalCluster, dra: Dra, namespace: str, controller: ControllerProcess
) -> None:
    """The platform reserved GPU 0; the tenant, granted the node, tolerates every taint in its
    map: the map is refused at the toleration and the pod never gets the GPU. Once the platform
    grants the key, a map tolerating that key binds, the allocation carrying the toleration."""
    node = tainted_node(cluster, "tgrant", 2, {0: [RESERVED_TAINT]})
    put_policy(cluster, granting(namespace, node))
    try:
        wait_for(
            "grants published",
            lambda: node in published_grants(cluster).get("namespaces", {}).get(namespace, {}),
        )
        apply_map(cluster, namespace, "m", map_yaml(namespace, "m", [(0, node, [0])]))
        create_workload(cluster, statefulset(namespace, "m", "m", 1))
        wait_for(
            "m-0 DeviceTainted",
            lambda: pending_reason(cluster, namespace, "m-0") == "DeviceTainted",
        )

        attack = tolerating_map(namespace, "m", [(0, node, [0])], "[{operator: Exists}]")
        apply_map(cluster, namespace, "m", attack)
        invalid = wait_for(
            "m refused at its toleration",
            lambda: (st := map_status(cluster, namespace, "m")) and st["phase"] == "Invalid" and st,
        )
        [error] = invalid["errors"]
        line = next(n for n, t in enumerate(attack.splitlines(), 1) if "tolerations:" in t)
        column = attack.splitlines()[line - 1].index("{") + 1
        assert (error["line"], error["column"]) == (line, column), error
        assert (
            f"index 0: toleration {{operator: Exists}}: namespace {namespace} may not tolerate "
            f"every taint on node {node}"
        ) in error["message"]
        # Nothing of the refused map is served: the pod waits without its GPU.
        wait_for(
            "m-0 MapNotFound", lambda: pending_reason(cluster, namespace, "m-0") == "MapNotFound"
        )
        claim = claim_of(cluster, get_pod(cluster, namespace, "m-0") or {"status": {}})
        assert claim is None or not allocated(claim)

        put_policy(
            cluster,
            granting(namespace, node, "[{key: example.com/reserved, effects: [NoSchedule]}]"),
        )
        apply_map(
            cluster,
            namespace,
            "m",
            tolerating_map(
                namespace,
                "m",
                [(0, node, [0])],
                "[{key: example.com/reserved, operator: Exists, effect: NoSchedule}]",
            ),
        )
        pod = wait_for("m-0 bound", lambda: bound_pods(cluster, namespace).get("m-0"), timeout=60)
        assert_claim_is_the_binding(cluster, pod)
        claim = claim_of(cluster, pod)
        assert claim is not None
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["tolerations"] == [
            {"key": "example.com/reserved", "operator": "Exists", "effect": "NoSchedule"}
        ]
    finally:
        cluster.request(
            "DELETE", f"/api/v1/namespaces/gpuplace-system/configmaps/{POLICY_CONFIGMAP}"
        )
