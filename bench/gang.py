"""`python -m bench.gang [--ranks N] [--repeats N] [--workdir DIR]`: how long a gang takes from its
last servable slot to all its pods bound.

One cluster (etcd, kube-apiserver, kube-controller-manager, kwok) and the real `gpuplace
controller`; no webhook (the pods carry the wiring it would give them, as placement/admitted.py
requires). Each repeat, on nodes of its own (8 GPUs each): a gang map of `--ranks` slots, ranks
0 to N-2 on nodes that can serve them and the last rank alone on a node that is cordoned; the N
pods created (each with its rank label), and waited for until every pod waits GangWaiting and
the map's status says N-1 of N ranks ready. Then the node is uncordoned: the figure is the time
from that PATCH's answer to the last of the N pods seen bound by a watch (time.monotonic on both
sides). Reported beside it: to the first pod bound, and first to last (how far apart the gang's
Bindings land).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import Measurement, below, log_to_stderr, print_tables
from bench._kube import Obj, PodWatch, call
from bench._setup import publish_inventories
from bench._workload import RUN_TIMEOUT, Scale, bench_pod, node_name
from gpuplace_dev.demo.components import Components
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from kubeio.paths import CONFIGMAPS, NODES, PODS
from placement.annotations import (
    INDEX_LABEL,
    MAP_LABEL,
    PLACEMENT_KEY,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
)
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from placement.types import EnvMode
from webhook.pods import wired_env

NAME = "gang"
GPUS = 8
#: The lease of the bench's inventories: nothing renews them, so they last the bench.
LEASE_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class GangScale:
    ranks: int = 64

    @property
    def nodes(self) -> int:
        """Nodes a repeat uses: enough for ranks 0..N-2, and one of its own for the last."""
        return -(-(self.ranks - 1) // GPUS) + 1


DEFAULT = GangScale()
SMALL = GangScale(ranks=16)


@dataclass(frozen=True, slots=True)
class GangRun:
    last_ms: float  # uncordon answered -> last pod bound
    first_ms: float  # uncordon answered -> first pod bound
    spread_ms: float  # first pod bound -> last


def slot_node(scale: GangScale, repeat: int, rank: int) -> tuple[int, int]:
    """(node number, GPU) of `rank`'s slot in `repeat`: the last rank alone on the last node."""
    base = repeat * scale.nodes
    if rank == scale.ranks - 1:
        return base + scale.nodes - 1, 0
    return base + rank // GPUS, rank % GPUS


def gang_map(scale: GangScale, repeat: int, namespace: str) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        f"metadata: {{name: train, namespace: {namespace}}}",
        "spec:",
        "  gang: {timeoutSeconds: 3600}",
        "  placements:",
    ]
    for rank in range(scale.ranks):
        node, gpu = slot_node(scale, repeat, rank)
        lines.append(f"    - {{index: {rank}, node: {node_name(node)}, devices: [{gpu}]}}")
    return "\n".join(lines) + "\n"


def rank_pod(rank: int) -> Obj:
    body = bench_pod(
        f"train-{rank}", {MAP_LABEL: "train", INDEX_LABEL: str(rank)}, {"schedulerName": "gpuplace"}
    )
    # As the webhook leaves it: the binder places a map's pod only with its wiring.
    body["spec"]["containers"][0]["env"] = [dict(e) for e in wired_env(EnvMode.INDEX)]
    return body


def map_status(cluster: LocalCluster, namespace: str) -> dict[str, object]:
    cm = call(cluster, "GET", CONFIGMAPS.item("train", namespace))
    text = (cm["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
    return json.loads(text) if text else {}


def all_gang_waiting(cluster: LocalCluster, namespace: str, ranks: int) -> bool:
    """Every pod is there, unbound, waiting GangWaiting, and the map's status has N-1 ready."""
    gang = map_status(cluster, namespace).get("gang")
    if not isinstance(gang, dict) or gang.get("ready") != ranks - 1:
        return False
    pods = call(cluster, "GET", PODS.collection(namespace))["items"]
    waiting = 0
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled: dict[str, str] = next(
            (c for c in conditions if c.get("type") == "PodScheduled"), {}
        )
        if pod["spec"].get("nodeName") or scheduled.get("reason") != "GangWaiting":
            return False
        waiting += 1
    return waiting == ranks


def cordon(cluster: LocalCluster, node: int, unschedulable: bool) -> None:
    body = {"spec": {"unschedulable": unschedulable}}
    call(cluster, "PATCH", NODES.item(node_name(node)), body, what="cordon")


def one_run(
    cluster: LocalCluster, scale: GangScale, repeat: int, log: Callable[[str], None]
) -> GangRun:
    namespace = f"gang-{repeat}"
    cluster.create_namespace(namespace)
    last_node, _ = slot_node(scale, repeat, scale.ranks - 1)
    cordon(cluster, last_node, True)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "train",
            "namespace": namespace,
            "labels": {PLACEMENT_MAP_LABEL: "true"},
        },
        "data": {PLACEMENT_KEY: gang_map(scale, repeat, namespace)},
    }
    call(cluster, "POST", CONFIGMAPS.collection(namespace), body, wanted={201})
    cluster.wait_for(
        lambda: f"map {namespace}/train Valid: {map_status(cluster, namespace)}",
        lambda: (
            map_status(cluster, namespace).get("phase") == "Valid"
            and map_status(cluster, namespace).get("message") != "compiling"
        ),
        timeout=120,
    )
    for rank in range(scale.ranks):
        call(cluster, "POST", PODS.collection(namespace), rank_pod(rank), wanted={201})
    cluster.wait_for(
        lambda: f"{scale.ranks} pods GangWaiting, {scale.ranks - 1} ready",
        lambda: all_gang_waiting(cluster, namespace, scale.ranks),
        timeout=RUN_TIMEOUT,
        interval=0.5,
    )
    watch = PodWatch(cluster, namespace, scale.ranks, RUN_TIMEOUT)
    try:
        cordon(cluster, last_node, False)
        servable = time.monotonic()
        observed = watch.wait()
    finally:
        watch.stop()
    bound = sorted(observed.bound.values())
    run = GangRun(
        (bound[-1] - servable) * 1000, (bound[0] - servable) * 1000, (bound[-1] - bound[0]) * 1000
    )
    log(
        f"repeat {repeat}: {len(bound)} ranks bound {run.last_ms:.0f} ms after the last slot "
        f"became servable (first {run.first_ms:.0f} ms, spread {run.spread_ms:.0f} ms)"
    )
    return run


def bench(
    scale: GangScale, repeats: int, log: Callable[[str], None], workdir: Path | None = None
) -> list[Measurement]:
    with tempfile.TemporaryDirectory(prefix="gang-") as tmp:
        root = workdir or Path(tmp)
        cluster = LocalCluster(root / "cluster")
        components: Components | None = None
        try:
            cluster.start()
            for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
                cluster.create_namespace(namespace)
            nodes = scale.nodes * repeats
            cluster.create_nodes(
                [FakeNode(node_name(n), gpus=GPUS) for n in range(nodes)], timeout=300
            )
            sizes = Scale(nodes=nodes, pods=nodes * GPUS, gpus=GPUS, slots_per_map=GPUS)
            publish_inventories(cluster, sizes, LEASE_SECONDS)
            components = Components(cluster, root)
            components.controller("env")
            runs = [one_run(cluster, scale, r, log) for r in range(repeats)]
        finally:
            if components is not None:
                components.stop()
            cluster.stop()
    label = f"{scale.ranks} ranks"
    return [
        below(NAME, f"last servable slot -> all {label} bound", [r.last_ms for r in runs], "ms"),
        below(
            NAME,
            "last servable slot -> first rank bound",
            [r.first_ms for r in runs],
            "ms",
            detail=True,
        ),
        below(NAME, "first -> last rank bound", [r.spread_ms for r in runs], "ms", detail=True),
    ]


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """For `python -m bench`."""
    return bench(SMALL if small else DEFAULT, repeats, log_to_stderr(NAME))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gang", description=__doc__)
    parser.add_argument("--ranks", type=int, default=DEFAULT.ranks)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.repeats < 1:
        parser.error("--ranks must be at least 2 and --repeats at least 1")
    print_tables(bench(GangScale(args.ranks), args.repeats, log_to_stderr(NAME), args.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
