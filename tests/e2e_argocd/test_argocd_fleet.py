"""A fleet through ArgoCD itself: two control planes, each registered in one ArgoCD as a cluster
Secret labelled gpuplace.io/enabled, and argocd/fleet's ApplicationSets pointed at a local git
repository. One commit changes the maps of both clusters; both maps Applications sync it; each
cluster's own controller places that cluster's pods, on its own nodes. A labelled cluster
without a directory, and a directory without a cluster, are each reported by name.

The chart's Applications are generated and compared but not synced here (their template's
automated sync is removed): there is no image or real node on these control planes, so each
cluster runs its controller out of cluster, as the integration tests do.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from gpuplace_dev.localargocd import LocalArgoCD
from gpuplace_dev.localargocd.apps import (
    APPLICATIONS,
    APPLICATIONSETS,
    REFRESH_ANNOTATION,
    AppState,
)
from gpuplace_dev.localcluster import LocalCluster
from tests.integration.controllerkit import (
    bound_pods,
    create_system_namespaces,
    create_workload,
    gpu_nodes,
    gpu_uuid,
    map_yaml,
    running_controller,
    statefulset,
    wait_for,
)

pytestmark = pytest.mark.argocd

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = "https://github.com/gpuplace/gpuplace.git"
ENABLED = {"gpuplace.io/enabled": "true"}
NAMESPACE = "inference"
KUSTOMIZATION = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"
configMapGenerator:
  - name: llm
    namespace: inference
    files: [placement.yaml=llm.yaml]
"""


class Fleet:
    def __init__(self, hub: LocalCluster, west: LocalCluster, argocd: LocalArgoCD, repo: Path):
        self.clusters = {"east": hub, "west": west}
        self.hub = hub
        self.argocd = argocd
        self.repo = repo
        self.nodes: dict[str, str] = {}

    def commit(self, maps: dict[str, str], message: str) -> str:
        with git.Repo(self.repo) as repo:
            for name, text in maps.items():
                (self.repo / "examples/gitops/clusters" / name / "llm.yaml").write_text(text)
            repo.git.add(A=True)
            return str(repo.index.commit(message).hexsha)

    def app(self, name: str) -> AppState | None:
        status, body = self.hub.request("GET", APPLICATIONS.item(name, "argocd"))
        return AppState.from_object(body) if status == 200 else None

    def appset_conditions(self, name: str = "gpuplace-cluster-directories") -> list[str]:
        self.argocd.check_alive()
        status, body = self.hub.request("GET", APPLICATIONSETS.item(name, "argocd"))
        conditions = (body.get("status") or {}).get("conditions") or [] if status == 200 else []
        return [
            f"{c.get('type')} {c.get('reason')}: {c.get('message')}"
            for c in conditions
            if c.get("status") == "True"
        ]

    def refresh(self, name: str) -> None:
        body = {"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}}
        self.hub.request("PATCH", APPLICATIONS.item(name, "argocd"), body)

    def synced_at(self, name: str, revision: str) -> AppState:
        def done() -> AppState | None:
            self.argocd.check_alive()
            state = self.app(name)
            if state is not None and state.sync == "Synced" and state.revision == revision:
                return state
            if state is not None:
                self.refresh(name)
            return None

        def what() -> str:
            return f"{name} Synced @ {revision[:7]}: {self.app(name)}"

        state: AppState = wait_for(what, done, 600, interval=5)
        return state


def write_tree(directory: Path) -> None:
    url = f"file://{directory}"
    shutil.copytree(REPO / "charts" / "gpuplace", directory / "charts" / "gpuplace")
    (directory / "argocd" / "fleet").mkdir(parents=True)
    for path in [REPO / "argocd/project.yaml", *sorted((REPO / "argocd/fleet").glob("*.yaml"))]:
        text = path.read_text().replace(UPSTREAM, url)
        (directory / path.relative_to(REPO)).write_text(text)
    gitops = directory / "examples" / "gitops"
    (gitops / "clusters").mkdir(parents=True)
    shutil.copyfile(REPO / "examples/gitops/values.yaml", gitops / "values.yaml")
    for name in ("east", "west", "orphan"):
        cluster = gitops / "clusters" / name
        cluster.mkdir()
        (cluster / "kustomization.yaml").write_text(KUSTOMIZATION)
        (cluster / "values.yaml").write_text(f"# {name}\n")
        (cluster / "llm.yaml").write_text(map_yaml(NAMESPACE, "llm", [(0, "nowhere", [0])]))


def documents(directory: Path) -> list[dict[str, Any]]:
    """The project and the fleet's ApplicationSets as the test applies them: the chart's
    Applications compared, not synced."""
    docs = [yaml.safe_load((directory / "argocd/project.yaml").read_text())]
    for path in sorted((directory / "argocd/fleet").glob("applicationset-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["metadata"]["name"] == "gpuplace":
            del doc["spec"]["template"]["spec"]["syncPolicy"]["automated"]
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("argocd-fleet")
    repo_dir = workdir / "repo"
    write_tree(repo_dir)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "gpuplace test")
        config.set_value("user", "email", "test@gpuplace.invalid")
    repo.git.add(A=True)
    repo.index.commit("the fleet")
    repo.close()
    hub = LocalCluster(workdir / "east", namespaces=[NAMESPACE])
    west = LocalCluster(workdir / "west", namespaces=[NAMESPACE])
    argocd = LocalArgoCD(hub, workdir / "argocd", destinations=())
    try:
        hub.start()
        west.start()
        argocd.start()
        argocd.register("east", hub, ENABLED)
        argocd.register("west", west, ENABLED)
        # Labelled, but the repository has no directory of its name: west again, by another
        # address (ArgoCD tells clusters apart by their server URL).
        argocd.register(
            "ghost", west, ENABLED, server=west.server.replace("127.0.0.1", "localhost")
        )
        for cluster in (hub, west):
            create_system_namespaces(cluster)
        manifest = "\n---\n".join(yaml.safe_dump(d) for d in documents(repo_dir))
        hub.kubectl("apply", "--server-side", "-f", "-", input=manifest)
        yield Fleet(hub, west, argocd, repo_dir)
    finally:
        argocd.stop()
        west.stop()
        hub.stop()


def two_bound(cluster: LocalCluster) -> dict[str, dict[str, Any]] | None:
    pods = bound_pods(cluster, NAMESPACE)
    return pods if len(pods) == 2 else None


def test_one_commit_changes_the_maps_of_both_clusters_each_placed_by_its_own_controller(
    fleet: Fleet,
) -> None:
    nodes = {
        name: gpu_nodes(c, f"fleet-{name}", 1, gpus=4)[0] for name, c in fleet.clusters.items()
    }
    declared = {name: [(0, node, [0]), (1, node, [1])] for name, node in nodes.items()}
    first = fleet.commit(
        {name: map_yaml(NAMESPACE, "llm", entries) for name, entries in declared.items()},
        "maps for east and west",
    )
    for name in fleet.clusters:
        fleet.synced_at(f"gpuplace-maps-{name}", first)
    with (
        running_controller(fleet.clusters["east"], prefix="east"),
        running_controller(fleet.clusters["west"], prefix="west"),
    ):
        for cluster in fleet.clusters.values():
            create_workload(cluster, statefulset(NAMESPACE, "web", "llm", 2))
        for name, cluster in fleet.clusters.items():
            pods = wait_for(f"2 pods bound in {name}", partial(two_bound, cluster), 120)
            for index, node, devices in declared[name]:
                annotations = pods[f"web-{index}"]["metadata"]["annotations"]
                assert pods[f"web-{index}"]["spec"]["nodeName"] == node
                assert annotations["gpuplace.io/devices"] == gpu_uuid(node, devices[0])

        # One commit moves slot 1 of each cluster onto GPU 3 of its own node.
        moved = {name: [(0, node, [0]), (1, node, [3])] for name, node in nodes.items()}
        second = fleet.commit(
            {name: map_yaml(NAMESPACE, "llm", entries) for name, entries in moved.items()},
            "move slot 1 in east and west",
        )
        for name in fleet.clusters:
            state = fleet.synced_at(f"gpuplace-maps-{name}", second)
            assert state.revision == second
        for name, cluster in fleet.clusters.items():
            cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/web-1")

            def rebound(c: LocalCluster = cluster, node: str = nodes[name]) -> bool:
                pod = bound_pods(c, NAMESPACE).get("web-1")
                devices = pod["metadata"]["annotations"].get("gpuplace.io/devices") if pod else ""
                return devices == gpu_uuid(node, 3)

            wait_for(f"{name} web-1 on GPU 3", rebound, 120)


def test_a_labelled_cluster_without_a_directory_and_a_directory_without_a_cluster_are_named(
    fleet: Fleet,
) -> None:
    def condition(app: str, *words: str) -> str:
        def found() -> str:
            fleet.argocd.check_alive()
            state = fleet.app(app)
            if state is None:
                return ""
            text = " ".join([*state.conditions, state.operation_message])
            return text if all(w in text for w in words) else ""

        def what() -> str:
            return f"{app} reports {words}: {fleet.app(app)}"

        return str(wait_for(what, found, 300, interval=2))

    # The ApplicationSet refuses to generate an Application for a cluster that does not exist,
    # and says so in its own condition, naming the cluster.
    directories = wait_for(
        lambda: (
            f"ApplicationSet gpuplace-cluster-directories names orphan: {fleet.appset_conditions()}"
        ),
        lambda: [m for m in fleet.appset_conditions() if "no clusters with this name: orphan" in m],
        300,
        interval=2,
    )
    assert directories
    condition("gpuplace-ghost", "clusters/ghost/values.yaml")
    assert fleet.app("gpuplace-maps-ghost") is None
    assert fleet.app("gpuplace-maps-orphan") is None
    # The clusters that match: their directory check passes, their chart is compared.
    for name in ("east", "west"):
        state = fleet.app(f"gpuplace-directory-{name}")
        assert state is not None and not [c for c in state.conditions if "Invalid" in c]
