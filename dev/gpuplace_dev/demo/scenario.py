"""The demo scenario: every step prints what it does, and every claim it makes is checked."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuplace import inspect
from gpuplace_dev.demo import adopt, plan, realnode, training
from gpuplace_dev.demo.argocd import (
    APPLICATION,
    APPLICATIONSET,
    CHART_APPLICATION,
    RELEASE_NAMESPACE,
    ROOT_APPLICATION,
    ArgoCDSync,
    set_chart_value,
    write_platform,
)
from gpuplace_dev.demo.components import REPO_ROOT, Components, demo_uuid, fake_gpus
from gpuplace_dev.demo.gitops import GitOpsRepo, SyncResult, run_cli
from gpuplace_dev.localargocd import binaries as argocd_binaries
from gpuplace_dev.localargocd.binaries import ArgoCDBinariesError
from gpuplace_dev.localargocd.launcher import ArgoCDError
from gpuplace_dev.localcluster import (
    REAL_NODE_NAME,
    BinariesError,
    ClusterError,
    FakeNode,
    KubectlError,
    LocalCluster,
    chart,
    find_binaries,
)
from gpuplace_dev.localcluster.process import poll
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from kubeio.paths import CONFIGMAPS, MUTATING_WEBHOOKS, PLACEMENT_MAPS, PODS, RESOURCE_CLAIMS
from kubeio.pod import Pod
from placement.annotations import DEVICES_ANNOTATION
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.model import MODEL_LABEL, MODEL_NAMESPACE

NODES = 4
GPUS = 4
CLUSTER_DIR = "clusters/dev"
LLM_MAP = f"{CLUSTER_DIR}/maps/llm-serving.yaml"
EMBEDDINGS_MAP = f"{CLUSTER_DIR}/maps/embeddings.yaml"
PRESENT_GPU = "devices: [GPU-00000004-0000-4000-8000-000000000001]"
MISSING_GPU = "devices: [GPU-00000004-0000-4000-8000-000000000009]"
#: The pods of examples/workloads that maps place (the trainer's pods are named by their Deployment).
WORKLOAD_PODS = [
    "inference/llm-serving-0",
    "inference/llm-serving-1",
    "legacy/webhook-test-0",
    "legacy/webhook-test-1",
    "legacy/webhook-test-2",
]


#: The chart's read-only web view (controller.web), as the demo turns it on.
WEB_SERVICE = "gpuplace-controller-web"
WEB_PORT = 8090
#: The chart's controller.metricsPort (the pod proxy takes a port number).
CONTROLLER_METRICS_PORT = 8080


class DemoError(Exception):
    pass


class Demo:
    def __init__(
        self,
        keep: bool = False,
        out: Callable[[str], None] = print,
        argocd: bool = False,
        real_node: bool = True,
    ) -> None:
        self.keep = keep
        self.real_node = real_node
        self.real_nvml_config = (
            Path()
        )  # the real node's fake NVML configuration (agent and DRA driver)
        self.use_argocd = argocd
        #: gpuplace installed by ArgoCD from its chart and image, running as pods on the real node;
        #: otherwise its controller and webhook run as local processes.
        self.in_cluster = argocd and real_node
        self.argocd: ArgoCDSync | None = None
        self.out = out
        self.workdir = Path(tempfile.mkdtemp(prefix="gpuplace-demo-"))
        self.cluster: LocalCluster | None = None
        self.components: Components | None = None
        self.checks: list[str] = []
        self.started = time.monotonic()

    # -- output and checks ----------------------------------------------------------------------
    def step(self, text: str) -> None:
        self.out(f"\n==> [{time.monotonic() - self.started:5.1f}s] {text}")

    def check(self, condition: bool, claim: str) -> None:
        if not condition:
            raise DemoError(f"check failed: {claim}")
        self.checks.append(claim)
        self.out(f"    ok  {claim}")

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 90.0) -> Any:
        result = poll(probe, timeout, self._check_alive)
        if not result:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        return result

    def _check_alive(self) -> None:
        if self.components is not None:
            self.components.check_alive()

    # -- helpers --------------------------------------------------------------------------------
    @property
    def kube(self) -> Kube:
        assert self.cluster is not None
        return Kube.connect(ClientSettings(kubeconfig=str(self.cluster.kubeconfig)))

    def pods(self) -> dict[str, inspect.PodRow]:
        rows = inspect.gpuplace_pods(self.kube, ["gpuplace", "gpu-scheduler"])
        return {f"{r.namespace}/{r.name}": r for r in rows}

    def all_running(self, names: list[str]) -> dict[str, inspect.PodRow] | None:
        pods = self.pods()
        if all(n in pods and pods[n].node and pods[n].phase == "Running" for n in names):
            return pods
        return None

    # -- the scenario ---------------------------------------------------------------------------
    def run(self) -> None:
        self._start_cluster()
        self._start_agents()
        repo = GitOpsRepo(self.workdir / "gitops", REPO_ROOT / "examples" / "gitops")
        if self.in_cluster:
            commit = self._install_step(repo)
        else:
            self._start_components()
            commit = self._commit_maps(repo)
        self._maps_step(repo, commit)
        self._workloads_step()
        if self.real_node:
            self._real_node_step(repo)
        moved = self._move_step(repo, commit)
        adopt.Step(
            self,
            repo,
            CLUSTER_DIR,
            lambda rev: self._sync(repo, rev),
            self._wait_map_valid,
            scheduler_running=self.in_cluster,
        ).run()
        self._broken_map_step(repo)
        if self.argocd is not None:
            self._degraded_step(repo)
            self._resource_form_step(repo)
        self._operator_step(moved)
        if self.argocd is None:  # the degraded step fixes the typo under ArgoCD
            repo.edit(LLM_MAP, "      devices: [2, 2]", "      devices: [2, 3]")
        training.run(
            self, repo, CLUSTER_DIR, lambda rev: self._sync(repo, rev), self._wait_map_valid
        )
        if self.real_node:
            self._dra_step(repo)
        self._grid_step()
        self.step(f"All {len(self.checks)} checks passed")

    def _start_cluster(self) -> None:
        self.step("Local control plane: building the binaries if missing (cached after that)")
        binaries = find_binaries()
        self.out(f"    binaries in {binaries.bin_dir}")
        if self.real_node:
            self.out(
                "    and the real node's containerd, runc, CNI plugins and kubelet "
                "(hack/build-node.sh)"
            )
        labels = {"gpu-node-name": realnode.REAL_NODE_ALIAS}
        if self.in_cluster:  # the chart's agent runs on GPU nodes
            key, _, value = chart.GPU_NODE_LABEL.partition("=")
            labels[key] = value
        self.cluster = LocalCluster(
            self.workdir / "cluster",
            detach=self.keep,
            real_nodes=1 if self.real_node else 0,
            real_node_labels=labels,
            # gpuplace's own pods: kube-scheduler places them, they reach the apiserver through the
            # `kubernetes` Service and the apiserver reaches the webhook through its Service; the
            # chart brings its admission policies.
            scheduler=self.in_cluster,
            pod_network=self.in_cluster,
            policies=not self.in_cluster,
        )
        self.cluster.start()
        self.out(
            f"    kube-apiserver {self.cluster.server} up in {self.cluster.startup_seconds:.1f}s"
        )
        if self.real_node:
            phases = self.cluster.startup_phases
            self.out(
                f"    real node {REAL_NODE_NAME} (containerd, kubelet) Ready "
                f"{phases['real node Ready'] - phases['controller-manager ready']:.1f}s after "
                "the control plane"
            )
        # The kwok nodes' agents publish into the inventory namespace before gpuplace is installed;
        # the chart's Application creates the release namespace with its Pod Security label.
        namespaces = (
            [INVENTORY_NAMESPACE] if self.in_cluster else [MODEL_NAMESPACE, INVENTORY_NAMESPACE]
        )
        for ns in namespaces:
            self.cluster.create_namespace(ns)

    def _start_agents(self) -> None:
        assert self.cluster is not None
        self.step(f"{NODES} fake GPU nodes (kwok), {GPUS} GPUs each, one NVML agent per node")
        names = [f"gpu-node-{i}" for i in range(1, NODES + 1)]
        self.cluster.create_nodes(
            [
                FakeNode(n, gpus=GPUS, labels={"gpu-node-name": f"node{i}"})
                for i, n in enumerate(names, start=1)
            ]
        )
        self.components = Components(self.cluster, self.workdir)
        for name in names:
            self.components.agent(name, GPUS)
        inventories = NODES
        if self.in_cluster:
            directory = chart.nvml_directory(
                self.cluster, fake_gpus(REAL_NODE_NAME, GPUS, realnode.REAL_NODE_NUMBER)
            )
            self.real_nvml_config = directory / "nvml.json"
            self.out(
                f"    the real node {REAL_NODE_NAME}'s agent is the chart's DaemonSet (below), on "
                f"{GPUS} fake GPUs: {directory} is its agent.nvml.hostPath"
            )
        elif self.real_node:
            self.out(f"    and an agent for the real node {REAL_NODE_NAME}, {GPUS} fake GPUs")
            self.real_nvml_config = self.components.agent(
                REAL_NODE_NAME, GPUS, number=realnode.REAL_NODE_NUMBER
            )
            inventories += 1
        self.wait(f"{inventories} inventories", lambda: self._inventories() == inventories)
        self.check(True, "every agent published its inventory")

    def _start_components(self) -> None:
        assert self.components is not None
        self.step("Controller (leader-elected binder) and webhook (HTTPS, registered)")
        self.components.controller()
        self.components.webhook()
        self.wait("webhook registration", self._webhook_registered)
        self.check(True, "webhook configurations registered with the apiserver")

    def _commit_maps(self, repo: GitOpsRepo) -> str:
        """Commits the example maps (and, through ArgoCD, applies the ApplicationSet)."""
        if self.use_argocd:
            self._start_argocd(repo)
            self.step("Commit the placement maps; ArgoCD's ApplicationSet generates and syncs them")
        else:
            self.step(
                "A GitOps repository with the placement maps: commit and sync (as ArgoCD would)"
            )
        commit = repo.commit("Placement maps for the dev cluster")
        self.out(f"    committed {commit}")
        if self.argocd is not None:
            self.argocd.install("clusters", skip=("prod",))
            self.out(
                f"    kubectl apply: AppProject gpuplace and ApplicationSet {APPLICATIONSET} "
                f"(argocd/, repoURL file://{repo.path}, cluster directories clusters/*, prod excluded)"
            )
        return commit

    def _install_step(self, repo: GitOpsRepo) -> str:
        """gpuplace installed as a platform team installs it: its image, and its chart synced by
        ArgoCD from git before any map; returns the commit that holds chart, Applications and maps."""
        assert self.cluster is not None
        self.step(
            "The gpuplace image: make image (hack/build-image.sh, buildah; built again only when "
            "its sources change)"
        )
        image = chart.build_image()
        chart.import_image(self.cluster, image)
        self.out(
            f"    {image.name}  digest {image.digest}\n"
            f"    imported into {REAL_NODE_NAME}'s containerd (ctr -n k8s.io images import)"
        )
        self._start_argocd(repo)
        assert self.argocd is not None
        self.step(
            "Commit gpuplace itself (charts/gpuplace, argocd/) with the placement maps; ArgoCD's "
            "app of apps syncs the chart first (sync wave -10), then the maps (wave 0)"
        )
        values = chart.local_values(image, self.real_nvml_config.parent)
        values["controller"]["web"] = {"enabled": True, "port": WEB_PORT, "authenticate": False}
        write_platform(repo.path, values, "clusters", skip=("prod",))
        commit = repo.commit("gpuplace for the dev cluster: its chart, its Applications, the maps")
        self.out(
            f"    committed {commit}: charts/gpuplace; argocd/ with AppProject gpuplace, "
            f"Application {CHART_APPLICATION} (image {image.name}, pullPolicy Never) and "
            f"ApplicationSet {APPLICATIONSET}; clusters/dev"
        )
        self.argocd.bootstrap(repo.path)
        self.out(
            f"    kubectl apply -f argocd/root.yaml  (Application {ROOT_APPLICATION}: the only "
            "object applied by hand)"
        )
        early: list[str] = []

        def chart_healthy() -> Any:
            assert self.argocd is not None
            maps_first = self.argocd.applicationset() is not None
            state = self.argocd.state(CHART_APPLICATION)
            healthy = (
                state is not None
                and state.sync == "Synced"
                and state.revision.startswith(commit)
                and state.health == "Healthy"
            )
            if maps_first and not healthy:
                early.append(state.line() if state else f"no Application {CHART_APPLICATION}")
            return healthy and state

        state = self.argocd.wait(
            f"Application {CHART_APPLICATION} Synced and Healthy",
            chart_healthy,
            300,
            CHART_APPLICATION,
        )
        self.out(f"    {state.line()}")
        self.check(
            not early,
            f"the ApplicationSet {APPLICATIONSET} (wave 0) was applied only once Application "
            f"{CHART_APPLICATION} (wave -10) was Healthy",
        )
        pods = chart.wait_ready(self.cluster)
        self.out(_indent(_component_table(pods)))
        components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
        self.check(
            components == ["agent", "controller", "controller", "webhook", "webhook"],
            "controller (2 replicas), webhook (2 replicas) and the agent DaemonSet are Ready",
        )
        self.check(
            all(
                p["spec"].get("nodeName") == REAL_NODE_NAME
                and all(c.get("imageID") == image.id for c in p["status"]["containerStatuses"])
                for p in pods
            ),
            f"every one runs on {REAL_NODE_NAME} from the image built here ({image.id[:19]})",
        )
        self.wait(
            f"the agent pod's inventory of {REAL_NODE_NAME}",
            lambda: self._inventories() == NODES + 1,
        )
        self.check(True, f"the agent pod published {REAL_NODE_NAME}'s inventory (fake NVML)")
        return commit

    def _maps_step(self, repo: GitOpsRepo, commit: str) -> None:
        """Syncs `commit`'s maps and checks the controller validated every one."""
        if self.in_cluster:
            self.step(f"The ApplicationSet generates Application {APPLICATION}; it syncs the maps")
        if self.argocd is not None:
            self.argocd.wait(
                f"the ApplicationSet to generate {APPLICATION}", self.argocd.application
            )
            self.check(True, f"the ApplicationSet generated Application {APPLICATION}")
        result = self._sync(repo, commit)
        self.check(result.ok, f"sync of {commit} applied: {result.output.strip().splitlines()[-1]}")
        statuses = self.wait(
            "a status on every map",
            lambda: (
                (s := inspect.map_statuses(self.kube)) and all(st is not None for _, st in s) and s
            ),
        )
        self.out(inspect.map_table(statuses))
        self.check(
            all(st is not None and st.phase.value == "Valid" for _, st in statuses),
            "every map is Valid",
        )
        if self.argocd is not None:
            self.argocd.settled(commit, "Healthy")
            self.check(
                True, f"{APPLICATION} is Synced and Healthy (the Lua check reads every map Valid)"
            )

    def _workloads_step(self) -> None:
        assert self.cluster is not None
        self.step("Workloads: a StatefulSet, a Deployment and the earlier tools' legacy pods")
        for manifest in sorted((REPO_ROOT / "examples" / "workloads").glob("*.yaml")):
            self.cluster.kubectl("apply", "-f", str(manifest))
            self.out(f"    kubectl apply -f examples/workloads/{manifest.name}")
        pods = self.wait(
            "every pod bound and Running",
            lambda: self._trainer_running() and self.all_running(WORKLOAD_PODS),
        )
        self.out(inspect.pod_table(pods.values()))
        self._check_declared(pods)

    def _move_step(self, repo: GitOpsRepo, commit: str) -> str:
        """Move one slot in git and recreate its pod; returns the commit that moved it."""
        assert self.cluster is not None
        self.step("Plan, then commit, a change that moves llm-serving index 1 to gpu-node-4, GPU 2")
        repo.edit(
            LLM_MAP,
            "      node: gpu-node-2\n      devices: [0, 1]",
            "      node: gpu-node-4\n      devices: [2]",
        )
        predicted = self._plan_move(repo)
        before = {k: (p.node, p.devices) for k, p in self.pods().items()}
        moved = repo.commit("Move llm-serving index 1 to gpu-node-4")
        diff = run_cli(
            "diff", f"{commit}", f"{moved}", f"--repo={repo.path}", f"--path={CLUSTER_DIR}"
        )
        self.out("    $ gpuplace diff " + f"{commit} {moved}\n" + _indent(diff.stdout))
        self.check(
            diff.returncode in (0, 1) and "gpu-node-4" in diff.stdout,
            "gpuplace diff shows the moved slot",
        )
        result = self._sync(repo, moved)
        self.check(result.ok, f"sync of {moved} applied")
        self.wait("the model to move the slot", self._model_has_move)
        drifted = self.wait("the controller to mark the moved slot's pod Drifted", self._drifted)
        self.check(
            drifted == predicted,
            f"the controller marks Drifted exactly the pods the plan named: {_names(drifted)}",
        )
        for key in sorted(drifted):  # rollout: manual, the default: an operator replaces them
            namespace, name = key.split("/")
            self.cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
            self.out(
                f"    kubectl -n {namespace} delete pod {name}  (Drifted; the StatefulSet "
                "recreates it)"
            )
        pods = self.wait(
            "llm-serving-1 re-placed",
            lambda: (
                (p := self.all_running(WORKLOAD_PODS))
                and p["inference/llm-serving-1"].node == "gpu-node-4"
                and p
            ),
        )
        self.out(inspect.pod_table(pods.values()))
        self.check(
            pods["inference/llm-serving-1"].devices == demo_uuid(4, 2)
            and pods["inference/llm-serving-1"].cuda_visible_devices == "2",
            "llm-serving-1 now runs on gpu-node-4 with CUDA_VISIBLE_DEVICES=2",
        )
        after = {k: (p.node, p.devices) for k, p in self.pods().items()}
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        self.check(
            changed == predicted,
            f"exactly the pods the plan predicted moved ({_names(changed)}), none of the other "
            f"{len(before.keys() - predicted)} placed pods",
        )
        return moved

    def _plan_move(self, repo: GitOpsRepo) -> set[str]:
        """The plan of the move before it is committed, as a pull request's check shows it,
        reading the cluster with the read-only identity; returns the pods it says would move."""
        assert self.cluster is not None
        kubeconfig = plan.read_only_identity(
            self.cluster, self.kube, self.workdir, chart_installed=self.in_cluster
        )
        role = "the installed chart's" if self.in_cluster else "charts/gpuplace's, helm template"
        self.out(
            f"    ServiceAccount {plan.NAMESPACE}/{plan.ACCOUNT} bound to ClusterRole {plan.ROLE} "
            f"({role}: get and list only); its token in {kubeconfig}"
        )
        run = plan.run(
            repo.path,
            self.workdir,
            f"--kubeconfig={kubeconfig}",
            f"--context=dev={plan.CONTEXT}",
            "--format=markdown",
        )
        self.out(f"    $ {run.command}\n" + _indent(run.output.rstrip()))
        self.check(
            run.returncode == 2 and run.report.get("valid") is True,
            "gpuplace plan exits 2 (--detailed-exitcode: the change does something, no errors)",
        )
        predicted = run.moving
        self.check(
            run.read_live
            and not run.live_errors
            and predicted == run.drifting == {"inference/llm-serving-1"}
            and "1 pod would move" in run.output
            and not run.waiting,
            f"read with that identity, the plan says 1 pod would move ({_names(predicted)}) "
            "and no slot would wait",
        )
        self.check(
            "_1 unchanged cluster not shown._" in run.output and "<b>prod</b>" not in run.output,
            "the unchanged cluster prod is counted, not shown",
        )
        return predicted

    def _broken_map_step(self, repo: GitOpsRepo) -> None:
        self.step(
            "Plan, then commit, a broken map: both name its line and column; the sync is refused"
        )
        before = self.pods()
        repo.edit(LLM_MAP, "      devices: [2, 3]", "      devices: [2, 2]")
        line, column = plan.position((repo.path / LLM_MAP).read_text(), "[2, 2]")
        column += 4  # the second 2
        run = plan.run(repo.path, self.workdir)
        self.out(f"    $ {run.command}\n" + _indent(run.output.rstrip()))
        where = f"{LLM_MAP}:{line}:{column}"
        self.check(
            run.returncode == 1
            and f"{where}: error:" in run.output
            and "listed twice" in run.output
            and (LLM_MAP, line, column) in run.sarif_locations(),
            f"before the commit, gpuplace plan exits 1 with the error at {where} (text and SARIF)",
        )
        broken = repo.commit("A typo: device 2 twice")
        result = self._sync(repo, broken, rejected=True)
        self.out(_indent(result.output.strip()))
        self.check(not result.ok, f"sync of {broken} was rejected by the validating webhook")
        self.check(
            f"placement.yaml:{line}:{column}:" in result.output and "listed twice" in result.output,
            f"the rejection names file, line and column ({line}:{column}, as the plan did)",
        )
        if self.argocd is not None:
            state = self.argocd.state()
            self.check(
                state is not None
                and state.sync == "OutOfSync"
                and state.attempt_failed
                and "listed twice" in state.operation_message,
                f"{APPLICATION} shows the failed sync and the webhook's message (OutOfSync)",
            )
        after = self.pods()
        self.check(
            all(
                after[k].node == v.node and after[k].devices == v.devices for k, v in before.items()
            ),
            "the running placement is unchanged",
        )
        statuses = inspect.map_statuses(self.kube)
        self.check(
            dict(statuses)["inference/llm-serving"] is not None
            and dict(statuses)["inference/llm-serving"].phase.value == "Valid",  # type: ignore[union-attr]
            "llm-serving still serves its last valid version",
        )

    def _operator_step(self, moved: str) -> None:
        """`gpuplace status` and `gpuplace explain` after the move to commit `moved`."""
        assert self.cluster is not None
        self.step("What an operator sees: gpuplace status and gpuplace explain")
        kubeconfig = f"--kubeconfig={self.cluster.kubeconfig}"
        status = run_cli("status", kubeconfig)
        self.out(_indent(status.stdout))
        self.check(
            status.returncode == 0
            and "inference/llm-serving" in status.stdout
            and "gpu-node-4" in status.stdout,
            "gpuplace status lists maps and placed pods",
        )
        explained = run_cli("explain", "inference/llm-serving-1", kubeconfig)
        self.out(_indent(explained.stdout))
        self.check(
            explained.returncode == 0
            and "bound to node gpu-node-4" in explained.stdout
            and "CUDA_VISIBLE_DEVICES in the container: 2" in explained.stdout,
            "gpuplace explain says where llm-serving-1 is and why",
        )
        self.check(
            f"placed by: revision {moved}" in explained.stdout
            and "llm-serving.yaml" in explained.stdout,
            f"gpuplace explain names the synced commit {moved} and the map's file",
        )

    def _grid_step(self) -> None:
        """`gpuplace gpus`: the node x GPU grid, checked against the inventories and the pods."""
        assert self.cluster is not None
        self.step("Who holds which GPU: gpuplace gpus")
        kubeconfig = f"--kubeconfig={self.cluster.kubeconfig}"
        self.out(_indent(run_cli("gpus", kubeconfig).stdout))
        shown = run_cli("gpus", "-o", "json", kubeconfig)
        cells = json.loads(shown.stdout)["gpus"] if shown.returncode == 0 else []
        configmaps = self.kube.get(CONFIGMAPS.collection(INVENTORY_NAMESPACE))["items"]
        inventories = [
            NodeInventory.from_json(cm["data"][INVENTORY_KEY])
            for cm in configmaps
            if INVENTORY_KEY in (cm.get("data") or {})
        ]
        self.check(
            all(
                sorted(c["index"] for c in cells if c["node"] == inv.node)
                == sorted(d.index for d in inv.devices)
                for inv in inventories
            )
            and bool(inventories),
            f"the grid shows every GPU of the {len(inventories)} nodes with an inventory",
        )
        held = {(h["namespace"], h["pod"], c["uuid"]) for c in cells for h in c["holders"]}
        declared: set[tuple[str, str, str]] = set()
        for obj in self.kube.get(PODS.collection())["items"]:
            pod = Pod.of(obj)
            devices = pod.annotations.get(DEVICES_ANNOTATION, "")
            if pod.bound and not pod.finished and devices:
                declared |= {(pod.namespace, pod.name, u) for u in devices.split(",")}
        self.check(
            bool(declared) and declared <= held,
            f"it names the holder of each of the {len(declared)} GPUs the pods' bindings declare",
        )
        cached = self._slot_cache_holders()
        self.check(
            cached == held,
            f"it agrees with the leader's slot cache ({len(cached)} held GPUs in "
            "gpuplace_gpu_holder)",
        )
        self._web_view_step()

    def _slot_cache_holders(self) -> set[tuple[str, str, str]]:
        """(namespace, pod, UUID) of every gpuplace_gpu_holder series: the leader's slot cache."""
        assert self.cluster is not None
        texts: list[str] = []
        if self.in_cluster:
            pods = self.kube.get(
                PODS.collection(RELEASE_NAMESPACE),
                labelSelector="app.kubernetes.io/component=controller",
            )["items"]
            for pod in pods:  # every replica: only the leader's cache holds anything
                name = pod["metadata"]["name"]
                port = CONTROLLER_METRICS_PORT
                path = f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{name}:{port}/proxy/metrics"
                texts.append(self.cluster.kubectl("get", "--raw", path, check=False).stdout)
        else:
            assert self.components is not None
            url = f"http://127.0.0.1:{self.components.metrics_ports['controller']}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                texts.append(response.read().decode())
        out: set[tuple[str, str, str]] = set()
        for text in texts:
            for line in text.splitlines():
                if line.startswith("gpuplace_gpu_holder{"):
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                    out.add((labels["namespace"], labels["pod"], labels["UUID"]))
        return out

    def _web_view_step(self) -> None:
        """Where the controller's read-only web view is, and that it serves the grid."""
        assert self.cluster is not None
        kubeconfig = f"--kubeconfig={self.cluster.kubeconfig}"
        if self.in_cluster:
            # Without `authenticate` the web view listens on the pod's loopback only: reached
            # through `kubectl port-forward` (apiserver -> kubelet -> the pod's network namespace).
            page = self._port_forward_get(f"svc/{WEB_SERVICE}", WEB_PORT)
            where = (
                f"kubectl {kubeconfig} -n {RELEASE_NAMESPACE} port-forward svc/{WEB_SERVICE} "
                f"{WEB_PORT}, then http://localhost:{WEB_PORT}/"
            )
        else:
            assert self.components is not None
            url = f"http://127.0.0.1:{self.components.web_ports['controller']}/"
            with urllib.request.urlopen(url, timeout=10) as response:
                page = response.read().decode()
            where = url
        self.out(f"    the web view (read-only, every controller replica): {where}")
        self.check(
            'id="grid"' in page and "Who holds which GPU" in page,
            "the controller's web view serves the grid",
        )

    def _port_forward_get(self, target: str, port: int) -> str:
        """GET / on `port` of `target` in the release namespace through kubectl port-forward;
        an empty page when the forward does not come up."""
        assert self.cluster is not None
        argv = [
            str(self.cluster.binaries.kubectl),
            f"--kubeconfig={self.cluster.kubeconfig}",
            "-n",
            RELEASE_NAMESPACE,
            "port-forward",
            target,
            f":{port}",
        ]
        env = {
            "KUBECACHEDIR": str(self.cluster.layout.kubectl_cache),
            "HOME": str(self.cluster.directory),
        }
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        ) as forward:
            try:
                assert forward.stdout is not None
                line = forward.stdout.readline()
                match = re.search(rf"127\.0\.0\.1:(\d+) -> {port}", line)
                if match is None:
                    self.out(f"    kubectl port-forward said: {line.strip()}")
                    return ""
                url = f"http://127.0.0.1:{match.group(1)}/"
                with urllib.request.urlopen(url, timeout=10) as response:
                    return str(response.read().decode())
            finally:
                forward.terminate()
                forward.wait(10)

    def _sync(self, repo: GitOpsRepo, revision: str, *, rejected: bool = False) -> SyncResult:
        if self.argocd is not None:
            return self.argocd.sync(revision, rejected=rejected)
        assert self.cluster is not None
        return repo.sync(self.cluster, CLUSTER_DIR)

    def _start_argocd(self, repo: GitOpsRepo) -> None:
        assert self.cluster is not None and self.components is not None
        self.step(
            "ArgoCD out of cluster: application-controller, repo-server and "
            "applicationset-controller, Redis on loopback"
        )
        binaries = argocd_binaries.find_argocd()
        self.out(f"    ArgoCD {binaries.version} binaries in {binaries.bin_dir}")
        self.argocd = ArgoCDSync(
            self.cluster, self.workdir / "argocd", repo.path, self.out, self.components.check_alive
        )
        self.argocd.start()
        self.check(True, "ArgoCD components running, destination cluster dev registered")

    def _degraded_step(self, repo: GitOpsRepo) -> None:
        """A map naming a GPU that no agent reports: the sync succeeds, the controller marks the
        map Degraded, and ArgoCD's health (the Lua check) shows it."""
        assert self.argocd is not None
        self.step("Commit a fix and a map naming a GPU that does not exist: health turns Degraded")
        repo.edit(LLM_MAP, "      devices: [2, 2]", "      devices: [2, 3]")
        repo.edit(EMBEDDINGS_MAP, PRESENT_GPU, MISSING_GPU)
        missing = repo.commit("Fix the typo; embeddings index 1 on a GPU gpu-node-4 does not have")
        recorder = self.argocd.record()
        result = self._sync(repo, missing)
        self.check(result.ok, f"sync of {missing} applied (the map is well-formed)")
        state = self.argocd.settled(missing, "Degraded")
        seen = [s for s in recorder.stop() if s[0].startswith(missing) and s[1] == "Synced"]
        self.out(f"    {APPLICATION} at {missing}: " + " -> ".join(_runs(h for _, _, h in seen)))
        self.check(
            bool(seen) and "Healthy" not in {h for _, _, h in seen},
            f"{APPLICATION} never showed Healthy at {missing} before the controller validated it",
        )
        self.out(_indent("\n".join(f"{k} {n}: {h}" for k, n, _, h in state.resources if h)))
        self.check(
            state.resource_health("ConfigMap", "inference/embeddings") == "Degraded"
            and state.resource_health("ConfigMap", "inference/llm-serving") == "Healthy",
            "the Lua health check marks inference/embeddings Degraded, the other maps Healthy",
        )
        statuses = dict(inspect.map_statuses(self.kube))
        embeddings = statuses["inference/embeddings"]
        self.check(
            embeddings is not None
            and embeddings.phase.value == "Degraded"
            and "GPU-00000004-0000-4000-8000-000000000009" in embeddings.message,
            "the map's status names the missing GPU",
        )

    def _resource_form_step(self, repo: GitOpsRepo) -> None:
        """`gpuplace migrate`: the maps become PlacementMap custom resources through ArgoCD, with
        no pod rebound and none drifted; a bad custom resource fails the sync with its field."""
        assert self.argocd is not None and self.cluster is not None
        self.step(
            "Commit the maps as PlacementMap custom resources (gpuplace migrate): no pod moves"
        )
        before = {k: (p.node, p.devices) for k, p in self.pods().items()}
        uids = self._pod_uids()
        configmaps = set(self._map_configmaps())
        # ArgoCD waits for a wave's health before the next one (PruneLast puts the pruning of
        # the ConfigMaps after the maps): a Degraded map would fail the migration's sync, and so
        # would a content change in the same commit (a custom resource that differs from its
        # ConfigMap is a Conflict). So the map is fixed first, and the migration changes no map.
        repo.edit(EMBEDDINGS_MAP, MISSING_GPU, PRESENT_GPU)
        fixed = repo.commit("Fix embeddings before the migration")
        self.check(self._sync(repo, fixed).ok, f"sync of {fixed} applied")
        self.argocd.settled(fixed, "Healthy")
        migrated = run_cli("migrate", str(repo.path / CLUSTER_DIR))
        self.out(f"    $ gpuplace migrate {CLUSTER_DIR}\n" + _indent(migrated.stdout))
        self.check(migrated.returncode == 0, f"gpuplace migrate rewrote {CLUSTER_DIR}")
        commit = repo.commit("Serve the dev maps as PlacementMap custom resources")
        result = self._sync(repo, commit)
        self.check(result.ok, f"sync of {commit} applied")
        self.argocd.settled(commit, "Healthy")
        self.wait("the map ConfigMaps pruned", lambda: not self._map_configmaps())
        table = self.cluster.kubectl("get", "placementmaps", "-A").stdout
        self.out(_indent(table.rstrip()))
        resources = self._placement_maps()
        names = {f"{r['metadata']['namespace']}/{r['metadata']['name']}" for r in resources}
        self.check(
            names == configmaps
            and all(
                (r.get("status") or {}).get("observedGeneration") == r["metadata"]["generation"]
                for r in resources
            ),
            f"each of the {len(configmaps)} maps is a PlacementMap the controller has read "
            "(observedGeneration current), and its ConfigMap is gone",
        )
        after = {k: (p.node, p.devices) for k, p in self.pods().items()}
        self.check(
            after == before and self._pod_uids() == uids,
            "no pod was rebound: same pods, nodes and GPUs",
        )
        self.check(
            all((r.get("status") or {}).get("slots", {}).get("drifted") == 0 for r in resources),
            "no pod drifted",
        )
        self.step("Commit a PlacementMap with a semantic error, then one with an unknown field")
        repo.edit(LLM_MAP, "      devices: [2, 3]", "      devices: [2, 2]")
        broken = repo.commit("A typo in the custom resource: device 2 twice")
        result = self._sync(repo, broken, rejected=True)
        self.out(_indent(result.output.strip()))
        self.check(
            not result.ok
            and "placementmap inference/llm-serving" in result.output
            and "spec.placements[" in result.output
            and "listed twice" in result.output,
            "the webhook refused the sync, naming the object and the field path",
        )
        repo.edit(LLM_MAP, "      devices: [2, 2]", "      devices: [2, 3]\n      colour: blue")
        unknown = repo.commit("An unknown field in the custom resource")
        result = self._sync(repo, unknown, rejected=True)
        self.out(_indent(result.output.strip()))
        self.check(
            not result.ok and "colour" in result.output,
            "the apiserver refused the unknown field (server-side apply against the schema)",
        )
        repo.edit(LLM_MAP, "      devices: [2, 3]\n      colour: blue", "      devices: [2, 3]")
        repo.edit(EMBEDDINGS_MAP, PRESENT_GPU, MISSING_GPU)
        fixed = repo.commit("Fix the custom resource; embeddings index 1 on a missing GPU again")
        self.check(self._sync(repo, fixed).ok, f"sync of {fixed} applied")
        state = self.argocd.settled(fixed, "Degraded")
        self.check(
            state.resource_health("PlacementMap", "inference/embeddings") == "Degraded"
            and state.resource_health("PlacementMap", "inference/llm-serving") == "Healthy",
            "the PlacementMap health check reads the conditions: embeddings Degraded, "
            "llm-serving Healthy",
        )
        after = {k: (p.node, p.devices) for k, p in self.pods().items()}
        self.check(after == before, "the running placement is unchanged")

    def _pod_uids(self) -> dict[str, str]:
        uids = {}
        for namespace in {key.split("/")[0] for key in self.pods()}:
            for pod in self.kube.get(PODS.collection(namespace)).get("items", []):
                uids[f"{namespace}/{pod['metadata']['name']}"] = pod["metadata"]["uid"]
        return uids

    def _map_configmaps(self) -> list[str]:
        body = self.kube.get(
            CONFIGMAPS.collection(), labelSelector="gpuplace.io/placement-map=true"
        )
        return [
            f"{o['metadata']['namespace']}/{o['metadata']['name']}"
            for o in body.get("items", [])
            if o["metadata"]["name"] != realnode.DRA_MAP_NAME
        ]

    def _placement_maps(self) -> list[dict[str, Any]]:
        return list(self.kube.get(PLACEMENT_MAPS.collection()).get("items", []))

    def _real_node_step(self, repo: GitOpsRepo) -> None:
        """A map for gpu-probe pods on the real node, through git like the others; what each
        container printed (its log) next to the table."""
        assert self.cluster is not None
        self.step(
            f"The real node {REAL_NODE_NAME}: commit a map for gpu-probe pods; their containers "
            "print what they got"
        )
        (repo.path / CLUSTER_DIR / realnode.MAP_FILE).write_text(realnode.MAP_YAML)
        repo.edit(
            f"{CLUSTER_DIR}/kustomization.yaml",
            "configMapGenerator:\n",
            "configMapGenerator:\n" + realnode.KUSTOMIZE_ENTRY,
        )
        commit = repo.commit("gpu-probe pods on the real node")
        self.out(f"    committed {commit}: {CLUSTER_DIR}/{realnode.MAP_FILE}")
        result = self._sync(repo, commit)
        self.check(result.ok, f"sync of {commit} applied")
        self._wait_map_valid(f"{realnode.NAMESPACE}/{realnode.MAP_NAME}")
        self.cluster.kubectl("apply", "-f", "-", input=realnode.STATEFULSET_YAML)
        self.out(
            f"    kubectl apply: StatefulSet {realnode.NAMESPACE}/gpu-probe "
            "(2 replicas, image gpuplace.local/gpu-probe:dev)"
        )
        names = [f"{realnode.NAMESPACE}/{name}" for name in realnode.DECLARED]
        pods = self.wait(
            "the gpu-probe pods Running on the real node",
            lambda: self.all_running(names),
            timeout=120,
        )
        self.out(inspect.pod_table([pods[n] for n in names]))
        self._check_probe_logs(pods)
        self._check_probe_exec_env()

    def _check_probe_logs(self, pods: dict[str, inspect.PodRow]) -> None:
        """Each gpu-probe container printed the devices its map entry declares."""
        for name, declared in realnode.DECLARED.items():
            log = self._probe_log(name)
            self.out(f"    $ kubectl -n {realnode.NAMESPACE} logs {name}\n" + _indent(log.strip()))
            seen = realnode.printed(log)
            row = pods[f"{realnode.NAMESPACE}/{name}"]
            self.check(
                row.node == REAL_NODE_NAME
                and seen.get("CUDA_VISIBLE_DEVICES") == declared == row.cuda_visible_devices
                and seen.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID",
                f"{realnode.NAMESPACE}/{name}'s container printed "
                f"CUDA_VISIBLE_DEVICES={declared} and CUDA_DEVICE_ORDER=PCI_BUS_ID",
            )

    def _check_probe_exec_env(self) -> None:
        assert self.cluster is not None
        env = self.cluster.kubectl(
            "-n", realnode.NAMESPACE, "exec", "gpu-probe-0", "--", "env"
        ).stdout.splitlines()
        cuda = [line for line in env if line.startswith(("CUDA_", "NVIDIA_"))]
        self.out(
            f"    $ kubectl -n {realnode.NAMESPACE} exec gpu-probe-0 -- env | grep CUDA\n"
            + _indent("\n".join(cuda))
        )
        self.check(
            "CUDA_VISIBLE_DEVICES=0,1" in cuda and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in cuda,
            "kubectl exec sees the same environment in the running container",
        )

    def _dra_step(self, repo: GitOpsRepo) -> None:
        """dra enforcement: the controller and the webhook restarted with --enforcement=dra, the
        fake GPU DRA driver on the real node, one map; the pod's claim, its allocation, and what
        the container saw."""
        assert self.cluster is not None
        self.step(
            "dra enforcement: the binder allocates the pod's ResourceClaim, the kubelet has the "
            "DRA driver prepare exactly those GPUs"
        )
        if self.in_cluster:
            self._commit_dra(repo)
        else:
            self._restart_for_dra()
        self._create_dra_map()
        self.wait("the webhook in dra enforcement", self._webhook_adds_claims)
        self.cluster.kubectl("apply", "-f", "-", input=realnode.DRA_POD_YAML)
        pod_name = f"{realnode.DRA_MAP_NAME}-0"
        names = [f"{realnode.NAMESPACE}/{pod_name}"]
        pods = self.wait("the pod Running on the real node", lambda: self.all_running(names), 120)
        self.out(inspect.pod_table([pods[n] for n in names]))
        self._check_dra_claim(pod_name)
        uuid = demo_uuid(realnode.REAL_NODE_NUMBER, realnode.DRA_DEVICE)
        log = self._probe_log(pod_name)
        self.out(f"    $ kubectl -n {realnode.NAMESPACE} logs {pod_name}\n" + _indent(log.strip()))
        seen = realnode.printed(log)
        self.check(
            seen.get("NVIDIA_VISIBLE_DEVICES") == uuid == seen.get("CUDA_VISIBLE_DEVICES"),
            f"the container saw only GPU {uuid} (from the DRA driver's CDI edits and the binding)",
        )

    def _commit_dra(self, repo: GitOpsRepo) -> None:
        """The chart's value global.enforcement.mode=dra, committed: the app of apps updates the
        chart's Application, ArgoCD rolls the controller and the webhook over to it."""
        assert self.components is not None and self.argocd is not None and self.cluster is not None
        self.components.dra_driver(self.real_nvml_config)
        self.out(
            f"    started hack/dra-driver on {REAL_NODE_NAME} (its ResourceSlice: the node's fake "
            "NVML GPUs)"
        )
        set_chart_value(repo.path, ("global", "enforcement", "mode"), "dra")
        commit = repo.commit("gpuplace: dra enforcement")
        self.out(
            f"    committed {commit}: argocd/application-gpuplace.yaml sets "
            "global.enforcement.mode: dra"
        )
        self.argocd.refresh(ROOT_APPLICATION)

        def takes_values() -> bool:
            assert self.argocd is not None
            app = self.argocd.application(CHART_APPLICATION) or {}
            values = app.get("spec", {}).get("source", {}).get("helm", {}).get("valuesObject", {})
            return bool(values.get("global", {}).get("enforcement", {}).get("mode") == "dra")

        self.argocd.wait(f"{ROOT_APPLICATION} to update {CHART_APPLICATION}", takes_values)
        self.argocd.refresh(CHART_APPLICATION)
        self.argocd.settled(commit, "Healthy", CHART_APPLICATION, timeout=300)
        pods = chart.wait_ready(self.cluster)
        self.out(_indent(_component_table(pods)))
        self.check(
            all(
                "--enforcement=dra" in p["spec"]["containers"][0].get("args", [])
                for p in pods
                if p["metadata"]["labels"]["app.kubernetes.io/component"]
                in ("controller", "webhook")
            ),
            "ArgoCD rolled the controller and the webhook over to --enforcement=dra",
        )

    def _restart_for_dra(self) -> None:
        assert self.components is not None
        self.components.dra_driver(self.real_nvml_config)
        for name in ("controller", "webhook"):
            self.components.remove(name)
        self.components.controller(enforcement="dra")
        self.components.webhook(enforcement="dra")
        self.out(
            "    restarted the controller and the webhook with --enforcement=dra; started "
            f"hack/dra-driver on {REAL_NODE_NAME} (its ResourceSlice: the node's fake NVML GPUs)"
        )

    def _create_dra_map(self) -> None:
        apply = f"placement map {realnode.NAMESPACE}/{realnode.DRA_MAP_NAME}"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": realnode.DRA_MAP_NAME,
                "namespace": realnode.NAMESPACE,
                "labels": {"gpuplace.io/placement-map": "true"},
            },
            "data": {"placement.yaml": realnode.DRA_MAP_YAML},
        }

        def created() -> bool:
            try:  # refused until the restarted webhook has registered its new address
                self.kube.create(CONFIGMAPS.collection(realnode.NAMESPACE), body)
            except APIError:
                return False
            return True

        self.wait("the restarted webhook to validate the map", created)
        self.out(
            f"    kubectl apply: {apply} (index 0: {REAL_NODE_NAME} GPU {realnode.DRA_DEVICE})"
        )
        self._wait_map_valid(f"{realnode.NAMESPACE}/{realnode.DRA_MAP_NAME}")

    def _webhook_adds_claims(self) -> bool:
        """Whether the webhook, in dra enforcement, gives the DRA pod its claim (a server dry run)."""
        return (
            self.cluster is not None
            and self.cluster.kubectl(
                "apply",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
                input=realnode.DRA_POD_YAML,
                check=False,
            ).stdout.count("resourceClaimTemplateName")
            > 0
        )

    def _check_dra_claim(self, pod_name: str) -> None:
        """The pod's ResourceClaim holds exactly the declared GPU and is reserved for the pod."""
        pod = self.kube.get(PODS.item(pod_name, realnode.NAMESPACE))
        claim_name = next(
            s["resourceClaimName"]
            for s in pod["status"].get("resourceClaimStatuses") or []
            if s["name"] == "gpuplace-gpus"
        )
        claim = self.kube.get(RESOURCE_CLAIMS.item(claim_name, realnode.NAMESPACE))
        results = claim["status"]["allocation"]["devices"]["results"]
        reserved = [r["name"] for r in claim["status"].get("reservedFor") or []]
        self.out(
            f"    ResourceClaim {claim_name}: allocation "
            + ", ".join(f"{r['driver']} pool {r['pool']} device {r['device']}" for r in results)
            + f"; reservedFor {', '.join(reserved)}"
        )
        self.check(
            [(r["pool"], r["device"]) for r in results]
            == [(REAL_NODE_NAME, f"gpu-{realnode.DRA_DEVICE}")]
            and reserved == [pod_name],
            f"the claim holds exactly {REAL_NODE_NAME} gpu-{realnode.DRA_DEVICE}, reserved for "
            f"{pod_name}",
        )

    def _wait_map_valid(self, key: str) -> None:
        self.wait(
            f"map {key} Valid",
            lambda: (
                (st := dict(inspect.map_statuses(self.kube)).get(key)) is not None
                and st.phase.value == "Valid"
            ),
        )

    def _probe_log(self, name: str) -> str:
        assert self.cluster is not None
        cluster = self.cluster

        def report() -> str:
            out = cluster.kubectl("-n", realnode.NAMESPACE, "logs", name, check=False).stdout
            return out if "environment at start" in out else ""

        return str(self.wait(f"{name}'s report in its log", report, timeout=30))

    def _inventories(self) -> int:
        configmaps = self.kube.get(CONFIGMAPS.collection(INVENTORY_NAMESPACE))["items"]
        return len([cm for cm in configmaps if "inventory.json" in (cm.get("data") or {})])

    def _webhook_registered(self) -> bool:
        items = self.kube.get(MUTATING_WEBHOOKS.collection())
        return bool(items["items"])

    def _trainer_running(self) -> bool:
        rows = [r for r in self.pods().values() if r.namespace == "ml-training"]
        return len(rows) == 2 and all(r.node and r.phase == "Running" for r in rows)

    def _drifted(self) -> set[str]:
        """The placed pods the controller marks Drifted (bound off their map's current slot)."""
        return {k for k, row in self.pods().items() if row.reason.startswith("Drifted")}

    def _model_has_move(self) -> bool:
        cm = self.kube.get(
            CONFIGMAPS.collection(MODEL_NAMESPACE), labelSelector=f"{MODEL_LABEL}=true"
        )
        return any(
            "gpu-node-4" in (c.get("data") or {}).get("model.json", "")
            and '"inference/llm-serving"' in (c.get("data") or {}).get("model.json", "")
            and '[1,"gpu-node-4"' in (c.get("data") or {}).get("model.json", "")
            for c in cm["items"]
        )

    def _check_declared(self, pods: dict[str, Any]) -> None:
        declared = {
            "inference/llm-serving-0": ("gpu-node-1", [2, 3]),
            "inference/llm-serving-1": ("gpu-node-2", [0, 1]),
            "legacy/webhook-test-0": ("gpu-node-1", [0, 1]),
            "legacy/webhook-test-1": ("gpu-node-2", [2]),
            "legacy/webhook-test-2": ("gpu-node-3", [0, 1, 2]),
        }
        for key, (node, devices) in declared.items():
            row = pods[key]
            number = int(node.rsplit("-", 1)[1])
            uuids = ",".join(demo_uuid(number, d) for d in devices)
            cvd = ",".join(map(str, devices))
            self.check(
                row.node == node and row.devices == uuids and row.cuda_visible_devices == cvd,
                f"{key} on {node}, GPUs {cvd}, CUDA_VISIBLE_DEVICES={cvd}",
            )

    def _print_chart_logs(self) -> None:
        """The last lines of every gpuplace pod's log (the demo failed)."""
        assert self.cluster is not None
        try:
            pods = chart.component_pods(self.cluster)
        except chart.ChartError as exc:
            self.out(f"--- gpuplace's pods: {exc}")
            return
        for pod in pods:
            name = pod["metadata"]["name"]
            log = self.cluster.kubectl(
                "-n", chart.NAMESPACE, "logs", name, "--tail=15", check=False
            )
            self.out(f"--- pod {name} log (tail) ---\n{log.stdout}{log.stderr}")

    def close(self, failed: bool) -> None:
        if self.components is not None and (failed or not self.keep):
            if failed:
                for component in self.components.items:
                    self.out(f"--- {component.name} log (tail) ---\n{component.log_tail(15)}")
            self.components.stop()
        if failed and self.in_cluster and self.cluster is not None:
            self._print_chart_logs()
        if self.argocd is not None and (failed or not self.keep):
            if failed:
                for process in self.argocd.argocd.processes:
                    self.out(f"--- {process.name} log (tail) ---\n{process.log_tail(15)}")
            self.argocd.stop()
        if self.cluster is not None:
            if self.keep and not failed:
                self.out(
                    f"\nThe cluster stays up. export KUBECONFIG={self.cluster.kubeconfig}\n"
                    f"Stop it with: gpuplace cluster down --dir {self.cluster.directory}"
                )
                return
            self.cluster.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _component_table(pods: list[dict[str, Any]]) -> str:
    rows = [("POD", "NODE", "READY", "IMAGE ID")]
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        statuses = pod["status"].get("containerStatuses") or []
        rows.append(
            (
                pod["metadata"]["name"],
                pod["spec"].get("nodeName", ""),
                f"{sum(1 for s in statuses if s.get('ready'))}/{len(pod['spec']['containers'])}",
                ",".join(str(s.get("imageID", ""))[:19] for s in statuses),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _runs(values: Any) -> list[str]:
    """Consecutive duplicates collapsed: Progressing, Progressing, Degraded -> both once."""
    out: list[str] = []
    for value in values:
        if not out or out[-1] != value:
            out.append(value)
    return out


def _names(keys: set[str]) -> str:
    return ", ".join(sorted(keys)) or "none"


def _indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.splitlines())


def main(keep: bool = False, argocd: bool | None = None, real_node: bool = True) -> int:
    """Runs the demo; `argocd` None means: through ArgoCD when its binaries are built.
    ``real_node``: gpu-probe pods on a real node (containerd, kubelet) besides the kwok nodes."""
    use_argocd = argocd_binaries.available() if argocd is None else argocd
    demo = Demo(keep=keep, argocd=use_argocd, real_node=real_node)
    failed = True
    try:
        demo.run()
        failed = False
        return 0
    except (
        DemoError,
        ArgoCDError,
        ArgoCDBinariesError,
        KubectlError,
        TimeoutError,
        ClusterError,
        BinariesError,
        chart.ChartError,
    ) as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; tearing down", file=sys.stderr)
        return 130
    finally:
        demo.close(failed)
