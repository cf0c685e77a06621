"""The preflight gate for real (`make e2e-preflight`): ArgoCD syncs a map directory whose
kustomization includes the Workflow `gpuplace preflight` printed for its map; ArgoCD runs it as a
PreSync hook, a real Argo Workflows controller (built from its Go module by
hack/build-argo-workflows.sh, out of cluster, namespaced) runs one step per entry on the real node
with the gpuplace image built here and argoexec imported into the node's containerd, and each step
checks its entry with `gpuplace agent --once --print` against the node's NVML (the fake library,
mounted as the chart's agent mounts it).

A good commit: the Workflow succeeds, then the map is applied and its pods run on their GPUs. A
commit naming a GPU the node does not have: the Workflow fails on that entry, naming the device;
the sync stops before the map is applied, and the running pods keep their GPUs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pytest

from gpuplace.preflight import NVML_DIR, PreflightSettings, workflow_name
from gpuplace_dev.localargocd import LocalArgoCD
from gpuplace_dev.localargocd.apps import APPLICATIONS, REFRESH_ANNOTATION, AppState
from gpuplace_dev.localargowf import LocalArgoWorkflows, WorkflowResult
from gpuplace_dev.localcluster import LocalCluster, chart
from placement.annotations import DEVICES_ANNOTATION
from placement.validate import parse_map
from tests.integration.controllerkit import map_yaml, wait_for
from tests.integration.test_real_node import admit, wait_running

pytestmark = [pytest.mark.argocd, pytest.mark.preflight, pytest.mark.real_node]

APP = "gpuplace-maps-preflight"
#: What ArgoCD says of an Application whose AppProject its controller has not seen yet.
PROJECT_NOT_SEEN = "Application referencing project"
NS = "preflight"
MAP = "llm"
GOOD = map_yaml(NS, MAP, [(0, "localhost", [1]), (1, "localhost", [2])])
#: The real node has GPUs 0-3 (fake NVML): GPU 7 is not there.
MISSING_GPU = 7
BAD = map_yaml(NS, MAP, [(0, "localhost", [1]), (1, "localhost", [MISSING_GPU])])
KUSTOMIZATION = f"""\
# The map as its source ConfigMap, and the Workflow `gpuplace preflight maps/{MAP}.yaml` printed
# for it: a PreSync hook, so ArgoCD applies the map only after every entry was checked on its node.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - preflight/{MAP}.yaml
generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"
configMapGenerator:
  - name: {MAP}
    namespace: {NS}
    files:
      - placement.yaml=maps/{MAP}.yaml
"""


@dataclass
class GitOps:
    cluster: LocalCluster
    argocd: LocalArgoCD
    workflows: LocalArgoWorkflows
    repo: git.Repo
    directory: Path
    image: str
    nvml: Path

    def commit(self, map_text: str, message: str) -> str:
        """Writes the map and its preflight Workflow (printed by `gpuplace preflight`), commits,
        and asks ArgoCD to refresh; the commit's hash."""
        (self.directory / "maps").mkdir(exist_ok=True)
        (self.directory / "preflight").mkdir(exist_ok=True)
        map_file = self.directory / "maps" / f"{MAP}.yaml"
        map_file.write_text(map_text)
        printed = subprocess.run(
            [
                sys.executable, "-m", "gpuplace.cli", "preflight", str(map_file),
                f"--image={self.image}",
                f"--nvml-host-path={self.nvml}",
                f"--env=GPUPLACE_FAKE_NVML_CONFIG={NVML_DIR}/nvml.json",
                "--timeout=240",
            ],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        (self.directory / "preflight" / f"{MAP}.yaml").write_text(printed.stdout)
        (self.directory / "kustomization.yaml").write_text(KUSTOMIZATION)
        self.repo.git.add(A=True)
        revision = self.repo.index.commit(message).hexsha
        self.cluster.kubectl(
            "-n", "argocd", "annotate", "--overwrite", "application", APP,
            f"{REFRESH_ANNOTATION}=normal", check=False,
        )  # fmt: skip
        return revision

    def state(self) -> AppState | None:
        status, body = self.cluster.request("GET", APPLICATIONS.item(APP, "argocd"))
        return AppState.from_object(body) if status == 200 else None

    def sync_of(self, revision: str, timeout: float = 400) -> AppState:
        """Until the sync of `revision` has ended: succeeded, or failed (or failed and waiting to
        retry, should ArgoCD retry it after all). An attempt refused because the application
        controller had not yet seen the AppProject (right after ArgoCD starts) is asked for
        again once, as `argocd app sync` asks: the automated policy does not retry a revision
        whose sync failed, and what is checked here is the preflight, not ArgoCD's start."""
        refused_at: list[str] = []  # the startedAt of the attempt refused that way, once

        def ended() -> AppState | None:
            self.argocd.check_alive()
            self.workflows.check_alive()
            status, body = self.cluster.request("GET", APPLICATIONS.item(APP, "argocd"))
            if status != 200:
                return None
            state = AppState.from_object(body)
            if state.operation_revision != revision or not state.attempt_ended:
                return None
            started = str(((body.get("status") or {}).get("operationState") or {}).get("startedAt"))
            if PROJECT_NOT_SEEN in state.operation_message:
                if not refused_at:
                    refused_at.append(started)
                    self.sync_again(revision)
                    return None
                if started == refused_at[0]:
                    return None  # the attempt asked for again has not ended yet
            return state

        state: AppState = wait_for(
            lambda: f"the sync of {revision[:7]}: {self.state()}", ended, timeout=timeout
        )
        return state

    def sync_again(self, revision: str) -> None:
        """Asks ArgoCD for a sync of `revision` (the Application's `operation`, as the CLI sets it)."""
        operation = {"initiatedBy": {"username": "gpuplace-e2e"}, "sync": {"revision": revision}}
        path = APPLICATIONS.item(APP, "argocd")
        status, body = self.cluster.request("PATCH", path, {"operation": operation})
        assert status == 200, body
        print(
            f"ArgoCD's controller had not seen the AppProject yet: sync of {revision[:7]} asked again"
        )

    def placement(self) -> str | None:
        status, body = self.cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{MAP}")
        return body["data"]["placement.yaml"] if status == 200 else None

    def map_created(self) -> str:
        _, body = self.cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{MAP}")
        return str(body["metadata"]["creationTimestamp"])


def application(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APP, "namespace": "argocd"},
        "spec": {
            "project": "default",
            "source": {"repoURL": url, "targetRevision": "main", "path": "."},
            "destination": {"name": "in-cluster", "namespace": NS},
            # Automated, without retry (ArgoCD retries an automated sync 5 times by default, each
            # retry running the hook again): a failed sync of a revision stays failed.
            "syncPolicy": {"automated": {}, "retry": {"limit": 0}},
        },
    }


@pytest.fixture(scope="module")
def gitops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitOps]:
    image = chart.build_image()
    workdir = tmp_path_factory.mktemp("argocd-preflight")
    repo_dir = workdir / "repo"
    repo_dir.mkdir()
    repo = git.Repo.init(repo_dir, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "gpuplace test")
        config.set_value("user", "email", "test@gpuplace.invalid")
    cluster = LocalCluster(
        workdir / "cluster", real_nodes=1, scheduler=True, pod_network=True, policies=False
    )
    argocd = LocalArgoCD(cluster, workdir / "argocd")
    workflows = LocalArgoWorkflows(cluster, NS, workdir / "argo-workflows")
    try:
        cluster.start()
        chart.import_image(cluster, image)
        nvml = chart.nvml_directory(cluster, chart.fake_nvml(4))
        chart.install(cluster, image, nvml)
        # The steps mount the NVML directory from the host: the privileged Pod Security level,
        # as in the chart's release namespace.
        cluster.create_namespace(NS, labels={"pod-security.kubernetes.io/enforce": "privileged"})
        workflows.start()
        argocd.start()
        ops = GitOps(cluster, argocd, workflows, repo, repo_dir, image.name, nvml)
        yield ops
    finally:
        argocd.stop()
        workflows.stop()
        cluster.stop()
        shutil.rmtree(repo_dir, ignore_errors=True)


def test_a_good_map_is_applied_after_its_preflight_and_a_missing_gpu_stops_the_sync(
    gitops: GitOps,
) -> None:
    cluster, workflows = gitops.cluster, gitops.workflows
    name = workflow_name(parse_map(GOOD, "llm.yaml"), PreflightSettings())

    good = gitops.commit(GOOD, "llm: GPUs 1 and 2 on localhost")
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(application(
        f"file://{gitops.directory}"
    )))  # fmt: skip
    state = gitops.sync_of(good)
    print(state.describe())
    assert state.operation == "Succeeded", state.describe()
    passed = workflows.wait_finished(NS, name, timeout=30)
    print(f"Workflow {name}: {passed.phase} {passed.message}")
    assert passed.phase == "Succeeded", passed
    assert gitops.placement() == GOOD
    # The hook ran first: the map was created once the Workflow had finished.
    assert passed.finished_at <= gitops.map_created()

    admit(cluster, NS, f"{MAP}-0", MAP)
    admit(cluster, NS, f"{MAP}-1", MAP)
    before = {i: wait_running(cluster, NS, f"{MAP}-{i}") for i in (0, 1)}
    assert before[1]["metadata"]["annotations"][DEVICES_ANNOTATION] == chart.real_node_uuid(2)
    first_uid = _uid(workflows.workflow(NS, name))

    bad = gitops.commit(BAD, f"llm: entry 1 on GPU {MISSING_GPU}")
    state = gitops.sync_of(bad)
    print(state.describe())
    assert state.attempt_failed, state.describe()
    failed: WorkflowResult = workflows.wait_finished(NS, name, not_uid=first_uid, timeout=30)
    print(f"Workflow {name}: {failed.phase} {failed.message}; failed steps {failed.failed_steps}")
    assert failed.phase == "Failed", failed
    # Only the entry naming the missing GPU failed, and its step says which device.
    assert list(failed.failed_steps) == ["index-1"], failed.failed_steps
    assert f"device {MISSING_GPU} not found on node localhost" in failed.failed_steps["index-1"]
    # The sync stopped at the hook: the map is the good commit's, and the pods kept their GPUs.
    assert gitops.placement() == GOOD
    for i, pod in before.items():
        still = wait_running(cluster, NS, f"{MAP}-{i}")
        assert still["metadata"]["uid"] == pod["metadata"]["uid"]
        assert (
            still["metadata"]["annotations"][DEVICES_ANNOTATION]
            == pod["metadata"]["annotations"][DEVICES_ANNOTATION]
        )


def _uid(body: dict[str, Any] | None) -> str:
    assert body is not None
    return str(body["metadata"]["uid"])
