"""Pre-bound pods, the map label and the legacy namespace selector, tried as a hostile tenant (a
ServiceAccount with the built-in `edit` role) on the real apiserver, with `gpuplace controller`
as a process and the webhook over HTTPS registered for this module's namespaces:

- a pod created already bound to a GPU a served map declares (its pod away) is refused at create
  with the slot named, and the map's pod binds that GPU once it comes;
- a pod created without the map label and labelled afterwards is refused by the pod-bindings
  policy, and a labelled pod the webhook never admitted is never bound (`NotAdmitted`);
- a legacy pod of a namespace outside the legacy namespace selector is never bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    create_system_namespaces,
    fresh_namespace,
    get_pod,
    inventory_for,
    map_yaml,
    pending_reason,
    pod_body,
    publish_inventory,
    unique,
    wait_for,
    wait_for_map,
)
from tests.integration.tenantkit import Tenant
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

SCOPE = "gpuplace.io/prebound-it"
LEGACY_OK = "gpuplace.io/legacy-it"
CONFIGURATION = "gpuplace-prebound-it"
IMAGE = "busybox:1.35"


@dataclass
class Setup:
    controller: ControllerProcess
    node: str


@pytest.fixture(scope="module")
def setup(cluster: LocalCluster) -> Iterator[Setup]:
    create_system_namespaces(cluster)
    node = unique("gpu-node-02")
    cluster.create_nodes([FakeNode(node, gpus=8)])
    publish_inventory(cluster, inventory_for(node, 8))
    controller = ControllerProcess(
        cluster,
        unique("prebound"),
        "--legacy-scheduler-name=gpu-scheduler",
        f'--legacy-namespace-selector={{"matchLabels": {{"{LEGACY_OK}": "true"}}}}',
    )
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, "gpuplace-system").start()
    webhook = RunningWebhook(
        cluster, generate_ca("prebound-it-ca", timedelta(days=2)), models, port=free_port()
    )
    webhook.start()
    endpoint = Endpoint(ca_bundle=webhook.ca.cert_pem, url=f"https://127.0.0.1:{webhook.port}")
    scoped = {"matchLabels": {SCOPE: "true"}}
    apply_configuration(
        kube,
        mutating_configuration(
            CONFIGURATION,
            endpoint,
            legacy_scheduler_names=["gpu-scheduler"],
            namespace_selector=scoped,
        ),
    )
    apply_configuration(
        kube, validating_configuration(CONFIGURATION, endpoint, namespace_selector=scoped)
    )
    try:
        yield Setup(controller, node)
    finally:
        for collection in (MUTATING_PATH, VALIDATING_PATH):
            cluster.request("DELETE", f"{collection}/{CONFIGURATION}")
        webhook.stop()
        models.stop()
        controller.stop()
        print(controller.log()[-4000:])
        cluster.request("DELETE", f"/api/v1/nodes/{node}")


def container() -> dict[str, Any]:
    return {"name": "main", "image": IMAGE}


def legacy_pod(namespace: str, name: str, text: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "gpu-scheduler", "containers": [container()]}
    if node:
        spec["nodeName"] = node
    return pod_body(namespace, name, spec, annotations={LEGACY_ANNOTATION: text})


def wait_webhook(cluster: LocalCluster, namespace: str) -> None:
    """The apiserver picks up configurations asynchronously: probe with a dry-run legacy pod."""

    def mutated() -> bool:
        probe = legacy_pod(namespace, "probe-0", "0=n:0\n")
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe
        )
        return status == 201 and bool(body["spec"]["containers"][0].get("env"))

    wait_for("the apiserver to call the webhook", mutated)


def bound_devices(cluster: LocalCluster, namespace: str, name: str) -> str:
    pod = get_pod(cluster, namespace, name) or {}
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return (
        str(annotations.get("gpuplace.io/cuda-visible-devices", ""))
        if pod.get("spec", {}).get("nodeName")
        else ""
    )


def test_a_prebound_pod_on_a_declared_gpu_is_refused_naming_the_slot(
    cluster: LocalCluster, setup: Setup
) -> None:
    labels = {SCOPE: "true", LEGACY_OK: "true"}
    with (
        fresh_namespace(cluster, "prod", labels=labels) as prod,
        fresh_namespace(cluster, "tenant", labels=labels) as tenant_ns,
    ):
        wait_webhook(cluster, tenant_ns)
        apply_map(cluster, prod, "serve", map_yaml(prod, "serve", [(0, setup.node, [3, 4])]))
        wait_for_map(cluster, prod, "serve", "Valid")
        tenant = Tenant(cluster, tenant_ns)
        squat = legacy_pod(tenant_ns, "squat-0", f"0={setup.node}:3\n", node=setup.node)
        refused = tenant.create(squat)
        assert refused.returncode != 0, refused.stdout
        assert f"is declared by map {prod}/serve index 0" in refused.stderr, refused.stderr
        assert get_pod(cluster, tenant_ns, "squat-0") is None
        # prod's pod comes back and takes its GPUs.
        spec = {"containers": [container()]}
        status, body = cluster.request(
            "POST",
            f"/api/v1/namespaces/{prod}/pods",
            pod_body(prod, "serve-0", spec, labels={MAP_LABEL: "serve"}),
        )
        assert status == 201, body
        wait_for(
            lambda: f"serve-0 bound\n{setup.controller.log()[-3000:]}",
            lambda: bound_devices(cluster, prod, "serve-0") == "3,4",
        )


def test_a_label_added_after_create_never_makes_a_pod_placeable(
    cluster: LocalCluster, setup: Setup
) -> None:
    with (
        fresh_namespace(cluster, "lab", labels={SCOPE: "true"}) as ns,
        fresh_namespace(cluster, "nohook") as unhooked,
    ):
        wait_webhook(cluster, ns)
        for where, gpu in ((ns, 6), (unhooked, 7)):
            apply_map(cluster, where, "llm", map_yaml(where, "llm", [(0, setup.node, [gpu])]))
            wait_for_map(cluster, where, "llm", "Valid")
        tenant = Tenant(cluster, ns)
        plain = pod_body(ns, "llm-0", {"schedulerName": "gpuplace", "containers": [container()]})
        created = tenant.create(plain)
        assert created.returncode == 0, created.stderr
        labelled = tenant.kubectl("label", "pod", "llm-0", f"{MAP_LABEL}=llm")
        assert labelled.returncode != 0, labelled.stdout
        assert "may not be added after the pod is created" in labelled.stderr, labelled.stderr
        wait_for(
            lambda: f"llm-0 judged\n{setup.controller.log()[-3000:]}",
            lambda: pending_reason(cluster, ns, "llm-0") == "NoPlacement",
        )
        # A labelled pod the webhook never saw (no webhook for that namespace): never bound.
        status, body = cluster.request(
            "POST",
            f"/api/v1/namespaces/{unhooked}/pods",
            pod_body(
                unhooked,
                "llm-0",
                {"schedulerName": "gpuplace", "containers": [container()]},
                labels={MAP_LABEL: "llm"},
            ),
        )
        assert status == 201, body
        wait_for(
            lambda: f"llm-0 NotAdmitted\n{setup.controller.log()[-3000:]}",
            lambda: pending_reason(cluster, unhooked, "llm-0") == "NotAdmitted",
        )
        assert not (get_pod(cluster, unhooked, "llm-0") or {})["spec"].get("nodeName")


def test_the_legacy_namespace_selector_holds_for_the_controller(
    cluster: LocalCluster, setup: Setup
) -> None:
    with (
        fresh_namespace(cluster, "in", labels={LEGACY_OK: "true"}) as chosen,
        fresh_namespace(cluster, "out") as other,
    ):
        for ns, gpu in ((chosen, 1), (other, 2)):
            status, body = cluster.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                legacy_pod(ns, "train-0", f"0={setup.node}:{gpu}\n"),
            )
            assert status == 201, body
        wait_for(
            lambda: f"the chosen namespace's pod bound\n{setup.controller.log()[-3000:]}",
            lambda: bound_devices(cluster, chosen, "train-0") == "1",
        )
        wait_for(
            lambda: f"the other namespace's pod refused\n{setup.controller.log()[-3000:]}",
            lambda: pending_reason(cluster, other, "train-0") == "NotGranted",
        )
        pod = get_pod(cluster, other, "train-0") or {}
        assert not pod["spec"].get("nodeName")
        message = next(
            c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
        )
        assert "is not selected by the legacy namespace selector" in message
