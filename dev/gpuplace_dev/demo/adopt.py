"""The demo's adoption and move (docs/authoring.md): GPU pods that kube-scheduler placed through
DRA claims, before gpuplace, are adopted with `gpuplace import` as a commit whose plan moves no
pod; their workloads switch to the maps and each new pod lands where its predecessor ran; then
`gpuplace move --node` re-places the slots of one node as a second commit, synced like every map
commit, and only those pods move.

kwok nodes run no DRA driver, so the demo publishes for them the ResourceSlices a driver would
(placement/dra.py slice_for, from each node's agent inventory); kube-scheduler allocates the
claims from them. At its end the step deletes its workloads, their maps (a commit) and the slices;
the DeviceClass stays, as a driver's chart would leave it."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from gpuplace_dev.demo.gitops import GitOpsRepo, SyncResult, run_cli
from gpuplace_dev.demo.training import Demo
from gpuplace_dev.localcluster import FakeNode
from kubeio.errors import APIConflictError, APINotFoundError
from kubeio.paths import CONFIGMAPS, DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from kubeio.paths import NODES as NODES_PATH
from kubeio.pod import Pod
from placement.annotations import (
    DEVICES_ANNOTATION,
    DRIFTED_CONDITION,
    INDEX_ANNOTATION,
    MAP_LABEL,
)
from placement.dra import DraSettings, read_claim, slice_devices, slice_for
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.validate import parse_map

NAMESPACE = "adopted"
SETTINGS = DraSettings()
#: The adopted cluster's nodes (kwok), their logical names and their agents' UUID numbers.
NODES = {"gpu-node-8": ("node8", 8), "gpu-node-9": ("node9", 9)}
GPUS = 4
#: The workloads that ran before gpuplace: (kind, name, replicas, the node they are pinned to).
#: The StatefulSet's pods take their ordinal's slot; the Deployment's (Recreate, so that no new
#: pod waits on a GPU an old one holds) the lowest free one. node9 keeps one GPU free: the node
#: that `gpuplace move` picks for the slot of node8 is the one with the fewest fitting free GPUs,
#: then the first by name (the real node's last free GPU ties with it).
WORKLOADS = (("StatefulSet", "vllm", 1, "node8"), ("Deployment", "embed", 3, "node9"))
MOVED_NODE = "node8"
MOVED_WORKLOAD = "vllm"


def workload(kind: str, name: str, replicas: int, node: str) -> dict[str, Any]:
    """A workload whose pods each get one GPU through a claim generated from `gpu-<name>`."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "nodeSelector": {"gpu-node-name": node},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{name}"}],
            },
        },
    }
    if kind == "StatefulSet":
        spec |= {"serviceName": name, "podManagementPolicy": "Parallel"}
    else:
        spec["strategy"] = {"type": "Recreate"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def claim_template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpu-{name}", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": SETTINGS.device_class}}
                    ]
                }
            }
        },
    }


DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": SETTINGS.device_class},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{SETTINGS.driver}"'}}]},
}

#: What a workload's owner changes to hand it to gpuplace: the map label on the pod template,
#: no claim and no node selector (the map, not kube-scheduler, now says which node and GPU).
SWITCH_PATCH = [
    {"op": "add", "path": "/spec/template/metadata/labels/gpuplace.io~1map", "value": ""},
    {"op": "remove", "path": "/spec/template/spec/nodeSelector"},
    {"op": "remove", "path": "/spec/template/spec/resourceClaims"},
    {"op": "remove", "path": "/spec/template/spec/containers/0/resources"},
]


class Step:
    """The step's state: the demo, its repository and how it syncs a commit."""

    def __init__(
        self,
        demo: Demo,
        repo: GitOpsRepo,
        cluster_dir: str,
        sync: Callable[[str], SyncResult],
        wait_valid: Callable[[str], None],
        scheduler_running: bool,
    ) -> None:
        self.demo = demo
        self.repo = repo
        self.cluster_dir = cluster_dir
        self.sync = sync
        self.wait_valid = wait_valid
        self.scheduler_running = scheduler_running
        assert demo.cluster is not None
        self.cluster = demo.cluster
        self.kubeconfig = f"--kubeconfig={demo.cluster.kubeconfig}"
        self.slices: list[dict[str, Any]] = []

    # -- reading --------------------------------------------------------------------------------
    def pods(self) -> dict[str, Pod]:
        """The namespace's live pods by name (a pod being deleted left out)."""
        items = self.demo.kube.get(PODS.collection(NAMESPACE))["items"]
        return {p.name: p for p in map(Pod.of, items) if not p.deleting}

    def claimed(self) -> dict[str, tuple[str, str]] | None:
        """Pod -> (node, GPU UUID) of its allocated claim, once every pod of the workloads is
        bound and holds one."""
        want = sum(replicas for _, _, replicas, _ in WORKLOADS)
        devices = {(d.pool, d.name): d.uuid for d in slice_devices(self.slices, SETTINGS)}
        claims = self.demo.kube.get(RESOURCE_CLAIMS.collection(NAMESPACE))["items"]
        by_owner: dict[str, tuple[str, str, str]] = {}
        for claim in claims:
            state = read_claim(claim)
            if state.owner_uid and state.allocated:
                by_owner[state.owner_uid] = state.allocated[0]
        out = {}
        for name, pod in self.pods().items():
            held = by_owner.get(pod.uid)
            if not pod.bound or pod.phase != "Running" or held is None:
                return None
            out[name] = (pod.node_name, str(devices[(held[1], held[2])]))
        return out if len(out) == want else None

    def placed(self) -> dict[str, tuple[str, str, str]] | None:
        """Pod -> (node, its map slot, GPUs) once every pod runs bound by gpuplace."""
        want = sum(replicas for _, _, replicas, _ in WORKLOADS)
        out = {}
        for name, pod in self.pods().items():
            devices = pod.annotations.get(DEVICES_ANNOTATION, "")
            if MAP_LABEL not in pod.labels or not devices or pod.phase != "Running":
                return None
            out[name] = (pod.node_name, pod.annotations.get(INDEX_ANNOTATION, ""), devices)
        return out if len(out) == want else None

    def _map_path(self, name: str) -> str:
        return f"{self.cluster_dir}/maps/{name}.yaml"

    # -- the scenario ---------------------------------------------------------------------------
    def run(self) -> None:
        demo = self.demo
        demo.step(
            "Adopt pods that ran before gpuplace: gpuplace import writes their maps as a commit "
            "whose plan moves no pod"
        )
        self._nodes()
        before = self._workloads()
        kustomization = f"{self.cluster_dir}/kustomization.yaml"
        original = (self.repo.path / kustomization).read_text()
        imported = self._import(before)
        self._switch(before)
        self._move(imported)
        self._clean_up(kustomization, original)

    def _nodes(self) -> None:
        """Two kwok nodes with agents, the driver's slices and DeviceClass, kube-scheduler."""
        demo = self.demo
        assert demo.components is not None
        self.cluster.create_nodes(
            [FakeNode(n, gpus=GPUS, labels={"gpu-node-name": a}) for n, (a, _) in NODES.items()]
        )
        for node, (_, number) in NODES.items():
            demo.components.agent(node, GPUS, number=number)
        inventories = demo.wait(f"the inventories of {', '.join(NODES)}", self._inventories)
        with contextlib.suppress(APIConflictError):  # the driver's own, already installed
            demo.kube.create(DEVICE_CLASSES.collection(), DEVICE_CLASS)
        for inventory in inventories:
            body = slice_for(inventory, SETTINGS)
            self.slices.append(demo.kube.create(RESOURCE_SLICES.collection(), body))
        if not self.scheduler_running:
            self.cluster.start_scheduler()
        demo.out(
            f"    kwok nodes {', '.join(f'{n} ({a})' for n, (a, _) in NODES.items())}, {GPUS} GPUs "
            f"each; their ResourceSlices of driver {SETTINGS.driver} (what the driver publishes "
            f"on a real node), DeviceClass {SETTINGS.device_class}, kube-scheduler running"
        )

    def _inventories(self) -> list[NodeInventory] | None:
        out = []
        for cm in self.demo.kube.get(CONFIGMAPS.collection(INVENTORY_NAMESPACE))["items"]:
            text = (cm.get("data") or {}).get(INVENTORY_KEY)
            if text and (inventory := NodeInventory.from_json(text)).node in NODES:
                out.append(inventory)
        return out if len(out) == len(NODES) else None

    def _workloads(self) -> dict[str, tuple[str, str]]:
        demo = self.demo
        self.cluster.create_namespace(NAMESPACE)
        for kind, name, replicas, node in WORKLOADS:
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_template(name)))
            self.cluster.kubectl(
                "apply", "-f", "-", input=json.dumps(workload(kind, name, replicas, node))
            )
            demo.out(
                f"    kubectl apply: {kind} {NAMESPACE}/{name} ({replicas} pod(s) on {node}, one GPU "
                f"each through a claim from template gpu-{name}; no gpuplace label)"
            )
        before: dict[str, tuple[str, str]] = demo.wait(
            "kube-scheduler to place the pods on their claims", self.claimed, timeout=120
        )
        demo.out(_indent(_table(("POD", "NODE", "GPU (claim)"), before)))
        demo.check(
            True, f"kube-scheduler placed the {len(before)} pods, each on the GPU its claim holds"
        )
        return before

    def _import(self, before: dict[str, tuple[str, str]]) -> str:
        """`gpuplace import --commit`, merged and synced; returns the commit."""
        demo = self.demo
        argv = [
            "import",
            f"--repo={self.repo.path}",
            f"--dir={self.cluster_dir}",
            f"--namespace={NAMESPACE}",
            "--commit",
            "--branch=adopt",
            "--reason=adopt the pods that run now",
            "--format=json",
            self.kubeconfig,
        ]
        done = run_cli(*argv)
        demo.out(f"    $ gpuplace import --dir {self.cluster_dir} -n {NAMESPACE} --commit")
        demo.out(_indent(done.stderr))
        plan = _json(done)
        summary = plan.get("summary") or {}
        demo.out(_indent(_summary(summary)))
        demo.check(
            done.returncode == 0
            and plan.get("valid") is True
            and summary.get("slotsAdded") == len(before)
            and summary.get("slotsMoved") == 0
            and summary.get("podsDrifting") == 0
            and summary.get("slotsWaiting") == 0,
            f"gpuplace import wrote {len(WORKLOADS)} maps; their plan adds {len(before)} slots "
            "and moves no pod",
        )
        for kind, name, _, _ in WORKLOADS:
            parsed = parse_map((self.repo.path / self._map_path(name)).read_text(), name)
            slots = {(s.node, s.devices) for s in parsed.slots}
            held = {
                (_logical(n), (gpu,)) for pod, (n, gpu) in before.items() if _owner(pod) == name
            }
            demo.check(
                slots == held,
                f"map {NAMESPACE}/{name} ({kind}) declares the node and GPU each of its pods "
                "holds now",
            )
        commit = self._merge("adopt")
        self._sync(commit)
        for _, name, _, _ in WORKLOADS:
            self.wait_valid(f"{NAMESPACE}/{name}")
        demo.check(True, f"both imported maps are Valid at {commit}")
        return commit

    def _merge(self, branch: str) -> str:
        """The pull request merged: main fast-forwarded to the branch the command made."""
        git = self.repo.repo.git
        git.checkout("main")
        git.merge("--ff-only", branch)
        commit = self.repo.repo.head.commit.hexsha[:12]
        self.demo.out(f"    git merge --ff-only {branch}  (the reviewed pull request): {commit}")
        return commit

    def _sync(self, commit: str) -> None:
        result = self.sync(commit)
        last = (result.output.strip().splitlines() or [""])[-1]
        self.demo.check(result.ok, f"sync of {commit} applied: {last}")

    def _switch(self, before: dict[str, tuple[str, str]]) -> None:
        """Each workload's template gets the map label; the new pods take their slots."""
        demo = self.demo
        for kind, name, _, _ in WORKLOADS:
            patch = [dict(op) for op in SWITCH_PATCH]
            patch[0]["value"] = name
            self.cluster.kubectl(
                "-n",
                NAMESPACE,
                "patch",
                kind.lower(),
                name,
                "--type=json",
                "-p",
                json.dumps(patch),
            )
            demo.out(
                f"    kubectl patch {kind.lower()} {name}: label gpuplace.io/map={name} on its "
                "pod template, its claim and node selector removed"
            )
        after: dict[str, tuple[str, str, str]] = demo.wait(
            "the workloads' new pods bound by gpuplace", self.placed, timeout=180
        )
        demo.out(_indent(_table(("POD", "NODE", "SLOT", "GPU"), after)))
        held = {(n, g) for n, g in before.values()}
        demo.check(
            {(n, g) for n, _, g in after.values()} == held
            and all(before[p] == (n, g) for p, (n, _, g) in after.items() if p in before),
            "every new pod runs on the node and GPU its predecessor held (StatefulSet pods by "
            "ordinal): the switch moved nothing",
        )

    def _move(self, imported: str) -> None:
        """`gpuplace move --node` as a commit; only the moved slots' pods move."""
        demo = self.demo
        demo.step(
            f"Maintenance of {MOVED_NODE}: gpuplace move --node {MOVED_NODE} --commit, synced "
            "like every map commit"
        )
        uids = {name: pod.uid for name, pod in self.pods().items()}
        done = run_cli(
            "move",
            f"--node={MOVED_NODE}",
            f"--repo={self.repo.path}",
            f"--dir={self.cluster_dir}",
            "--commit",
            "--branch=maintenance",
            f"--reason=maintenance of {MOVED_NODE}",
            "--format=json",
            self.kubeconfig,
        )
        demo.out(f"    $ gpuplace move --node {MOVED_NODE} --dir {self.cluster_dir} --commit")
        demo.out(_indent(done.stderr))
        plan = _json(done)
        clusters = plan.get("clusters") or [{}]
        drifting = {
            d["pod"]: d["reason"] for d in (clusters[0].get("live") or {}).get("drifting") or []
        }
        on_node = {f"{NAMESPACE}/{p}" for p in uids if _owner(p) == MOVED_WORKLOAD}
        demo.out(_indent(_summary(plan.get("summary") or {})))
        demo.check(
            done.returncode == 0
            and plan.get("valid") is True
            and drifting == dict.fromkeys(on_node, "SlotMoved")
            and (plan.get("summary") or {}).get("slotsWaiting") == 0,
            f"the plan moves exactly the pods of {MOVED_NODE}'s slots: {', '.join(sorted(on_node))}",
        )
        diff = self.repo.repo.git.diff(f"{imported}..maintenance", "--unified=0")
        changed = [
            line
            for line in diff.splitlines()
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        demo.out(_indent("$ git diff --unified=0\n" + "\n".join(changed)))
        demo.check(
            bool(changed)
            and all(
                line.lstrip("+-").strip().startswith(("node:", "devices:")) for line in changed
            ),
            "the commit changes only the moved slots' node and devices lines",
        )
        commit = self._merge("maintenance")
        self._sync(commit)
        key = f"{NAMESPACE}/{MOVED_WORKLOAD}"
        drifted = demo.wait(
            f"the controller to mark {key}'s pods Drifted", lambda: self._drifted() or None
        )
        demo.check(
            drifted == on_node,
            f"the controller marks Drifted exactly those pods: {sorted(on_node)}",
        )
        for name in sorted(p.split("/")[1] for p in drifted):
            self.cluster.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false")
            demo.out(f"    kubectl -n {NAMESPACE} delete pod {name}  (Drifted; rollout: manual)")
        declared = self._declared(MOVED_WORKLOAD)
        after: dict[str, tuple[str, str, str]] = demo.wait(
            f"{key}'s pods re-placed",
            lambda: (
                (p := self.placed())
                and all(
                    p[n][0] != NODES_BY_ALIAS[MOVED_NODE] for n in p if _owner(n) == MOVED_WORKLOAD
                )
                and p
            ),
            timeout=120,
        )
        demo.out(_indent(_table(("POD", "NODE", "SLOT", "GPU"), after)))
        demo.check(
            all(
                (after[n][0], after[n][2]) == declared[int(after[n][1])]
                for n in after
                if _owner(n) == MOVED_WORKLOAD
            ),
            f"{key}'s pods run on the nodes and GPUs the moved slots now name",
        )
        kept = {n: u for n, u in uids.items() if _owner(n) != MOVED_WORKLOAD}
        now = {name: pod.uid for name, pod in self.pods().items()}
        demo.check(
            all(now.get(n) == u for n, u in kept.items()) and bool(kept),
            f"the other {len(kept)} pods keep their uid",
        )

    def _declared(self, name: str) -> dict[int, tuple[str, str]]:
        """Slot -> (node, GPU UUIDs) that the map file in the repository declares (the imported
        and moved entries name GPUs by UUID, nodes by their logical name where they have one)."""
        parsed = parse_map((self.repo.path / self._map_path(name)).read_text(), name)
        nodes = self.demo.kube.get(NODES_PATH.collection())["items"]
        aliases = {
            (n["metadata"].get("labels") or {}).get("gpu-node-name", ""): n["metadata"]["name"]
            for n in nodes
        }
        return {
            s.index: (aliases.get(str(s.node), str(s.node)), ",".join(map(str, s.devices)))
            for s in parsed.slots
        }

    def _drifted(self) -> set[str]:
        """The pods the controller marks Drifted (bound off their map's current slot)."""
        return {
            f"{NAMESPACE}/{name}"
            for name, pod in self.pods().items()
            if pod.condition(DRIFTED_CONDITION) is not None
        }

    def _clean_up(self, kustomization: str, original: str) -> None:
        """The workloads, their maps (out of git) and the slices go."""
        demo = self.demo
        for kind, name, _, _ in WORKLOADS:
            self.cluster.kubectl("-n", NAMESPACE, "delete", kind.lower(), name, "--wait=false")
        demo.wait("the adopted pods gone", lambda: not self.pods(), timeout=120)
        for _, name, _, _ in WORKLOADS:
            (self.repo.path / self._map_path(name)).unlink()
        (self.repo.path / kustomization).write_text(original)
        done = self.repo.commit("The adopted workloads are gone: their maps go")
        self._sync(done)
        for _, name, _, _ in WORKLOADS:
            for kind in ("placementmaps.gpuplace.io", "configmap"):
                self.cluster.kubectl(
                    "-n", NAMESPACE, "delete", kind, name, "--ignore-not-found", check=False
                )
        for body in self.slices:
            with contextlib.suppress(APINotFoundError):
                demo.kube.delete(RESOURCE_SLICES.item(body["metadata"]["name"]))
        if not self.scheduler_running:
            self.cluster.stop_scheduler()
        demo.out(
            f"    deleted: the workloads of {NAMESPACE}, their maps (a commit), the slices of "
            f"{', '.join(NODES)}" + ("" if self.scheduler_running else "; kube-scheduler stopped")
        )


NODES_BY_ALIAS = {alias: node for node, (alias, _) in NODES.items()}


def _logical(node: str) -> str:
    return NODES[node][0] if node in NODES else node


def _owner(pod: str) -> str:
    """The workload of a pod name: vllm-0 -> vllm, embed-5f9c-x2 -> embed."""
    name = pod.rsplit("/", maxsplit=1)[-1]
    return next((w for _, w, _, _ in WORKLOADS if name.startswith(f"{w}-")), "")


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        parsed = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _summary(summary: dict[str, Any]) -> str:
    keys = ("slotsAdded", "slotsMoved", "podsDrifting", "slotsWaiting")
    return "plan: " + ", ".join(f"{k} {summary.get(k)}" for k in keys)


def _table(head: tuple[str, ...], rows: Mapping[str, tuple[str, ...]]) -> str:
    lines = [head, *((name, *values) for name, values in sorted(rows.items()))]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def _indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.rstrip().splitlines())
