"""`python -m bench memory` (or `python -m bench.memory`): the controller's memory at the design's
scale, and its start-up to the first bind with every GPU held.

The apiserver holds 5,000 nodes x 8 GPUs (each node's inventory ConfigMap and agent Lease, as the
agents write them), 400 placement maps of 100 slots and 39,999 pods bound to their slots by
signed Bindings as gpuplace's binder writes them (the key ring's Secret is written first, with
the key that signs them; `--running` also reports each pod Running as a kubelet would). Then a
controller starts on that cluster, and the 40,000th pod, the one slot left, is created: the
figures are the time from the controller's start to that pod's bind, and the controller's
resident memory (VmRSS and its peak VmHWM) once it has bound it and once every pod is counted in
its map's status. What the writes cost (seconds and objects/s through one keep-alive client from
`CREATE_THREADS` threads, the apiserver's and etcd's CPU) is reported beside them.

The tier's limits: nothing heartbeats the nodes (no kwok annotation, and kube-controller-manager's
node lifecycle controller is off, so that they stay Ready as created; no agent renews the Leases,
which last the bench); the pods never run (no kubelet: they stay Pending, bound, unless
`--running` writes their status once); no webhook runs (the pods carry its CUDA_VISIBLE_DEVICES
wiring as it would have written it; the pod-bindings admission policy checks that); one
controller replica, no standby.
So it measures what the controller holds and how fast it starts, not the steady load of a
fleet's heartbeats (`bench.scale` measures that at 10,000 pods).

Not part of `make bench`'s default set (about 20 minutes on two cores): `make bench-memory`,
`python -m bench memory`, or `python -m bench.memory --nodes 500 --pods 4000` for a quicker tier.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import Measurement, below, describe, log_to_stderr, machine, print_tables
from bench._kube import CpuMeter, Obj, call, concurrently, process_cpu
from bench._setup import apply_maps, publish_inventories, storage
from bench._stats import status_kib
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    Scale,
    bench_pod,
    binding,
    node_name,
    pod_name,
)
from controller.bindingkey import KeySecret, StoredRing, write
from controller.settings import BinderSettings, ControllerSettings
from gpuplace_dev.demo.components import Component, Components
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from gpuplace_dev.localcluster.layout import ClusterState
from gpuplace_dev.localcluster.nodes import KWOK_NODE_ANNOTATION
from kubeio.paths import CONFIGMAPS, NODES, PODS
from kubeio.times import now_time
from placement.annotations import (
    INDEX_LABEL,
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
)
from placement.inventory import INVENTORY_NAMESPACE
from placement.keyring import RingKey, new_ring
from placement.model import MODEL_NAMESPACE
from placement.types import EnvMode
from webhook.pods import wired_env

NAME = "memory"
BY_DEFAULT = False
DEFAULT = Scale(nodes=5000, pods=40000, gpus=8, slots_per_map=100)
SMALL = Scale(nodes=500, pods=4000, gpus=8, slots_per_map=100)
TARGET_RSS_MIB = 1024.0
TARGET_FIRST_BIND_S = 10.0
#: The pod created after the controller starts: slot 0 of the first map.
FIRST = 0
#: Once every map's status is written, the controller's memory is read again after this long
#: with nothing to do (what it holds at rest, after the start-up's garbage is freed).
REST_SECONDS = 10.0
SERVERS = ("kube-apiserver", "etcd")


@dataclass
class Phase:
    """Writing `objects` objects of one kind: wall seconds, and the CPU each process used."""

    what: str
    objects: int
    seconds: float
    cpu: dict[str, float]


@dataclass
class MemoryResults:
    phases: list[Phase] = field(default_factory=list)
    first_bind: list[float] = field(default_factory=list)
    #: The controller's CPU seconds from its start to the first bind.
    first_bind_cpu: list[float] = field(default_factory=list)
    rss_at_bind: list[float] = field(default_factory=list)
    rss_synced: list[float] = field(default_factory=list)
    rss_at_rest: list[float] = field(default_factory=list)
    peak: list[float] = field(default_factory=list)
    statuses_s: list[float] = field(default_factory=list)
    storage: str = ""


def node_manifest(n: int, gpus: int) -> Obj:
    """A node as a kubelet registers it and reports it Ready, for nobody to manage: no kwok
    annotation, so nothing heartbeats it."""
    manifest = FakeNode(node_name(n), gpus=gpus).manifest()
    del manifest["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
    now = now_time()
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    manifest["status"] |= {
        "conditions": [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": f"kubelet: {reason}",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for kind, status, reason in conditions
        ],
        "addresses": [
            {"type": "InternalIP", "address": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"},
            {"type": "Hostname", "address": node_name(n)},
        ],
        "nodeInfo": {
            "architecture": "amd64",
            "containerRuntimeVersion": "containerd://1.7.22",
            "kernelVersion": "6.8.0-45-generic",
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.32.0",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 24.04.1 LTS",
            "machineID": f"{n:032x}",
            "systemUUID": f"{n:08x}-0000-4000-8000-000000000000",
            "bootID": f"{n:08x}-0000-4000-8000-000000000001",
        },
    }
    return manifest


def admitted_pod(scale: Scale, pod: int) -> Obj:
    """A pod of its map's slot as gpuplace's webhook admits it: its container's env wired from
    the binding's annotations (the webhook is not running; the pod-bindings policy checks the
    wiring is exactly the webhook's)."""
    map_name, index = scale.map_index(pod)
    obj = bench_pod(
        pod_name(scale, pod, 1),
        {MAP_LABEL: map_name, INDEX_LABEL: str(index)},
        {"schedulerName": BinderSettings().scheduler_name},
    )
    for container in obj["spec"]["containers"]:
        container["env"] = list(wired_env(EnvMode.INDEX))
    return obj


def running_status(scale: Scale, pod: int) -> Obj:
    """What a kubelet reports of the pod once it runs (a merge patch of its status)."""
    now = now_time()
    n = pod % scale.nodes
    ip = f"10.{128 + pod // 65536}.{pod // 256 % 256}.{pod % 256}"
    kinds = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": now} for kind in kinds
            ],
            "hostIP": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "qosClass": "BestEffort",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "registry.k8s.io/pause:3.10",
                    "imageID": "registry.k8s.io/pause@sha256:" + "0" * 64,
                    "containerID": f"containerd://{pod:064x}",
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
    }


class MemoryBench:
    """The cluster at the tier's scale, written once; a controller started on it per repeat."""

    def __init__(
        self, scale: Scale, workdir: Path, log: Callable[[str], None], running: bool = False
    ) -> None:
        self.scale = scale
        self.running = running
        self.workdir = workdir
        self.log = log
        self.cluster = LocalCluster(
            workdir / "cluster", namespaces=[NAMESPACE], node_lifecycle=False
        )
        self.components: Components | None = None
        self.key = RingKey(secrets.token_bytes(32), now_time())
        self.results = MemoryResults()

    def _servers(self) -> dict[str, int]:
        state = ClusterState.read(self.cluster.layout.state_file)
        pids = {r.name: r.pid for r in state.processes if r.name in SERVERS}
        return pids | {"bench client": os.getpid()}

    def _phase(
        self, what: str, items: Sequence[int], write: Callable[[int], object], objects: int = 0
    ) -> None:
        """Writes `items` from `CREATE_THREADS` threads, `objects` objects in all (default one
        an item), and notes what that cost."""
        objects = objects or len(items)
        meter = CpuMeter(self._servers()).start()
        began = time.monotonic()
        concurrently(items, write, CREATE_THREADS)
        seconds = time.monotonic() - began
        phase = Phase(what, objects, seconds, meter.stop())
        self.results.phases.append(phase)
        servers = sum(phase.cpu.get(name, 0.0) for name in SERVERS)
        self.log(
            f"{what}: {objects:,} in {seconds:.1f} s ({objects / seconds:,.0f}/s; "
            f"apiserver + etcd {1000 * servers / objects:.2f} ms CPU each)"
        )

    def setup(self) -> None:
        began = time.monotonic()
        cluster = self.cluster.start()
        for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
            cluster.create_namespace(namespace)
        self.log(f"control plane up in {cluster.startup_seconds:.1f} s")
        scale = self.scale
        self._write_key()

        def create_node(n: int) -> None:
            call(cluster, "POST", NODES.collection(), node_manifest(n, scale.gpus), wanted={201})

        self._phase("nodes", range(scale.nodes), create_node)
        self._phase_of(
            "inventories and Leases",
            2 * scale.nodes,
            lambda: publish_inventories(cluster, scale, 24 * 3600),
        )
        self._phase_of("placement maps", scale.maps, lambda: apply_maps(cluster, scale))
        held = [p for p in scale.creation_order() if p != FIRST]
        uids: dict[int, str] = {}

        def create_pod(p: int) -> None:
            created = call(cluster, "POST", PODS.collection(NAMESPACE), admitted_pod(scale, p))
            uids[p] = created["metadata"]["uid"]

        def bind(p: int) -> None:
            body = binding(scale, p, 1, uids[p], key=self.key)
            path = PODS.item(pod_name(scale, p, 1), NAMESPACE, "binding")
            call(cluster, "POST", path, body, wanted={201})

        def run(p: int) -> None:
            path = PODS.item(pod_name(scale, p, 1), NAMESPACE, "status")
            call(cluster, "PATCH", path, running_status(scale, p), wanted={200})

        self._phase("pods created", held, create_pod)
        self._phase("pods bound (signed Bindings)", held, bind)
        if self.running:
            self._phase("pods Running (status writes)", held, run)
        self.results.storage = storage(cluster)
        self.log(f"cluster written after {time.monotonic() - began:.0f} s; {self.results.storage}")
        self.components = Components(cluster, self.workdir)

    def _phase_of(self, what: str, objects: int, write: Callable[[], None]) -> None:
        """`_phase` for a step written elsewhere (`bench._setup`, with threads of its own)."""
        self._phase(what, [objects], lambda _: write(), objects)

    def _write_key(self) -> None:
        """The key ring's Secret, as the controller's first leader writes it, holding the key
        the bench signs with: the controller then verifies every binding (none is forged, none
        unverifiable)."""
        settings = ControllerSettings()
        where = KeySecret(settings.system_namespace, BinderSettings().key_secret_name)
        ring = new_ring(self.key.secret, self.key.created)
        write(self.cluster.kube, where, StoredRing(None, (), None), ring, ())

    def measure(self, repeat: int) -> None:
        """Starts a controller, creates the one pod left and waits for its bind; reads the
        controller's memory then, once every map's status is written, and at rest."""
        assert self.components is not None
        r = self.results
        name = f"controller-{repeat}"
        started = time.monotonic()
        controller = self.components.controller("env", name=name)
        pid = _pid(controller)
        call(self.cluster, "POST", PODS.collection(NAMESPACE), admitted_pod(self.scale, FIRST))
        path = PODS.item(pod_name(self.scale, FIRST, 1), NAMESPACE)

        def bound() -> bool:
            _, pod = self.cluster.request("GET", path)
            return bool((pod.get("spec") or {}).get("nodeName"))

        self.cluster.wait_for(
            "the controller's first bind", _alive(controller, bound), 600, interval=0.02
        )
        r.first_bind.append(time.monotonic() - started)
        r.first_bind_cpu.append(process_cpu(pid))
        r.rss_at_bind.append(_rss_mib(pid))
        self.log(
            f"first bind {r.first_bind[-1]:.2f} s after the start ({r.first_bind_cpu[-1]:.1f} s "
            f"of CPU); VmRSS {r.rss_at_bind[-1]:,.0f} MiB"
        )

        counted = [0]

        def statuses() -> bool:
            # Every pod counted bound: every signature verified under the ring's key.
            counted[0] = bound_slots(self.cluster)
            return counted[0] == self.scale.pods

        self.cluster.wait_for(
            lambda: f"every map's status to count its pods bound ({counted[0]:,} so far)",
            _alive(controller, statuses),
            600,
            interval=0.5,
        )
        r.statuses_s.append(time.monotonic() - started)
        r.rss_synced.append(_rss_mib(pid))
        time.sleep(REST_SECONDS)
        r.rss_at_rest.append(_rss_mib(pid))
        r.peak.append(_rss_mib(pid, "VmHWM"))
        self.log(
            f"every pod counted in its map's status {r.statuses_s[-1]:.1f} s after the start; VmRSS "
            f"{r.rss_synced[-1]:,.0f} MiB then, {r.rss_at_rest[-1]:,.0f} MiB at rest; "
            f"VmHWM {r.peak[-1]:,.0f} MiB"
        )
        controller.stop()
        # The next repeat creates the same pod again on a controller that has not seen it.
        call(self.cluster, "DELETE", path, {"gracePeriodSeconds": 0}, wanted={200})
        self.cluster.wait_for(
            "the first pod deleted", lambda: self.cluster.request("GET", path)[0] == 404, 60
        )

    def stop(self) -> None:
        if self.components is not None:
            self.components.stop()
        self.cluster.stop()


def bound_slots(cluster: LocalCluster) -> int:
    """The bound slots the placement maps' status annotations count, all maps together."""
    path = f"{CONFIGMAPS.collection(NAMESPACE)}?labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
    status, body = cluster.request("GET", path)
    if status != 200:
        return 0
    total = 0
    for item in body["items"]:
        text = (item["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
        total += int(json.loads(text).get("slots", {}).get("bound", 0)) if text else 0
    return total


def _pid(component: Component) -> int:
    assert component.proc is not None
    return component.proc.pid


def _alive(component: Component, condition: Callable[[], bool]) -> Callable[[], bool]:
    def check() -> bool:
        if not component.alive():
            raise RuntimeError(f"the controller exited:\n{component.log_tail()}")
        return condition()

    return check


def _rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    return status_kib(Path(f"/proc/{pid}/status").read_text(), field_name) / 1024


def bench(
    scale: Scale,
    repeats: int,
    log: Callable[[str], None],
    workdir: Path | None = None,
    running: bool = False,
) -> MemoryResults:
    with tempfile.TemporaryDirectory(prefix="gpuplace-memory-") as temporary:
        b = MemoryBench(scale, workdir or Path(temporary), log, running)
        try:
            b.setup()
            for repeat in range(1, repeats + 1):
                b.measure(repeat)
        finally:
            b.stop()
        return b.results


def measurements(scale: Scale, r: MemoryResults) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    result = [
        below(label, "controller start -> first bind", r.first_bind, "s", TARGET_FIRST_BIND_S),
        below(label, "controller VmHWM (peak RSS)", r.peak, "MiB", TARGET_RSS_MIB),
        below(
            label,
            "controller VmRSS at rest, every pod counted in its map's status",
            r.rss_at_rest,
            "MiB",
        ),
        below(label, "controller VmRSS at the first bind", r.rss_at_bind, "MiB", detail=True),
        below(label, "controller CPU, start -> first bind", r.first_bind_cpu, "s", detail=True),
        below(
            label,
            "controller start -> every pod counted in its map's status",
            r.statuses_s,
            "s",
            detail=True,
        ),
    ]
    for phase in r.phases:
        servers = sum(phase.cpu.get(name, 0.0) for name in SERVERS)
        what = f"writing the cluster: {phase.what}"
        result += [
            below(label, f"{what}, objects/s", [phase.objects / phase.seconds], "/s", detail=True),
            below(
                label,
                f"{what}, apiserver + etcd CPU each",
                [1000 * servers / phase.objects],
                "ms",
                detail=True,
            ),
        ]
    return result


def run(repeats: int, small: bool = False) -> list[Measurement]:
    scale = SMALL if small else DEFAULT
    # The cluster takes most of the time; each repeat is one controller start on it.
    return measurements(scale, bench(scale, min(repeats, 2), _stderr))


_stderr = log_to_stderr(NAME)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--nodes", type=int, default=DEFAULT.nodes)
    parser.add_argument("--pods", type=int, default=DEFAULT.pods)
    parser.add_argument("--repeats", type=int, default=1, help="controller starts (default 1)")
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    parser.add_argument(
        "--running",
        action="store_true",
        help="write each bound pod's status Running as a kubelet would (a third write a pod, "
        "the slowest: about 40/s on two cores)",
    )
    args = parser.parse_args(argv)
    scale = Scale(nodes=args.nodes, pods=args.pods, gpus=DEFAULT.gpus, slots_per_map=100)
    _stderr(f"machine: {describe(machine())}")
    results = bench(scale, args.repeats, _stderr, args.workdir, args.running)
    figures = measurements(scale, results)
    print_tables(figures)
    return 1 if any(m.ok is False for m in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
