"""gpuplace as a platform team runs it: the chart installed with helm, its pods from the image built
here running on the real node, a map and a pod applied with kubectl, the pod bound by the in-cluster
controller and its container printing the declared GPUs."""

from __future__ import annotations

import json

from gpuplace_dev.localcluster import chart
from placement.annotations import CUDA_ANNOTATION, DEVICES_ANNOTATION, MAP_LABEL
from placement.inventory import INVENTORY_KEY
from tests.e2e_chart.conftest import Installed
from tests.integration.controllerkit import map_yaml, placement_configmap, wait_for
from tests.integration.test_real_node import logs, probe_pod, report, wait_running

COMPONENTS = {"controller": 2, "webhook": 2, "agent": 1}


def test_every_component_runs_as_pods_of_the_image_built_here(installed: Installed) -> None:
    pods = chart.component_pods(installed.cluster)
    by_component: dict[str, list[dict[str, object]]] = {}
    for pod in pods:
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        by_component.setdefault(component, []).append(pod)
    assert {c: len(p) for c, p in by_component.items()} == COMPONENTS
    for pod in pods:
        assert pod["spec"]["nodeName"] == "localhost"
        assert pod["status"]["phase"] == "Running"
        assert (
            pod["spec"]["serviceAccountName"]
            == f"gpuplace-{pod['metadata']['labels']['app.kubernetes.io/component']}"
        )
        [status] = pod["status"]["containerStatuses"]
        assert status["ready"], status
        # Imported, not pulled: the kubelet names the image by its ID (the config's digest).
        assert status["imageID"] == installed.image.id, status["imageID"]
    # One controller leads, by the Lease, through its ServiceAccount's token.
    status, lease = installed.cluster.request(
        "GET",
        f"/apis/coordination.k8s.io/v1/namespaces/{chart.NAMESPACE}/leases/gpuplace-controller",
    )
    assert status == 200, lease
    holders = {p["metadata"]["name"] for p in by_component["controller"]}
    assert lease["spec"]["holderIdentity"] in holders


def test_the_agent_reads_nvml_through_the_charts_mount(installed: Installed) -> None:
    def inventory() -> dict[str, object] | None:
        status, cm = installed.cluster.request(
            "GET", f"/api/v1/namespaces/{chart.INVENTORY_NAMESPACE}/configmaps/localhost"
        )
        return json.loads(cm["data"][INVENTORY_KEY]) if status == 200 else None

    found = wait_for("the agent's inventory of localhost", inventory, timeout=60)
    uuids = [d["uuid"] for d in found["devices"]]  # type: ignore[index]
    assert uuids == [chart.real_node_uuid(i) for i in range(4)]


def test_a_map_and_a_pod_applied_with_kubectl_run_on_the_declared_gpus(
    installed: Installed, ns: str
) -> None:
    cluster = installed.cluster
    text = map_yaml(ns, "llm", [(0, "localhost", [2, 3])], envMode="uuid")
    manifest = json.dumps(placement_configmap(ns, "llm", text))
    # Through the validating webhook, reached by the apiserver at its Service.
    cluster.kubectl("apply", "-f", "-", input=manifest)
    broken = json.dumps(placement_configmap(ns, "broken", text.replace("index: 0", "index: x")))
    refused = cluster.kubectl("apply", "-f", "-", input=broken, check=False)
    assert refused.returncode != 0 and "placement.yaml:" in refused.stderr, refused.stderr

    pod = probe_pod("llm-0", ns, labels={MAP_LABEL: "llm"})
    created = wait_for(
        "the webhook admits the pod once it has the map",
        lambda: (
            cluster.kubectl("apply", "-f", "-", input=json.dumps(pod), check=False).returncode == 0
        ),
        timeout=60,
    )
    assert created
    running = wait_running(cluster, ns, "llm-0")
    annotations = running["metadata"]["annotations"]
    expected = f"{chart.real_node_uuid(2)},{chart.real_node_uuid(3)}"
    assert annotations[DEVICES_ANNOTATION] == expected
    assert annotations[CUDA_ANNOTATION] == expected
    assert running["spec"]["schedulerName"] == "gpuplace"  # set by the webhook
    printed = report(logs(cluster, ns, "llm-0", "-c", "probe"))
    assert printed["CUDA_VISIBLE_DEVICES"] == expected
    assert printed["NVIDIA_VISIBLE_DEVICES"] == expected
    assert printed["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
