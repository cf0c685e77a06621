"""`gpuplace plan` against the real apiserver, as a CI job runs it: with the token of a
ServiceAccount bound to the chart's ClusterRole gpuplace-plan (rendered from the chart), it names
the running pod a moved slot would move and the slot that would wait on a GPU another pod holds;
every write that identity tries is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIForbiddenError
from tests.chartkit import SCENARIOS, one, render
from tests.integration.controllerkit import (
    ControllerProcess,
    bound_pods,
    create,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    map_yaml,
    running_controller,
    statefulset,
    unique,
    wait_for,
    write_kubeconfig,
)
from tests.integration.test_drift import apply_at

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

KUSTOMIZATION = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"
configMapGenerator:
"""


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "plan") as name:
        yield name
        cluster.request(
            "DELETE",
            f"/api/v1/namespaces/{name}/configmaps?labelSelector=gpuplace.io%2Fplacement-map%3Dtrue",
        )


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster, log_tail=6000) as proc:
        yield proc


@pytest.fixture
def plan_identity(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount bound to the chart's ClusterRole gpuplace-plan."""
    role = one(render(SCENARIOS[0], tmp_path), "ClusterRole", "gpuplace-plan")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    account = "plan-ci"
    create(
        cluster,
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    binding_name = f"gpuplace-plan-{namespace}"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpuplace-plan",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    create(cluster, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    status, body = cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert status == 201, body
    path = write_kubeconfig(
        cluster, tmp_path / "plan-kubeconfig", account, {"token": body["status"]["token"]}
    )
    yield path
    cluster.request(
        "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding_name}"
    )


def commit_cluster(repo: git.Repo, root: Path, maps: dict[str, str], message: str) -> None:
    directory = root / "clusters" / "dev"
    (directory / "maps").mkdir(parents=True, exist_ok=True)
    kustomization = KUSTOMIZATION
    for name, text in maps.items():
        namespace = yaml.safe_load(text)["metadata"]["namespace"]
        (directory / "maps" / f"{name}.yaml").write_text(text)
        kustomization += (
            f"  - name: {name}\n    namespace: {namespace}\n"
            f"    files: [placement.yaml=maps/{name}.yaml]\n"
        )
    (directory / "kustomization.yaml").write_text(kustomization)
    repo.git.add(A=True)
    repo.index.commit(message)


def test_the_plan_names_the_pod_that_would_move_with_a_read_only_identity(
    cluster: LocalCluster,
    namespace: str,
    controller: ControllerProcess,
    plan_identity: Path,
    tmp_path: Path,
) -> None:
    a, b = gpu_nodes(cluster, unique("plan"), 2)
    before = map_yaml(namespace, "m", [(0, a, [0]), (1, a, [1])])
    other = map_yaml(namespace, "other", [(0, b, [1])])
    apply_at(cluster, namespace, "m", before, "p000001")
    apply_at(cluster, namespace, "other", other, "p000001")
    create_workload(cluster, statefulset(namespace, "x", "m", 2))
    create_workload(cluster, statefulset(namespace, "y", "other", 1))
    wait_for("3 bound", lambda: len(bound_pods(cluster, namespace)) == 3)

    root = tmp_path / "repo"
    repo = git.Repo.init(root, initial_branch="main")
    # `other` is not in this repository (another team's): nothing offline sees its GPU.
    commit_cluster(repo, root, {"m": before}, "before")
    # Slot 1 moves onto GPU 1 of b, which the pod of `other` holds.
    after = map_yaml(namespace, "m", [(0, a, [0]), (1, b, [1])])
    commit_cluster(repo, root, {"m": after}, "after")
    repo.close()

    argv = [sys.executable, "-m", "gpuplace", "plan", "HEAD~1", "HEAD", "--repo", str(root)]
    argv += ["--kubeconfig", str(plan_identity), "--detailed-exitcode"]
    text = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert text.returncode == 2, text.stdout + text.stderr
    assert "1 pod would move" in text.stdout
    assert (
        f"{namespace}/x-1 (SlotMoved): ~ index 1 moved: {a} devices 1 -> {b} devices 1"
        in text.stdout
    )
    assert f"{namespace}/x-0" not in text.stdout

    report = subprocess.run(
        [*argv, "--format", "json"], capture_output=True, text=True, check=False, timeout=120
    )
    (cluster_plan,) = json.loads(report.stdout)["clusters"]
    live: dict[str, Any] = cluster_plan["live"]
    assert live["error"] is None
    assert [d["pod"] for d in live["drifting"]] == [f"{namespace}/x-1"]
    (waiting,) = live["waiting"]
    assert (waiting["map"], waiting["index"], waiting["reason"]) == (
        f"{namespace}/m",
        1,
        "DeviceBusy",
    )
    assert f"{namespace}/y-0" in waiting["detail"]

    # The identity the plan ran with can read, never write.
    kube = Kube.connect(ClientSettings(kubeconfig=str(plan_identity)))
    pod_path = f"/api/v1/namespaces/{namespace}/pods"
    writes: list[Callable[[], object]] = [
        lambda: kube.delete(f"{pod_path}/x-0"),
        lambda: kube.patch(f"{pod_path}/x-0", {"metadata": {"labels": {"moved": "yes"}}}),
        lambda: kube.create(
            f"{pod_path}/x-0/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "x-0"}},
        ),
        lambda: kube.patch(
            f"/api/v1/namespaces/{namespace}/configmaps/m", {"data": {"placement.yaml": after}}
        ),
        lambda: kube.create(
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sneaky"}},
        ),
        lambda: kube.get(f"/api/v1/namespaces/{namespace}/secrets"),
    ]
    for attempt in writes:
        with pytest.raises(APIForbiddenError):
            attempt()
    kube.close()
    assert set(bound_pods(cluster, namespace)) == {"x-0", "x-1", "y-0"}
