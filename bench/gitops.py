"""`python -m bench.gitops`: what a GitOps user waits for, from `git commit` to the pods running
where the commit says, through real ArgoCD.

The placement benchmark's cluster at 20 kwok nodes x 8 GPUs with one placement map of 100 slots
(`spec.rollout: evict`, `maxUnavailable: 50`) in a git repository (file://) that ArgoCD's
ApplicationSet of `argocd/` syncs (application-controller, repo-server and
applicationset-controller built by `make argocd`); a StatefulSet of 100 pods uses the map. Each
run commits a move of N slots (N = 1, then N = 50; the slots go to spare GPUs of other nodes and
back), then refreshes the Application as a git webhook to argocd-server does. Four watches (the
Application, the map's ConfigMap, the model ConfigMaps, the pods) time:

- commit -> applied: ArgoCD's refresh, render (kustomize) and server-side apply, until the map's
  ConfigMap carries the commit (its `gpuplace.io/revision`);
- applied -> model: the controller validates the map and writes the model with the commit;
- model -> bound: the controller evicts the drifted pods (Eviction API), the StatefulSet
  controller recreates them, the webhook admits them and the binder binds each to its new slot;
- applied -> bound, gpuplace's part (the ConfigMap is what ArgoCD hands over), and
  commit -> ArgoCD's sync operation Succeeded, which can end before or after the pods move.

`python -m bench.gitops --repeats 1` runs one move of each size.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import Measurement, below, describe, log_to_stderr, machine, print_tables
from bench._cli import running
from bench._kube import Obj, call
from bench._proc import BenchError
from bench._steps import PlacementBench
from bench._workload import NAMESPACE, Scale, bench_pod, gpu_uuid, map_name, node_name
from gpuplace_dev.demo.argocd import ArgoCDSync
from gpuplace_dev.demo.gitops import GitOpsRepo
from gpuplace_dev.localargocd.apps import APPLICATIONS, AppState
from gpuplace_dev.localargocd.launcher import NAMESPACE as ARGOCD_NAMESPACE
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.paths import CONFIGMAPS, PODS, Resource
from placement.annotations import (
    DEVICES_ANNOTATION,
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    REVISION_ANNOTATION,
)
from placement.model import MODEL_LABEL, MODEL_NAMESPACE

NAME = "gitops"
SCALE = Scale(nodes=20, pods=100, gpus=8, slots_per_map=100)
MOVES = (1, 50)
#: GPUs 0..4 of every node hold the map's slots; a moved slot goes to one of GPUs 5..7.
SPARE_FROM = 5
STATEFULSET = "serving"
STATEFULSETS = Resource("apps", "v1", "statefulsets")
MAP = map_name(0)
MAP_FILE = f"maps/{MAP}.yaml"
CLUSTER_DIR = "clusters/dev"
RUN_TIMEOUT = 300.0
#: gpuplace's part (the map applied -> every moved pod bound on its new slot), p50.
TARGETS = {1: 1.0, 50: 3.0}

KUSTOMIZATION = f"""\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
generatorOptions:
  disableNameSuffixHash: true
  labels:
    {PLACEMENT_MAP_LABEL}: "true"
configMapGenerator:
  - name: {MAP}
    namespace: {NAMESPACE}
    files:
      - placement.yaml={MAP_FILE}
"""

Slot = tuple[int, int]  # node number, GPU index


def home(index: int) -> Slot:
    """Where `bench.placement.Scale` puts a slot: GPU 0 of every node, then GPU 1, ..."""
    return index % SCALE.nodes, index // SCALE.nodes


def away(index: int) -> Slot:
    """Where a moved slot goes: a spare GPU of the next node (distinct for indexes < 60)."""
    return (index + 1) % SCALE.nodes, SPARE_FROM + index // SCALE.nodes


def map_text(slots: dict[int, Slot]) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        "metadata:",
        f"  name: {MAP}",
        f"  namespace: {NAMESPACE}",
        "spec:",
        "  rollout:",
        "    strategy: evict",
        f"    maxUnavailable: {max(MOVES)}",
        "  placements:",
    ]
    for index, (node, device) in sorted(slots.items()):
        lines += [
            f"    - index: {index}",
            f"      node: {node_name(node)}",
            f"      devices: [{device}]",
        ]
    return "\n".join(lines) + "\n"


def statefulset(replicas: int) -> Obj:
    """The workload: `replicas` pods of the map, the placement benchmark's pod as template."""
    pod = bench_pod(STATEFULSET, {MAP_LABEL: MAP, "app": STATEFULSET}, {})
    template = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}
    selector = {"matchLabels": {"app": STATEFULSET}}
    spec = {"replicas": replicas, "podManagementPolicy": "Parallel", "serviceName": STATEFULSET}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": STATEFULSET, "namespace": NAMESPACE},
        "spec": spec | {"selector": selector, "template": template},
    }


class EventLog:
    """Every version of the objects of one list+watch, with when it was seen (time.monotonic)."""

    def __init__(self, kube: Kube, path: str, query: dict[str, Any] | None = None) -> None:
        self.entries: list[tuple[float, Obj]] = []
        self._kube, self._path, self._query = kube, path, dict(query or {})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rv = ""
        self._relist()
        self._thread = threading.Thread(target=self._run, name=f"log {path}", daemon=True)
        self._thread.start()

    def since(self, began: float) -> list[tuple[float, Obj]]:
        with self._lock:
            return [(t, obj) for t, obj in self.entries if t >= began]

    def first(self, began: float, match: Callable[[Obj], bool]) -> float | None:
        return next((t for t, obj in self.since(began) if match(obj)), None)

    def stop(self) -> None:
        self._stop.set()

    def _record(self, objs: Sequence[Obj]) -> None:
        now = time.monotonic()
        with self._lock:
            self.entries += [(now, obj) for obj in objs]

    def _run(self) -> None:
        while not self._stop.is_set():
            query = {**self._query, "resourceVersion": self._rv, "timeoutSeconds": 300}
            try:
                for event in self._kube.stream(self._path, query, timeout=330):
                    obj = event.get("object") or {}
                    self._rv = str(obj.get("metadata", {}).get("resourceVersion", self._rv))
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._record([obj])
                    if self._stop.is_set():
                        return
            except APIError:  # expired or cut: list again (a failed list is retried next)
                time.sleep(0.2)
                with contextlib.suppress(APIError):
                    self._relist()

    def _relist(self) -> None:
        listing = self._kube.get(self._path, **self._query)
        self._rv = str(listing["metadata"]["resourceVersion"])
        self._record(listing["items"])


@dataclass(frozen=True)
class Move:
    """One commit's timeline, seconds from the commit."""

    slots: int
    applied: float
    model: float
    bound: float
    synced: float | None

    @property
    def gpuplace(self) -> float:
        return self.bound - self.applied


@dataclass
class GitOpsResults:
    moves: dict[int, list[Move]] = field(default_factory=dict)


class GitOpsBench(PlacementBench):
    """The placement bench's cluster and gpuplace, with its one map synced through ArgoCD."""

    def __init__(self, workdir: Path, log: Callable[[str], None]) -> None:
        super().__init__(SCALE, workdir, log)
        self.slots = {i: home(i) for i in range(SCALE.pods)}
        self.repo: GitOpsRepo | None = None
        self.argocd: ArgoCDSync | None = None
        self.logs: dict[str, EventLog] = {}

    def apply_maps(self) -> None:
        """The map goes through git and ArgoCD, not straight to the apiserver."""
        assert self.components is not None
        source = self.workdir / "gitops-source"
        (source / CLUSTER_DIR / "maps").mkdir(parents=True)
        (source / CLUSTER_DIR / "kustomization.yaml").write_text(KUSTOMIZATION)
        (source / CLUSTER_DIR / MAP_FILE).write_text(map_text(self.slots))
        self.repo = GitOpsRepo(self.workdir / "gitops", source)
        first = self.repo.commit(f"{MAP}: {SCALE.pods} slots")
        self.argocd = ArgoCDSync(
            self.cluster, self.workdir / "argocd", self.repo.path, self.log, self._alive
        )
        self.argocd.start()
        self.argocd.install("clusters", skip=())
        self.argocd.wait("the ApplicationSet's Application", self.argocd.application)
        result = self.argocd.sync(first)
        if not result.ok:
            raise BenchError(f"ArgoCD could not sync {first}: {result.output}")

    def _alive(self) -> None:
        assert self.components is not None
        self.components.check_alive()
        self.cluster.check_alive()

    def start_workload(self) -> None:
        path = STATEFULSETS.collection(NAMESPACE)
        call(self.cluster, "POST", path, statefulset(SCALE.pods), wanted={201})
        self.cluster.wait_for(
            f"{SCALE.pods} pods of StatefulSet {STATEFULSET} bound", self._all_bound, 300
        )
        kube = self.cluster.kube
        selector = f"{PLACEMENT_MAP_LABEL}=true"
        self.logs = {
            "app": EventLog(
                kube,
                APPLICATIONS.collection(ARGOCD_NAMESPACE),
                {"fieldSelector": "metadata.name=" + self._application()},
            ),
            "map": EventLog(kube, CONFIGMAPS.collection(NAMESPACE), {"labelSelector": selector}),
            "model": EventLog(
                kube,
                CONFIGMAPS.collection(MODEL_NAMESPACE),
                {"labelSelector": f"{MODEL_LABEL}=true"},
            ),
            "pods": EventLog(kube, PODS.collection(NAMESPACE)),
        }

    def _application(self) -> str:
        assert self.argocd is not None
        app = self.argocd.application()
        assert app is not None
        return str(app["metadata"]["name"])

    def _all_bound(self) -> bool:
        pods = call(self.cluster, "GET", PODS.collection(NAMESPACE))["items"]
        bound = [
            p
            for p in pods
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        return len(bound) == SCALE.pods

    def move(self, count: int) -> Move:
        """Commits a move of slots 0..count-1 (each to its other place) and times it."""
        assert self.repo is not None and self.argocd is not None
        targets = {i: home(i) if self.slots[i] != home(i) else away(i) for i in range(count)}
        self.slots.update(targets)
        (self.repo.path / CLUSTER_DIR / MAP_FILE).write_text(map_text(self.slots))
        self.repo.commit(f"{MAP}: move {count} slot(s)")
        revision = self.repo.repo.head.commit.hexsha
        committed = time.monotonic()
        self.argocd.refresh()  # what a git webhook to argocd-server does
        deadline = committed + RUN_TIMEOUT
        while True:
            timeline = self._timeline(committed, revision, targets)
            if timeline is not None:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the move of {count} slots at {revision[:7]} did not finish")
            self._alive()
            time.sleep(0.1)
        self.cluster.wait_for("every pod bound again", self._all_bound, 120)
        return timeline

    def _timeline(self, committed: float, revision: str, targets: dict[int, Slot]) -> Move | None:
        logs = self.logs
        applied = logs["map"].first(
            committed,
            lambda cm: (
                (cm["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION) == revision
            ),
        )
        model = logs["model"].first(
            committed, lambda cm: any(revision in v for v in (cm.get("data") or {}).values())
        )
        bound = [logs["pods"].first(committed, _on(index, slot)) for index, slot in targets.items()]
        if applied is None or model is None or None in bound:
            return None
        synced = logs["app"].first(committed, lambda app: _synced(app, revision))
        last = max(t for t in bound if t is not None)
        return Move(
            len(targets),
            applied - committed,
            model - committed,
            last - committed,
            None if synced is None else synced - committed,
        )

    def stop(self) -> None:
        for log in self.logs.values():
            log.stop()
        if self.argocd is not None:
            self.argocd.stop()
        super().stop()


def _on(index: int, slot: Slot) -> Callable[[Obj], bool]:
    """Whether a pod version is slot `index`'s pod bound on `slot`."""
    name = f"{STATEFULSET}-{index}"
    node, device = slot

    def match(pod: Obj) -> bool:
        annotations = pod["metadata"].get("annotations") or {}
        return (
            pod["metadata"]["name"] == name
            and pod["spec"].get("nodeName") == node_name(node)
            and annotations.get(DEVICES_ANNOTATION) == gpu_uuid(node, device)
            and not pod["metadata"].get("deletionTimestamp")
        )

    return match


def _synced(app: Obj, revision: str) -> bool:
    state = AppState.from_object(app)
    return state.operation == "Succeeded" and state.operation_revision == revision


def bench(repeats: int, log: Callable[[str], None], workdir: Path | None = None) -> GitOpsResults:
    results = GitOpsResults()
    with running(lambda w: GitOpsBench(w, log), workdir, "gpuplace-gitops") as b:
        b.start_workload()
        log(f"{SCALE.pods} pods of StatefulSet {STATEFULSET} bound")
        for count in MOVES:
            for _ in range(repeats):
                move = b.move(count)
                results.moves.setdefault(count, []).append(move)
                synced = "-" if move.synced is None else f"{move.synced:.2f}"
                log(
                    f"  move {count}: applied {move.applied:.2f} s, model {move.model:.2f} s, "
                    f"bound {move.bound:.2f} s after the commit (sync operation {synced} s)"
                )
    return results


def measurements(r: GitOpsResults) -> list[Measurement]:
    label = f"{NAME} {SCALE.label} (1 map)"
    result = []
    for count, moves in sorted(r.moves.items()):
        what = f"move {count} slot{'s' if count > 1 else ''}"
        gpuplace = [m.gpuplace for m in moves]
        result += [
            below(label, f"{what}: commit -> applied (ArgoCD)", [m.applied for m in moves], "s"),
            below(
                label,
                f"{what}: applied -> model (controller)",
                [m.model - m.applied for m in moves],
                "s",
            ),
            below(
                label,
                f"{what}: model -> bound (evict, recreate, bind)",
                [m.bound - m.model for m in moves],
                "s",
            ),
            below(label, f"{what}: applied -> bound (gpuplace)", gpuplace, "s", TARGETS.get(count)),
            below(label, f"{what}: commit -> bound", [m.bound for m in moves], "s"),
            below(label, f"{what}: applied -> bound, worst", [max(gpuplace)], "s", detail=True),
        ]
        synced = [m.synced for m in moves if m.synced is not None]
        if synced:
            result.append(
                below(
                    label, f"{what}: commit -> sync operation Succeeded", synced, "s", detail=True
                )
            )
    return result


_stderr = log_to_stderr("gitops")


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """Part of `make bench`: a few minutes, most of it ArgoCD's start."""
    return measurements(bench(1 if small else max(repeats, 3), _stderr))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gitops", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="moves of each size")
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    args = parser.parse_args(argv)
    _stderr(f"machine: {describe(machine())}")
    figures = measurements(bench(args.repeats, _stderr, args.workdir))
    print_tables(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
