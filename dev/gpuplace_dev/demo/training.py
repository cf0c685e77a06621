"""The demo's training job: an Indexed Job of four ranks, each placed on its rank's slot by a map
committed to git, across the real node and two kwok nodes; one rank killed and coming back to
its own slot (docs/training.md).

kwok completes a Job's pods as soon as they run, so the rank that is killed is the one on the
real node, whose container runs until it is deleted. Without the real node (`--kwok-only`) every
rank is on a kwok node and the restart is left out (the integration tests cover it there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gpuplace import inspect
from gpuplace_dev.demo import realnode
from gpuplace_dev.demo.components import Components
from gpuplace_dev.demo.gitops import GitOpsRepo, SyncResult, run_cli
from gpuplace_dev.localcluster import GPU_PROBE_IMAGE, REAL_NODE_NAME, FakeNode, LocalCluster
from kubeio.client import Kube
from kubeio.paths import PODS
from kubeio.pod import Pod
from placement.annotations import INDEX_ANNOTATION, JOB_COMPLETION_INDEX


class Demo(Protocol):
    """What the step uses of the demo (gpuplace_dev.demo.scenario.Demo)."""

    real_node: bool
    cluster: LocalCluster | None
    components: Components | None

    @property
    def kube(self) -> Kube: ...

    def out(self, text: str) -> None: ...

    def step(self, text: str) -> None: ...

    def check(self, condition: bool, claim: str) -> None: ...

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 90.0) -> Any: ...


NAMESPACE = "ml-training"
MAP_NAME = "llm-train"
MAP_FILE = f"maps/{MAP_NAME}.yaml"
JOB_NAME = "llm-train"
RANKS = 4
#: The training nodes (kwok), their GPUs and their agents' UUID numbers (the real node is 5).
NODES = {"gpu-node-6": 6, "gpu-node-7": 7}
GPUS = 4


def slots(real_node: bool) -> dict[int, tuple[str, int]]:
    """Rank -> (node, GPU). With the real node, rank 0 takes its GPU 2, which the gpu-probe map
    leaves free until the DRA step (the Job is deleted before it)."""
    kwok = [(node, gpu) for node in NODES for gpu in range(2)]
    if real_node:
        return {0: (REAL_NODE_NAME, realnode.DRA_DEVICE), **dict(enumerate(kwok[:3], start=1))}
    return dict(enumerate(kwok[:RANKS]))


def map_yaml(real_node: bool) -> str:
    entries = "".join(
        f"    - {{index: {rank}, node: {node}, devices: [{gpu}]}}\n"
        for rank, (node, gpu) in sorted(slots(real_node).items())
    )
    return f"""\
# The training job's ranks: rank i runs where its checkpoint shards are (docs/training.md).
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: {MAP_NAME}
  namespace: {NAMESPACE}
spec:
  placements:
{entries}"""


KUSTOMIZE_ENTRY = f"""\
  - name: {MAP_NAME}
    namespace: {NAMESPACE}
    files:
      - placement.yaml={MAP_FILE}
    options:
      annotations:
        gpuplace.io/source-file: {MAP_FILE}
"""

JOB_YAML = f"""\
apiVersion: batch/v1
kind: Job
metadata:
  name: {JOB_NAME}
  namespace: {NAMESPACE}
spec:
  completionMode: Indexed
  completions: {RANKS}
  parallelism: {RANKS}
  backoffLimit: 6
  template:
    metadata:
      labels: {{gpuplace.io/map: {MAP_NAME}}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 2
      containers:
        - name: rank
          image: {GPU_PROBE_IMAGE}
"""


def job_pods(demo: Demo) -> dict[int, Pod]:
    """The Job's live pods by completion index (a pod being deleted left out)."""
    out: dict[int, Pod] = {}
    items = demo.kube.get(PODS.collection(NAMESPACE), labelSelector=f"job-name={JOB_NAME}")
    for obj in items["items"]:
        pod = Pod.of(obj)
        index = pod.labels.get(JOB_COMPLETION_INDEX)
        if index is not None and not obj["metadata"].get("deletionTimestamp"):
            out[int(index)] = pod
    return out


def placed(pods: dict[int, Pod]) -> dict[int, tuple[str, int]]:
    """Rank -> (node, slot index) of the bound ranks."""
    return {
        rank: (pod.node_name, int(pod.annotations.get(INDEX_ANNOTATION, "-1")))
        for rank, pod in pods.items()
        if pod.bound
    }


def run(
    demo: Demo,
    repo: GitOpsRepo,
    cluster_dir: str,
    sync: Callable[[str], SyncResult],
    wait_valid: Callable[[str], None],
) -> None:
    """The training step (see the module's docstring): the map committed to `repo` under
    `cluster_dir` and synced by `sync`, as the demo's other maps are."""
    assert demo.cluster is not None and demo.components is not None
    real = demo.real_node
    where = f"the real node {REAL_NODE_NAME} and kwok nodes" if real else "kwok nodes"
    demo.step(f"A training job: an Indexed Job of {RANKS} ranks across {where}, placed by rank")
    demo.cluster.create_nodes([FakeNode(n, gpus=GPUS) for n in NODES])
    for node, number in NODES.items():
        demo.components.agent(node, GPUS, number=number)
    (repo.path / cluster_dir / MAP_FILE).write_text(map_yaml(real))
    kustomization = f"{cluster_dir}/kustomization.yaml"
    before = (repo.path / kustomization).read_text()
    if "configMapGenerator:\n" in (repo.path / kustomization).read_text():
        repo.edit(kustomization, "configMapGenerator:\n", "configMapGenerator:\n" + KUSTOMIZE_ENTRY)
    else:  # the maps are served as PlacementMap resources (gpuplace migrate, under ArgoCD)
        repo.edit(kustomization, "resources:\n", f"resources:\n  - {MAP_FILE}\n")
    commit = repo.commit("The training job's ranks")
    demo.out(f"    committed {commit}: {cluster_dir}/{MAP_FILE}")
    result = sync(commit)
    last = (result.output.strip().splitlines() or [""])[-1]
    demo.check(result.ok, f"sync of {commit} applied: {last}")
    wait_valid(f"{NAMESPACE}/{MAP_NAME}")
    demo.cluster.kubectl("apply", "-f", "-", input=JOB_YAML)
    demo.out(
        f"    kubectl apply: Job {NAMESPACE}/{JOB_NAME} (completionMode Indexed, {RANKS} ranks)"
    )
    want = {rank: (node, rank) for rank, (node, _) in slots(real).items()}
    pods = demo.wait(
        f"all {RANKS} ranks bound",
        lambda: (p := job_pods(demo)) and len(placed(p)) == RANKS and p,
        timeout=120,
    )
    rows = [inspect.PodRow.of(p) for _, p in sorted(pods.items())]
    demo.out(inspect.pod_table(rows))
    demo.check(
        placed(pods) == want,
        f"every rank is bound to its own slot: {_slots(want)}",
    )
    if real:
        _restart(demo, want)
    shown = run_cli("gpus", f"--kubeconfig={demo.cluster.kubeconfig}").stdout
    demo.out("    $ gpuplace gpus\n" + _indent(shown))
    pods = job_pods(demo)
    on_real = [p for p in pods.values() if p.node_name == REAL_NODE_NAME]
    if on_real:
        demo.check(
            on_real[0].name in shown,
            f"gpuplace gpus names rank 0's pod {on_real[0].name} on {REAL_NODE_NAME}",
        )
    _delete_job(demo)
    if not real:
        # The map goes: nothing in the demo needs it any more.
        (repo.path / cluster_dir / MAP_FILE).unlink()
        (repo.path / kustomization).write_text(before)
        done = repo.commit("The training job is done: its map goes")
        demo.check(
            sync(done).ok, f"sync of {done} applied (the map {MAP_NAME} is no longer in git)"
        )
        for kind in ("placementmaps.gpuplace.io", "configmap"):
            demo.cluster.kubectl(
                "-n", NAMESPACE, "delete", kind, MAP_NAME, "--ignore-not-found", check=False
            )
        return
    # Rank 0's slot leaves the real node: the DRA step declares its GPU 2 in a map of its own.
    # The map stays in git (an edit, synced as every map commit; its next Job runs on kwok).
    (repo.path / cluster_dir / MAP_FILE).write_text(map_yaml(False))
    done = repo.commit("The training job is done: rank 0's slot leaves the real node")
    demo.check(sync(done).ok, f"sync of {done} applied (rank 0's slot on gpu-node-6)")
    wait_valid(f"{NAMESPACE}/{MAP_NAME}")
    demo.out(f"    map {NAMESPACE}/{MAP_NAME}: no slot on {REAL_NODE_NAME} any more")


def _restart(demo: Demo, want: dict[int, tuple[str, int]]) -> None:
    """Rank 0 (on the real node) killed: the Job makes a new pod of index 0, which takes slot 0."""
    assert demo.cluster is not None
    old = job_pods(demo)[0]
    demo.wait(f"rank 0 ({old.name}) Running", lambda: job_pods(demo)[0].phase == "Running")
    demo.cluster.kubectl("-n", NAMESPACE, "delete", "pod", old.name, "--wait=false")
    demo.out(f"    $ kubectl -n {NAMESPACE} delete pod {old.name}   (rank 0 fails)")
    back = demo.wait(
        "rank 0's new pod bound",
        lambda: (p := job_pods(demo).get(0)) is not None and p.name != old.name and p.bound and p,
        timeout=120,
    )
    demo.check(
        (back.node_name, int(back.annotations.get(INDEX_ANNOTATION, "-1"))) == want[0],
        f"rank 0's new pod {back.name} is back on its own slot 0 ({want[0][0]})",
    )
    explained = run_cli(
        "explain", f"{NAMESPACE}/{back.name}", f"--kubeconfig={demo.cluster.kubeconfig}"
    ).stdout
    demo.out(f"    $ gpuplace explain {NAMESPACE}/{back.name}\n" + _indent(explained))
    demo.check(
        f"bound to node {want[0][0]} by gpuplace: map {MAP_NAME} index 0" in explained,
        "gpuplace explain says it is bound by gpuplace to map llm-train's slot 0",
    )


def _delete_job(demo: Demo) -> None:
    """The Job and its pods go (the real node's GPU 2 is the DRA step's)."""
    assert demo.cluster is not None
    demo.cluster.kubectl(
        "-n", NAMESPACE, "delete", "job", JOB_NAME, "--cascade=foreground", "--wait=false"
    )
    demo.wait("the training job's pods gone", lambda: not _any_pod(demo), timeout=120)
    demo.out(f"    kubectl delete job {JOB_NAME}: its pods are gone and its GPUs free")


def _any_pod(demo: Demo) -> bool:
    items: dict[str, Any] = demo.kube.get(
        PODS.collection(NAMESPACE), labelSelector=f"job-name={JOB_NAME}"
    )
    return bool(items["items"])


def _slots(want: dict[int, tuple[str, int]]) -> str:
    return ", ".join(f"rank {r} -> {node} slot {i}" for r, (node, i) in sorted(want.items()))


def _indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.rstrip().splitlines())
