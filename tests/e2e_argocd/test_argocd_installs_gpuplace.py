"""ArgoCD deploys gpuplace itself: the chart's Application (argocd/application-gpuplace.yaml, pointed
at the chart in a local git repository) syncs the image built here onto the real node; a map and a
pod then run as declared. Deleting the Application (a prune of everything it deployed) and
creating it again keeps the running pods on their GPUs, and a map's pod is refused meanwhile."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from gpuplace_dev.demo.argocd import chart_application, project
from gpuplace_dev.localargocd import LocalArgoCD
from gpuplace_dev.localargocd.apps import APPLICATIONS, AppState
from gpuplace_dev.localcluster import LocalCluster, chart
from placement.annotations import DEVICES_ANNOTATION, MAP_LABEL
from tests.integration.controllerkit import map_yaml, placement_configmap, wait_for
from tests.integration.test_real_node import admit, probe_pod, wait_running

pytestmark = [pytest.mark.argocd, pytest.mark.real_node]

REPO = Path(__file__).resolve().parents[2]
APP = "gpuplace"


class Deployment:
    def __init__(self, cluster: LocalCluster, argocd: LocalArgoCD, app: dict[str, Any]) -> None:
        self.cluster = cluster
        self.argocd = argocd
        self.app = app

    def apply(self) -> None:
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(self.app))

    def state(self) -> AppState | None:
        status, body = self.cluster.request("GET", APPLICATIONS.item(APP, "argocd"))
        return AppState.from_object(body) if status == 200 else None

    def healthy(self) -> AppState:
        def synced() -> AppState | None:
            self.argocd.check_alive()
            state = self.state()
            ok = state is not None and state.sync == "Synced" and state.health == "Healthy"
            return state if ok else None

        return wait_for(
            lambda: f"Application {APP} Synced and Healthy: {self.state()}", synced, timeout=300
        )

    def delete(self) -> None:
        """`kubectl delete application` with ArgoCD's resources finalizer: a cascading prune."""
        self.cluster.kubectl("-n", "argocd", "delete", "application", APP, "--wait=false")
        wait_for(f"Application {APP} gone", lambda: self.state() is None, timeout=300)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    image = chart.build_image()
    workdir = tmp_path_factory.mktemp("argocd-chart")
    repo_dir = workdir / "repo"
    shutil.copytree(REPO / "charts", repo_dir / "charts")
    repo = git.Repo.init(repo_dir, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "gpuplace test")
        config.set_value("user", "email", "test@gpuplace.invalid")
    repo.git.add(A=True)
    repo.index.commit("gpuplace chart")
    cluster = LocalCluster(
        workdir / "cluster", real_nodes=1, scheduler=True, pod_network=True, policies=False
    )
    argocd = LocalArgoCD(cluster, workdir / "argocd")
    try:
        cluster.start()
        chart.import_image(cluster, image)
        nvml = chart.nvml_directory(cluster, chart.fake_nvml(4))
        cluster.kubectl("label", "--overwrite", "node", "localhost", chart.GPU_NODE_LABEL)
        argocd.start()
        url = f"file://{repo_dir}"
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(project(url)))
        app = chart_application(url, chart.local_values(image, nvml), "in-cluster")
        deployment = Deployment(cluster, argocd, app)
        deployment.apply()
        deployment.healthy()
        chart.wait_ready(cluster)
        yield deployment
    finally:
        argocd.stop()
        cluster.stop()


def test_argocd_deploys_gpuplace_and_a_prune_and_resync_keeps_running_pods(
    deployed: Deployment,
) -> None:
    cluster = deployed.cluster
    pods = chart.component_pods(cluster)
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert components == ["agent", "controller", "controller", "webhook", "webhook"]
    _status, ns_obj = cluster.request("GET", f"/api/v1/namespaces/{chart.NAMESPACE}")
    assert ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

    ns = f"argo-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(ns)
    text = map_yaml(ns, "m", [(0, "localhost", [1]), (1, "localhost", [2])])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(placement_configmap(ns, "m", text)))
    admit(cluster, ns, "m-0", "m")
    before = wait_running(cluster, ns, "m-0")
    assert before["metadata"]["annotations"][DEVICES_ANNOTATION] == chart.real_node_uuid(1)

    deployed.delete()
    wait_for("gpuplace's pods gone", lambda: chart.component_pods(cluster) == [], timeout=120)
    kept, _ = cluster.request(
        "GET", f"/api/v1/namespaces/{chart.NAMESPACE}/secrets/gpuplace-binding-key"
    )
    assert kept == 200, "the binding key ring was pruned"
    refused = cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(probe_pod("m-1", ns, labels={MAP_LABEL: "m"})),
        check=False,
    )
    assert "gpuplace is not installed or its webhook is not running" in refused.stderr, (
        refused.stderr
    )

    deployed.apply()
    deployed.healthy()
    chart.wait_ready(cluster)
    admit(cluster, ns, "m-1", "m")
    after = wait_running(cluster, ns, "m-1")
    assert after["metadata"]["annotations"][DEVICES_ANNOTATION] == chart.real_node_uuid(2)
    still = wait_running(cluster, ns, "m-0")
    assert still["metadata"]["uid"] == before["metadata"]["uid"]
    assert still["metadata"]["annotations"] == before["metadata"]["annotations"]
    for pod in chart.component_pods(cluster):
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] == "controller":
            log = cluster.kubectl("-n", chart.NAMESPACE, "logs", pod["metadata"]["name"]).stdout
            assert "unverifiable binding" not in log
