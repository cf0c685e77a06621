"""Placing pods on one local control plane: gpuplace's binder, kube-scheduler, the Binding ceiling.

One cluster (etcd, kube-apiserver, kube-controller-manager, kwok) with 1,000 kwok nodes x 8 GPUs,
node inventories published as agents publish them (ConfigMap + Lease in gpuplace-inventory), the
real `gpuplace webhook` over HTTPS registered with the apiserver, the real `gpuplace controller`
(default settings), and 50 placement maps of 100 slots, one GPU each, spread over all nodes.
Each repeat runs, one contender at a time:

1. gpuplace, burst: a pod watch opens, then 16 threads create the 5,000 pods (labels gpuplace.io/map
   and gpuplace.io/index) through the webhook, as a controller would. Rate: pods / (first create
   sent -> last pod seen bound); latency: create sent -> the watch sees spec.nodeName, per pod
   (client clocks: creationTimestamp has whole seconds only), also split at the create's answer
   (the create itself; what the binding takes after it, and from the watch's first sight). The
   controller's CPU seconds over that window and its peak RSS (VmHWM, its bind processes'
   added); the admission latency of the webhook as the apiserver measured it
   (apiserver_admission_webhook_admission_duration_seconds, bucket deltas) and as the
   webhook measured it (gpuplace_webhook_admission_duration_seconds). The same burst then runs
   twice more: with the pod webhook's configuration deleted ("without it"), and with its entry
   pointed at the reference webhook (`bench/refwebhook`, Go's net/http over TLS, HTTP/1.1,
   answering every review with gpuplace's own patch for these pods, asked of gpuplace's webhook
   first): the apiserver does the same work as through gpuplace's, the server next to none, so
   "through the reference / without it" is the floor a webhook leaves on this machine and
   "gpuplace's / the reference" is the share that is gpuplace's server's.
2. gpuplace, backlog drain: the controller is stopped, the 5,000 pods are created, the controller
   starts. Rate: (pods - 1) / (first bound -> last bound), which leaves out process start-up and
   the creates, so it compares with the ceiling (3), which also only binds.
3. The ceiling, right after gpuplace's drain (the two sides of their ratio on the same cluster, one
   after the other): gpuplace's own pods, admitted by its webhook while its controller is stopped,
   then a minimal client (`bench._ceiling`: P processes x T threads, one keep-alive connection
   each, the pods split between the processes) that only POSTs their Bindings, carrying the same
   annotations as gpuplace's (a signature included, by a key nobody verifies): the same objects
   and the same writes as gpuplace's drain, with the same pod watch running and the rate read
   from it as in the drains. The best shape is found once, before the repeats: one process at
   32, 64, 128 and 256 threads, then 2, 4, ... processes (up to the machine's CPUs, at most 8)
   around the best so far while more processes help, so that the ceiling is the apiserver's
   rather than one Python process's where the machine has the cores.
4. kube-scheduler (client QPS raised to 5,000, burst 10,000) on the same pods, each pinned to the
   node its slot declares by required node affinity on kubernetes.io/hostname, burst and drain
   as above. A FlowSchema puts its requests in API Priority and Fairness' exempt level, where the
   admin user of gpuplace and of the ceiling client already is. gpuplace's controller is stopped
   meanwhile and kube-scheduler runs only here.

Between runs every pod is deleted with gracePeriodSeconds=0 and the namespace is emptied; pod
names differ per run. Everything shares the machine: on a small machine the figures are those of
the whole system, not of one component. The details table (and the JSON) has, per run, every
process's CPU seconds and the whole machine's (what no named process used is other work on the
machine), API requests per pod by verb and resource, and the idle background (kwok's node
heartbeats and leases).

`python -m bench.placement --nodes 100 --pods 500 --repeats 1` runs a small version;
`--only creates` runs only the webhook's part (the burst through the webhook, without it and
through the reference webhook, the steady 50 creates/s) and the rows it feeds;
`--profile DIR` samples the controller with py-spy (`python -m bench._stacks DIR/*.txt` sums it up);
`--budget S` starts no step (a burst, a steady rate, a drain, a repeat) more than S seconds after
the set-up, so that a machine lent for minutes prints the table of what ran: the figures of the
steps left out read "not run" (the ceiling search always runs whole).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from bench import (
    Budget,
    Measurement,
    above,
    below,
    describe,
    log_to_stderr,
    machine,
    print_tables,
)
from bench._ceiling import BindingClient, Shape
from bench._ceiling import search as ceiling_search
from bench._kube import (
    MACHINE,
    OTHERS,
    CpuMeter,
    CpuSampler,
    Obj,
    Observed,
    PodWatch,
    admission_review,
    call,
    concurrently,
    create_pods,
    delete_pods,
    expect,
    machine_busy,
    metrics,
    peak_rss_mib,
    process_cpu,
    profiling,
    run_queue_wait,
)
from bench._proc import BenchError
from bench._refwebhook import ReferenceWebhook
from bench._stats import (
    Buckets,
    bucket_delta,
    counter_delta,
    counter_totals,
    histogram_buckets,
    histogram_count,
    histogram_quantile,
    percentile,
    share_at_most,
)
from bench._traces import ETCD_SPAN, WEBHOOK_SPAN, SpanSink, trace_id
from gpuplace_dev.demo.components import Component, Components
from gpuplace_dev.localcluster import GPU_RESOURCE, FakeNode, LocalCluster
from gpuplace_dev.localcluster.layout import ClusterState
from kubeio import bodies
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.paths import CONFIGMAPS, FLOW_SCHEMAS, LEASES, MUTATING_WEBHOOKS, PODS
from kubeio.requests import prepare
from kubeio.times import now_micro
from placement.annotations import (
    ENV_CUDA_VISIBLE_DEVICES,
    INDEX_LABEL,
    MAP_LABEL,
    PLACEMENT_KEY,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
    BindingDecision,
    signed_binding,
)
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, GpuDevice, NodeInventory
from placement.keyring import RingKey
from placement.model import MODEL_NAMESPACE
from placement.types import GpuUuid, MapKey, NodeName
from webhook.manifests import POD_WEBHOOK

R = TypeVar("R")

NAME = "placement"
NAMESPACE = "bench"
SCHEDULER_NAME = "gpuplace"
UNSERVED_SCHEDULER = "bench-unserved"
PROBE = "bench-probe"
#: The AdmissionReview uid of the probe pod's review, asked of the webhook directly.
PROBE_UID = "00000000-0000-4000-8000-000000000001"
PRODUCT = "NVIDIA H100 80GB HBM3"
CREATE_THREADS = 16
#: Threads that keep a steady create rate (each create takes a few ms to tens of ms).
STEADY_THREADS = 8
#: Steady create rates for the webhook's latency as the apiserver sees it, and how long each runs.
STEADY_RATES = (25, 50, 100)
STEADY_SECONDS = 20.0
SETUP_THREADS = 16
#: The ceiling client's threads tried in one process; `bench._ceiling.search` then tries more.
CEILING_CONCURRENCY = (32, 64, 128, 256)
SCHEDULER_QPS = 5000.0
#: How long one run may take before it counts as failed (5,000 pods on two busy cores take ~30 s).
RUN_TIMEOUT = 600.0

#: How long the apiserver may take to export the spans of a run's creates (it batches every 5 s).
TRACE_WAIT = 20.0
#: Between runs, the apiserver's write rate must come back to within this of the idle rate
#: (kwok works through a run's pods for a while after they are deleted).
QUIESCE_MARGIN = 1.25
QUIESCE_SLACK = 5.0  # writes/s

TARGET_VS_SCHEDULER = 2.0
TARGET_VS_CEILING = 0.9
TARGET_CPU_PER_POD_MS = 0.6
#: In a drain's extra figures: the binder's CPU seconds per pod from its first bind to its last.
BINDING_CPU = "binder CPU per pod, first -> last bind"
#: The same for the binder's own process, its bind processes left out (equal without them).
LEADER_CPU = "binder's own process CPU per pod, first -> last bind"
#: The bench's own process, and the ceiling client's processes counted with it.
CLIENT = "bench client"
TARGET_STARTUP_S = 10.0
TARGET_P99_S = 1.0
#: The webhook's p99 at the steady rate against the same creates' etcd write p99 (both from the
#: apiserver's traces): what a create waits for the webhook, next to what it waits for storage.
TARGET_WEBHOOK_VS_ETCD_P99 = 2.0
#: A burst's creates/s through the webhook, against the same burst with the webhook unregistered.
TARGET_CREATES_RATIO = 0.85
#: The steady create rate at which the webhook's p99 is held to its target.
TARGET_STEADY_RATE = 50

#: The webhook's process in a run's CPU figures (with its server processes, if several).
WEBHOOK = "gpuplace webhook"
#: The apiserver's process in a run's CPU figures.
APISERVER = "kube-apiserver"
#: The processes whose CPU a drain also reports from its first bind to its last: the binder's
#: is set against what its Bindings and watches cost the control plane in the same stretch.
ETCD, KWOK = "etcd", "kwok"
WINDOWED = (APISERVER, ETCD, KWOK)
#: The reference webhook's CPU over its burst (seconds), in the burst's extra.
REFERENCE_CPU = "reference webhook CPU"
#: How many server processes the webhook runs (`gpuplace webhook --processes`).
PROCESSES_ENV = "GPUPLACE_WEBHOOK_PROCESSES"

APISERVER_WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
WEBHOOK_METRIC = "gpuplace_webhook_admission_duration_seconds"
APF_WAIT_METRIC = "apiserver_flowcontrol_request_wait_duration_seconds_sum"


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Scale:
    nodes: int = 1000
    pods: int = 5000
    gpus: int = 8
    slots_per_map: int = 100

    def __post_init__(self) -> None:
        if self.pods > self.nodes * self.gpus:
            raise ValueError(f"{self.pods} pods need more than {self.nodes} x {self.gpus} GPUs")
        if self.pods % self.slots_per_map:
            raise ValueError(f"pods ({self.pods}) must be a multiple of {self.slots_per_map}")

    @property
    def maps(self) -> int:
        return self.pods // self.slots_per_map

    @property
    def label(self) -> str:
        return f"{self.nodes:,} nodes x {self.gpus}, {self.pods:,} pods"

    def node(self, pod: int) -> str:
        """Pods fill GPU 0 of every node, then GPU 1, ...: each map spreads over many nodes."""
        return node_name(pod % self.nodes)

    def device(self, pod: int) -> int:
        return pod // self.nodes

    def map_index(self, pod: int) -> tuple[str, int]:
        return map_name(pod // self.slots_per_map), pod % self.slots_per_map

    def creation_order(self) -> list[int]:
        """Index 0 of every map, then index 1, ...: a burst touches every map, as many
        controllers scaling up at once would."""
        return sorted(range(self.pods), key=lambda p: (p % self.slots_per_map, p))


def node_name(n: int) -> str:
    return f"bench-node-{n:04d}"


def map_name(m: int) -> str:
    return f"bench-{m:03d}"


def pod_name(scale: Scale, pod: int, run: int) -> str:
    """Names differ between runs: kwok deletes pods by name and, when it lags, would otherwise
    delete the next run's pod of the same name."""
    name, index = scale.map_index(pod)
    return f"r{run}-{name}-{index}"


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{index:012x}"


def inventory(n: int, gpus: int) -> NodeInventory:
    return NodeInventory(
        NodeName(node_name(n)),
        tuple(
            GpuDevice(
                i,
                GpuUuid(gpu_uuid(n, i)),
                PRODUCT,
                81_559,
                f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )


def map_yaml(scale: Scale, m: int) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        "metadata:",
        f"  name: {map_name(m)}",
        f"  namespace: {NAMESPACE}",
        "spec:",
        "  placements:",
    ]
    for pod in range(m * scale.slots_per_map, (m + 1) * scale.slots_per_map):
        _, index = scale.map_index(pod)
        lines += [
            f"    - index: {index}",
            f"      node: {scale.node(pod)}",
            f"      devices: [{scale.device(pod)}]",
        ]
    return "\n".join(lines) + "\n"


def _pod(name: str, labels: dict[str, str], spec: Obj, resources: Obj | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench", **labels}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": resources or {},
                }
            ],
            **spec,
        },
    }


def gpuplace_pod(scale: Scale, pod: int, run: int) -> Obj:
    """A pod of a placement map. No nvidia.com/gpu request: gpuplace places GPUs itself and
    its pods must not take the device plugin's (see README, Honest limits)."""
    name, index = scale.map_index(pod)
    return _pod(
        pod_name(scale, pod, run),
        {MAP_LABEL: name, INDEX_LABEL: str(index)},
        {"schedulerName": SCHEDULER_NAME},
    )


def pinned_pod(scale: Scale, pod: int, run: int) -> Obj:
    """The same pod for kube-scheduler: pinned to its slot's node by required node affinity,
    and asking for its GPU the way pods placed by kube-scheduler do (nvidia.com/gpu: 1)."""
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [scale.node(pod)]}
        ]
    }
    required = {"nodeSelectorTerms": [term]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    gpu = {"limits": {GPU_RESOURCE: "1"}}
    return _pod(pod_name(scale, pod, run), {}, {"affinity": affinity}, gpu)


#: The key the reference clients (the ceiling, the DRA minimal client) sign their Bindings with:
#: annotations of the size and shape of gpuplace's, which no controller verifies.
REFERENCE_KEY = RingKey(b"bench-reference-binding-key-0000", "2026-01-01T00:00:00Z")


def binding(scale: Scale, pod: int, run: int, uid: str = "", cuda: str | None = None) -> Obj:
    """What gpuplace's binder POSTs for this pod: the target node and its annotations, the
    signature included (`cuda`: CUDA_VISIBLE_DEVICES when not the host index, as in dra)."""
    map_name, index = scale.map_index(pod)
    node = scale.node(pod)
    uuid = gpu_uuid(pod % scale.nodes, scale.device(pod))
    decision = BindingDecision(
        MapKey(NAMESPACE, map_name),
        index,
        NodeName(node),
        (GpuUuid(uuid),),
        str(scale.device(pod)) if cuda is None else cuda,
        1,
    )
    annotations = signed_binding(REFERENCE_KEY.secret, REFERENCE_KEY.id, uid, NAMESPACE, decision)
    return bodies.binding(pod_name(scale, pod, run), NAMESPACE, uid, node, annotations)


# --------------------------------------------------------------------------- one run's figures


@dataclass(frozen=True)
class RunResult:
    """One run of one contender: throughput, latency (burst only) and CPU of every process."""

    rate: float
    seconds: float
    p50: float | None = None
    p99: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    #: Per pod placed: API requests by verb and resource (apiserver_request_total), seconds
    #: waited in API Priority and Fairness queues by priority level.
    requests: dict[str, float] = field(default_factory=dict)
    #: Pods the run bound.
    pods: int = 0

    def line(self) -> str:
        """The run in one log line."""
        latency = f", p50 {self.p50:.3f} s, p99 {self.p99:.3f} s" if self.p50 is not None else ""
        if CREATE_P99 in self.extra:
            latency += (
                f" (the create p99 {self.extra[CREATE_P99]:.3f} s; "
                f"answered -> bound p99 {self.extra[AFTER_CREATE_P99]:.3f} s, "
                f"first seen -> bound {self.extra.get(SEEN_P99, math.nan):.3f} s)"
            )
        return f"{self.rate:,.0f} pods/s{latency}"


@dataclass(frozen=True)
class Usage:
    """What a run cost: CPU seconds by process, apiserver requests per pod, over `seconds`."""

    cpu: dict[str, float]
    requests: dict[str, float]
    seconds: float
    #: The control plane's processes sampled through the run (`WINDOWED`), so that a drain can
    #: say what each spent between its first bind and its last, as it does of the binder.
    samplers: dict[str, CpuSampler] = field(default_factory=dict)

    def add(self, process: str, seconds: float) -> None:
        """Names the CPU of a process that started during the run (the machine total has it)."""
        self.cpu[process] = seconds
        self.cpu[OTHERS] -= seconds

    def charge(self, process: str, seconds: float) -> None:
        """Counts as `process`'s the CPU of helpers that were not named when the run began
        (the ceiling client's processes): the machine total has it."""
        self.cpu[process] = self.cpu.get(process, 0.0) + seconds
        self.cpu[OTHERS] -= seconds

    def with_watcher(self, seen: Observed) -> dict[str, float]:
        """The CPU figures with the pod watcher's own, which the machine total already holds."""
        cpu = dict(self.cpu)
        cpu["bench pod watch"] = seen.cpu
        cpu[OTHERS] -= seen.cpu
        return cpu

    @property
    def busy(self) -> float:
        """The share of all cores that the whole machine used."""
        return self.cpu[MACHINE] / (self.seconds * (os.cpu_count() or 1))


#: A burst's extra figures that split its create -> bound latency at the create's answer: the
#: create itself (the webhook's round trip and the apiserver's write) and what follows it (the
#: watch event to the binder, its decision, the Binding, the bound pod's event to the bench).
CREATE_P99, AFTER_CREATE_P50, AFTER_CREATE_P99 = (
    "create sent -> answered p99 s",
    "create answered -> bound p50 s",
    "create answered -> bound p99 s",
)
#: The part of the latter from the bench's watch's first sight of the pod: the binder's share
#: (its own watch event, decision and Binding) and the bound pod's event.
SEEN_P99 = "first seen -> bound p99 s"


def burst_result(
    sent: dict[str, float],
    seen: Observed,
    usage: Usage,
    answered: dict[str, float] | None = None,
) -> RunResult:
    """A burst's figures; with `answered` (each create's answer, as `create_pods` notes it), its
    latency split at the answer (`CREATE_P99`, `AFTER_CREATE_P50`, `AFTER_CREATE_P99`)."""
    latencies = [seen.bound[name] - t for name, t in sent.items()]
    seconds = max(seen.bound[name] for name in sent) - min(sent.values())
    creating = max(sent.values()) - min(sent.values())
    split: dict[str, float] = {}
    if answered:
        creates = [answered[name] - t for name, t in sent.items()]
        after = [seen.bound[name] - answered[name] for name in sent]
        split = {
            CREATE_P99: percentile(creates, 0.99),
            AFTER_CREATE_P50: percentile(after, 0.5),
            AFTER_CREATE_P99: percentile(after, 0.99),
        }
        if seen_first := [
            seen.bound[name] - seen.added[name] for name in sent if name in seen.added
        ]:
            split[SEEN_P99] = percentile(seen_first, 0.99)
    return RunResult(
        rate=len(sent) / seconds,
        seconds=seconds,
        pods=len(sent),
        p50=percentile(latencies, 0.5),
        p99=percentile(latencies, 0.99),
        cpu=usage.with_watcher(seen),
        extra={
            "creates_per_s": len(sent) / creating if creating > 0 else float("inf"),
            "machine_busy_share": usage.busy,
            "pod watch restarts": float(seen.restarts),
            **split,
        },
        requests=usage.requests,
    )


def drain_result(seen: Observed, started: float, usage: Usage) -> RunResult:
    times = sorted(seen.bound.values())
    seconds = times[-1] - times[0]
    windowed = {
        window_cpu(name): sampler.between(times[0], times[-1]) / max(1, len(times) - 1)
        for name, sampler in usage.samplers.items()
    }
    return RunResult(
        rate=(len(times) - 1) / seconds if seconds > 0 else float("inf"),
        seconds=seconds,
        pods=len(times),
        cpu=usage.with_watcher(seen),
        requests=usage.requests,
        extra={
            "machine_busy_share": usage.busy,
            "pod watch restarts": float(seen.restarts),
            "start_to_first_bound_s": times[0] - started,
            "start_to_all_bound_s": times[-1] - started,
            **windowed,
        },
    )


def window_cpu(process: str) -> str:
    """The name of a drain's extra figure: `process`'s CPU seconds per pod, first to last bind."""
    return f"{process} CPU per pod, first -> last bind"


@dataclass(frozen=True)
class Admission:
    """Admission latency histograms (bucket deltas over one burst)."""

    apiserver: Buckets
    webhook: Buckets
    #: Creates per second as sent (a burst: as fast as the threads went).
    rate: float = float("nan")
    #: Seconds the webhook's threads waited for a CPU (runnable, not running) per admission.
    webhook_wait: float = float("nan")
    #: CPU seconds per second the whole machine was busy while the pods were created.
    machine_busy: float = float("nan")
    #: Each webhook call as the apiserver's trace timed it (seconds), of `creates` creates.
    traced: tuple[float, ...] = ()
    creates: int = 0
    #: The same creates' etcd writes as the apiserver's traces timed them (seconds): no gpuplace
    #: code runs there, so their tail is what the machine adds to any request.
    etcd: tuple[float, ...] = ()


# --------------------------------------------------------------------------- the bench


class PlacementBench:
    """Sets the cluster and gpuplace up once; runs the contenders on it."""

    #: gpuplace's `--enforcement`.
    enforcement = "env"

    def __init__(
        self,
        scale: Scale,
        workdir: Path,
        log: Callable[[str], None],
        profile_dir: Path | None = None,
    ) -> None:
        self.scale = scale
        self.profile_dir = profile_dir
        self.workdir = workdir
        self.log = log
        #: The apiserver's spans of the admissions the bench traces (`admission_at`).
        self.spans = SpanSink(workdir / "spans")
        self.cluster = LocalCluster(
            workdir / "cluster",
            scheduler_qps=SCHEDULER_QPS,
            namespaces=[NAMESPACE],
            trace_endpoint=self.spans.start(),
        )
        self.components: Components | None = None
        self.controller: Component | None = None
        self.webhook: Component | None = None
        self.controller_peak_mib = 0.0
        #: The inventories' Leases: nothing renews them here, so they last the bench.
        self.lease_seconds = 24 * 3600
        self._webhook_kube: Kube | None = None
        self._runs = 0
        #: The pod watchers started so far: their CPU is reported apart ("bench pod watch"),
        #: never under the benchmark process that started them.
        self._watchers: set[int] = set()
        #: Writes per second with nothing to place, as `idle` measured them (None before).
        self._idle_writes: float | None = None
        self._phases: dict[str, int] = {}

    # -- set-up ----------------------------------------------------------------------------------
    def setup(self) -> None:
        began = time.monotonic()
        cluster = self.cluster.start()
        for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
            cluster.create_namespace(namespace)
        self.exempt_scheduler()
        self.log(f"control plane up in {cluster.startup_seconds:.1f} s")
        scale = self.scale
        cluster.create_nodes(
            [FakeNode(node_name(n), gpus=scale.gpus) for n in range(scale.nodes)], timeout=300
        )
        self.log(f"{scale.nodes} nodes Ready after {time.monotonic() - began:.1f} s")
        self.publish_inventories()
        self.log(f"inventories published after {time.monotonic() - began:.1f} s")
        self.components = Components(cluster, self.workdir)
        self.webhook = self.components.webhook(self.enforcement)
        cluster.wait_for("the webhook configurations", self._webhook_registered, 60)
        self.start_controller()
        self.apply_maps()
        cluster.wait_for(
            lambda: f"every placement map Valid (phases: {self._phases})",
            self._maps_valid,
            300,
            interval=0.5,
        )
        cluster.wait_for(
            "the webhook to load the model", lambda: self._webhook_maps() >= scale.maps, 120
        )
        self.log(f"gpuplace ready after {time.monotonic() - began:.1f} s")

    def exempt_scheduler(self) -> None:
        """Puts kube-scheduler's requests in API Priority and Fairness' exempt level, where the
        admin user of gpuplace's controller and of the ceiling client already is: otherwise its
        bindings and events queue behind the workload-high level's share of the apiserver and
        the comparison measures APF, not the scheduler."""
        body = {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": "bench-kube-scheduler-exempt"},
            "spec": {
                # Below the built-in kube-scheduler FlowSchema's precedence (800): matched first.
                "matchingPrecedence": 100,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [
                    {
                        "subjects": [{"kind": "User", "user": {"name": "system:kube-scheduler"}}],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        }
        call(self.cluster, "POST", FLOW_SCHEMAS.collection(), body, wanted={201}, what="FlowSchema")

    def publish_inventories(self) -> None:
        """What every node's agent writes: its inventory ConfigMap and its liveness Lease."""
        ns = INVENTORY_NAMESPACE
        now = now_micro()

        def publish(n: int) -> None:
            inv = inventory(n, self.scale.gpus)
            configmap = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": inv.node, "namespace": ns},
                "data": {INVENTORY_KEY: inv.to_json()},
            }
            call(self.cluster, "POST", CONFIGMAPS.collection(ns), configmap, wanted={201})
            # Agents renew every interval; here nothing renews, so the lease lasts the bench.
            spec = bodies.lease_spec(f"agent-{inv.node}", self.lease_seconds, now, now, 0)
            lease = bodies.lease(inv.node, ns, spec)
            call(self.cluster, "POST", LEASES.collection(ns), lease, wanted={201})

        concurrently(list(range(self.scale.nodes)), publish, SETUP_THREADS)

    def apply_maps(self) -> None:
        def apply(m: int) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": map_name(m),
                    "namespace": NAMESPACE,
                    "labels": {PLACEMENT_MAP_LABEL: "true"},
                },
                "data": {PLACEMENT_KEY: map_yaml(self.scale, m)},
            }
            call(self.cluster, "POST", CONFIGMAPS.collection(NAMESPACE), body, wanted={201})

        concurrently(list(range(self.scale.maps)), apply, SETUP_THREADS)

    def _webhook_registered(self) -> bool:
        status, body = self.cluster.request("GET", f"{MUTATING_WEBHOOKS.collection()}?limit=10")
        return status == 200 and any(
            w.get("name") == POD_WEBHOOK for c in body["items"] for w in c.get("webhooks") or []
        )

    def _maps_valid(self) -> bool:
        path = f"{CONFIGMAPS.collection(NAMESPACE)}?labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
        status, body = self.cluster.request("GET", path)
        if status != 200:
            return False
        phases = []
        for item in body["items"]:
            text = (item["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
            phases.append(json.loads(text).get("phase") if text else None)
        # Maps can be Degraded for a moment while the controller is still reading inventories.
        self._phases = {str(p): phases.count(p) for p in set(phases)}
        return len(phases) == self.scale.maps and all(p == "Valid" for p in phases)

    def _webhook_metrics(self) -> str:
        if self._webhook_kube is None:
            assert self.components is not None
            server = f"https://127.0.0.1:{self.components.webhook_port}"
            self._webhook_kube = self.cluster.admin_client(server)
        return metrics(self._webhook_kube)

    def _webhook_maps(self) -> float:
        try:
            text = self._webhook_metrics()
        except (APIError, BenchError):  # not serving yet
            return 0.0
        for line in text.splitlines():
            if line.startswith("gpuplace_webhook_model_maps "):
                return float(line.split()[1])
        return 0.0

    def apiserver_metrics(self) -> str:
        return metrics(self.cluster.kube)

    def storage(self) -> str:
        """What etcd holds: its database file (as the apiserver reports it), its revision (every
        write since the cluster started; every 5 minutes the apiserver compacts the history up to
        the revision of its tick before) and the Events kept (each lives an hour)."""
        metric = "apiserver_storage_size_bytes"
        size = sum(counter_totals(self.apiserver_metrics(), metric, ()).values())
        status, body = self.cluster.request("GET", "/api/v1/events?limit=1")
        expect(status, body, (200,), "listing events")
        meta = body.get("metadata") or {}
        events = len(body.get("items") or []) + int(meta.get("remainingItemCount") or 0)
        return (
            f"etcd's database {size / 2**20:,.0f} MiB at revision {int(meta['resourceVersion']):,}; "
            f"{events:,} events stored"
        )

    def _webhook_buckets(self) -> Buckets:
        return histogram_buckets(self._webhook_metrics(), WEBHOOK_METRIC)

    # -- processes -------------------------------------------------------------------------------
    def start_controller(self) -> Component:
        assert self.components is not None
        self.controller = self.components.controller(self.enforcement)
        return self.controller

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.note_controller_peak()
            self.controller.stop()
            self.controller = None

    def note_controller_peak(self) -> None:
        if self.controller is not None and self.controller.proc is not None:
            pid = self.controller.proc.pid
            self.controller_peak_mib = max(self.controller_peak_mib, peak_rss_mib(pid))

    def webhook_peak_mib(self) -> float:
        if self.webhook is None or self.webhook.proc is None:
            return float("nan")
        return peak_rss_mib(self.webhook.proc.pid)

    def pids(self) -> dict[str, int]:
        """Every process that takes part: the control plane, gpuplace, this benchmark."""
        state = ClusterState.read(self.cluster.layout.state_file)
        pids = {record.name: record.pid for record in state.processes}
        if self.webhook is not None and self.webhook.proc is not None:
            pids["gpuplace webhook"] = self.webhook.proc.pid
        if self.controller is not None and self.controller.proc is not None:
            pids["gpuplace controller"] = self.controller.proc.pid
        pids[CLIENT] = os.getpid()
        return pids

    def _watch(self) -> PodWatch:
        return self._watching(PodWatch(self.cluster, NAMESPACE, self.scale.pods, RUN_TIMEOUT))

    def _watching(self, watch: PodWatch) -> PodWatch:
        """`watch`, its process left out of the CPU of the benchmark process, which started it:
        counted there, the CPU it used before it exited would vanish from the run's figures."""
        self._watchers.add(watch.pid)
        return watch

    def _controller_pid(self) -> int:
        if self.controller is None or self.controller.proc is None:
            raise BenchError("the gpuplace controller is not running")
        return self.controller.proc.pid

    def _profile(self, what: str) -> Path | None:
        if self.profile_dir is None:
            return None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        return self.profile_dir / f"controller-{what}-run{self._runs}.txt"

    @contextlib.contextmanager
    def _measuring(
        self, usage: list[Usage], metrics: list[str], apart: Collection[int] = ()
    ) -> Iterator[None]:
        """Appends to `usage` what the block cost and to `metrics` the apiserver's /metrics
        before and after it; processes `apart` are not counted (see `CpuMeter`)."""
        metrics.append(self.apiserver_metrics())
        pids = self.pids()
        samplers = {name: CpuSampler(pids[name]) for name in WINDOWED if name in pids}
        meter = CpuMeter(pids, set(apart) | self._watchers).start()
        began = time.monotonic()
        try:
            yield
        finally:
            for sampler in samplers.values():
                sampler.stop()
        cpu = meter.stop(started=self.pids().values())
        seconds = time.monotonic() - began
        metrics.append(self.apiserver_metrics())
        by = ("verb", "resource", "subresource")
        before, after = (counter_totals(text, "apiserver_request_total", by) for text in metrics)
        requests = {
            f"requests per pod: {verb} {resource}{'/' + sub if sub else ''}": count
            / self.scale.pods
            for (verb, resource, sub), count in counter_delta(before, after).items()
            if count >= self.scale.pods / 100
        }
        # API Priority and Fairness: time requests waited in the queues of each priority level
        # (kube-scheduler's user is not exempt as the admin user of gpuplace and the ceiling is).
        level = ("priority_level",)
        waited = counter_delta(*(counter_totals(text, APF_WAIT_METRIC, level) for text in metrics))
        requests |= {
            f"APF queue wait per pod ({name})": seconds / self.scale.pods
            for (name,), seconds in waited.items()
            if seconds > 0.001
        }
        usage.append(Usage(cpu, requests, seconds, samplers))

    def _pods(self, build: Callable[[Scale, int, int], Obj]) -> tuple[int, list[Obj]]:
        """A new run's number and its pods, in creation order."""
        self._runs += 1
        return self._runs, [build(self.scale, p, self._runs) for p in self.scale.creation_order()]

    def _clear(self, pods: Sequence[Obj]) -> None:
        names = [pod["metadata"]["name"] for pod in pods]
        delete_pods(self.cluster, NAMESPACE, names, CREATE_THREADS, RUN_TIMEOUT)
        self._quiesce()

    def _pod_writes(self) -> float:
        totals = counter_totals(self.apiserver_metrics(), "apiserver_request_total", ("verb",))
        return sum(totals.get((verb,), 0.0) for verb in ("DELETE", "PATCH", "PUT", "POST"))

    def background_writes(self) -> float:
        """The write rate a run waits for before the next starts: what `idle` measured with
        nothing to place (kwok's node leases and status, and whatever else runs then) and a
        margin, or a generous guess before `idle` ran."""
        if self._idle_writes is not None:
            return self._idle_writes * QUIESCE_MARGIN + QUIESCE_SLACK
        return self.background_guess()

    def background_guess(self) -> float:
        return self.scale.nodes / 5

    def _quiesce(self, quiet: float = 3.0, timeout: float = 120.0) -> None:
        """Waits until the apiserver's write rate is back to the idle background (node heartbeats):
        kwok works through the pods of a run (status updates, deletes of pods already gone) for
        a while after they are gone, and the next run must not pay for that."""
        background = self.background_writes()
        began = time.monotonic()
        last, since = self._pod_writes(), began
        while time.monotonic() < began + timeout:
            time.sleep(quiet)
            now = self._pod_writes()
            if (now - last) / (time.monotonic() - since) <= background:
                waited = time.monotonic() - began
                if waited > quiet * 3:
                    self.log(
                        f"  (the apiserver came back to its idle write rate in {waited:.0f} s)"
                    )
                return
            last, since = now, time.monotonic()
        self.log(f"the apiserver was still busy writing {timeout:.0f} s after a run")

    # -- contenders ------------------------------------------------------------------------------
    def gpuplace_burst(self) -> tuple[RunResult, Admission]:
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)
        _, pods = self._pods(gpuplace_pod)
        usage: list[Usage] = []
        metrics: list[str] = []
        watch = self._watch()
        try:
            webhook_before = self._webhook_buckets()
            with (
                self._measuring(usage, metrics),
                profiling(self._controller_pid(), self._profile("burst")),
            ):
                answered: dict[str, float] = {}
                sent = create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS, answered=answered)
                seen = watch.wait()
            webhook_after = self._webhook_buckets()
        finally:
            watch.stop()
        self.note_controller_peak()
        apiserver_before, apiserver_after = (
            histogram_buckets(text, APISERVER_WEBHOOK_METRIC, {"name": POD_WEBHOOK})
            for text in metrics
        )
        admission = Admission(
            bucket_delta(apiserver_before, apiserver_after),
            bucket_delta(webhook_before, webhook_after),
        )
        self._clear(pods)
        return burst_result(sent, seen, usage[0], answered), admission

    def gpuplace_burst_unhooked(self) -> RunResult:
        """The same burst with the pod webhook unregistered: what creating the pods costs the
        apiserver without the webhook's round trip, in the same run. The pods already carry the
        schedulerName the webhook would set (the pod-bindings policy refuses a map's pod without
        it), and the controller binds them as in the burst."""
        configurations = [
            c
            for c in call(self.cluster, "GET", MUTATING_WEBHOOKS.collection())["items"]
            if any(w.get("name") == POD_WEBHOOK for w in c.get("webhooks") or [])
        ]
        for configuration in configurations:
            name = configuration["metadata"]["name"]
            call(self.cluster, "DELETE", MUTATING_WEBHOOKS.item(name), wanted={200})
        try:
            self.cluster.wait_for(
                "the apiserver to stop calling the pod webhook",
                lambda: not self._pod_webhook_called(),
                60,
            )
            result = self._burst(gpuplace_pod)
        finally:
            for configuration in configurations:
                metadata = {
                    k: v
                    for k, v in configuration["metadata"].items()
                    if k in ("name", "labels", "annotations")
                }
                body = {**configuration, "metadata": metadata}
                call(self.cluster, "POST", MUTATING_WEBHOOKS.collection(), body, wanted={201})
            self.cluster.wait_for(
                "the apiserver to call the pod webhook again", self._pod_webhook_called, 60
            )
        return result

    def gpuplace_patch(self) -> list[Obj]:
        """The JSON patch gpuplace's webhook answers a map's pod with, asked directly as the
        apiserver asks it (the probe pod's AdmissionReview)."""
        self._webhook_metrics()  # connects
        assert self._webhook_kube is not None
        probe = gpuplace_pod(self.scale, 0, 0)
        probe["metadata"] |= {"name": PROBE, "namespace": NAMESPACE}
        review = admission_review("Pod", "pods", probe, PROBE_UID, user="bench")
        response = self._webhook_kube.send(prepare("POST", "/mutate", body=review))
        if response.status != 200:
            raise BenchError(f"gpuplace's webhook answered HTTP {response.status}")
        answer = json.loads(response.data)["response"]
        if not answer.get("allowed") or not answer.get("patch"):
            raise BenchError(f"gpuplace's webhook did not patch the probe pod: {answer}")
        patch: list[Obj] = json.loads(base64.b64decode(answer["patch"]))
        return patch

    def reference_burst(self) -> RunResult:
        """The same burst with the pod webhook's entry pointed at the reference webhook (Go, one
        fixed answer: gpuplace's patch for these pods): the apiserver does the same work as
        with gpuplace's webhook, the server next to none. Its CPU is in the result's extra."""
        with self._through_reference() as reference:
            cpu = process_cpu(reference.pid)
            result = self._burst(gpuplace_pod, apart=[reference.pid])
            cpu = process_cpu(reference.pid) - cpu
        return replace(result, extra=result.extra | {REFERENCE_CPU: cpu})

    def reference_admission_at(self, rate: float, count: int) -> Admission:
        """`admission_at` with the pod webhook's entry pointed at the reference webhook: what a
        webhook call costs on this machine when the server does next to nothing (its traces'
        p99 against gpuplace's at the same rate)."""
        with self._through_reference():
            return self.admission_at(rate, count)

    @contextlib.contextmanager
    def _through_reference(self) -> Iterator[ReferenceWebhook]:
        """The apiserver calls the reference webhook for the block (gpuplace's again after)."""
        pair = self.cluster.ca.issue_server("gpuplace-bench-refwebhook")
        cert, key = self.workdir / "refwebhook.crt", self.workdir / "refwebhook.key"
        pair.write(cert, key)
        with ReferenceWebhook(
            self.workdir, self.gpuplace_patch(), cert, key, self.cluster.ca_file
        ) as reference:
            original = self._point_pod_webhook(reference.url)
            try:
                self.cluster.wait_for(
                    "the apiserver to call the reference webhook",
                    lambda: self._pod_webhook_called() and reference.reviews() > 0,
                    60,
                )
                yield reference
            finally:
                self._point_pod_webhook(original)
            before = histogram_count(self._webhook_buckets())
            self.cluster.wait_for(
                "the apiserver to call gpuplace's webhook again",
                lambda: (
                    self._pod_webhook_called() and histogram_count(self._webhook_buckets()) > before
                ),
                60,
            )

    def _point_pod_webhook(self, server: str) -> str:
        """Points the pod webhook's entry at `server` (scheme, host and port; the path stays);
        returns where it pointed before."""
        for configuration in call(self.cluster, "GET", MUTATING_WEBHOOKS.collection())["items"]:
            for webhook in configuration.get("webhooks") or []:
                if webhook.get("name") != POD_WEBHOOK:
                    continue
                before = urllib.parse.urlsplit(webhook["clientConfig"]["url"])
                after = urllib.parse.urlsplit(server)
                webhook["clientConfig"]["url"] = before._replace(
                    scheme=after.scheme, netloc=after.netloc
                ).geturl()
                name = configuration["metadata"]["name"]
                call(self.cluster, "PUT", MUTATING_WEBHOOKS.item(name), configuration)
                return f"{before.scheme}://{before.netloc}"
        raise BenchError(f"no mutating webhook configuration has the entry {POD_WEBHOOK}")

    def _pod_webhook_called(self) -> bool:
        """Whether a map's pod gets the webhook's wiring now (a server-side dry run)."""
        probe = gpuplace_pod(self.scale, 0, 0)
        probe["metadata"]["name"] = "webhook-probe"
        path = f"{PODS.collection(NAMESPACE)}?dryRun=All"
        status, body = self.cluster.request("POST", path, probe)
        if status != 201:
            return False
        env = body["spec"]["containers"][0].get("env") or []
        return any(e.get("name") == ENV_CUDA_VISIBLE_DEVICES for e in env)

    def gpuplace_drain(self) -> RunResult:
        self.stop_controller()
        self.cluster.stop_scheduler()
        return self._drain(gpuplace_pod, "gpuplace controller", self.start_controller)

    def _drain(
        self, build: Callable[[Scale, int, int], Obj], binder: str, start: Callable[[], object]
    ) -> RunResult:
        """A backlog: the run's pods exist, then `start` starts the `binder` process; its CPU
        counts from its start (a new process: start-up included)."""
        _, pods = self._pods(build)
        create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
        usage: list[Usage] = []
        watch = self._watch()
        try:
            with self._measuring(usage, []):
                started = time.monotonic()
                start()
                pid = self.pids()[binder]
                sampler, own = CpuSampler(pid), CpuSampler(pid, descendants=False)
                profile = self._profile("drain") if binder == "gpuplace controller" else None
                with profiling(pid, profile):
                    seen = watch.wait()
                sampler.stop()
                own.stop()
            usage[0].add(binder, process_cpu(pid))
        finally:
            watch.stop()
        self.note_controller_peak()
        self._clear(pods)
        result = drain_result(seen, started, usage[0])
        times = sorted(seen.bound.values())
        per_pod = {
            key: meter.between(times[0], times[-1]) / max(1, len(times) - 1)
            for key, meter in ((BINDING_CPU, sampler), (LEADER_CPU, own))
        }
        return replace(result, extra=result.extra | per_pod)

    def admission_one_at_a_time(self, count: int = 300) -> Admission:
        """The webhook's latency with one pod create at a time: in a burst the apiserver's own
        CPU is saturated and its figure for the webhook call holds the apiserver's wait for a
        CPU as well; here it is close to the webhook's own cost plus a TLS round trip."""
        return self.admission_at(None, count)

    def admission_at(self, rate: float | None, count: int) -> Admission:
        """The webhook's latency with `count` pods created at a steady `rate` per second (below
        saturation, as pods arrive when controllers scale up), or one at a time (None); the
        pods are bound meanwhile, as in production."""
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)
        _, pods = self._pods(gpuplace_pod)
        pods = pods[: min(count, len(pods))]
        threads = 1 if rate is None else STEADY_THREADS
        metrics = [self.apiserver_metrics()]
        webhook_before = self._webhook_buckets()
        webhook_pid = self.pids()["gpuplace webhook"]
        wait, busy, began = _tree_wait(webhook_pid), machine_busy(), time.monotonic()
        sent = create_pods(self.cluster, NAMESPACE, pods, threads, rate, traced=True)
        wait, busy = _tree_wait(webhook_pid) - wait, machine_busy() - busy
        busy /= time.monotonic() - began
        webhook_after = self._webhook_buckets()
        seconds = max(sent.values()) - min(sent.values())
        achieved = (len(sent) - 1) / seconds if seconds > 0 else float("inf")
        metrics.append(self.apiserver_metrics())
        apiserver_before, apiserver_after = (
            histogram_buckets(text, APISERVER_WEBHOOK_METRIC, {"name": POD_WEBHOOK})
            for text in metrics
        )
        spans = self.spans.take(
            (WEBHOOK_SPAN, ETCD_SPAN), [trace_id(name) for name in sent], TRACE_WAIT
        )
        self._clear(pods)
        apiserver = bucket_delta(apiserver_before, apiserver_after)
        return Admission(
            apiserver,
            bucket_delta(webhook_before, webhook_after),
            achieved,
            wait / max(1.0, histogram_count(apiserver)),
            busy,
            tuple(c.seconds for c in spans[WEBHOOK_SPAN] if c.attribute("webhook") == POD_WEBHOOK),
            len(sent),
            tuple(c.seconds for c in spans[ETCD_SPAN]),
        )

    def ready(self, who: str, build: Callable[[Scale, int, int], Obj]) -> None:
        """A binder that was just started has synced its caches once it binds a probe pod: a
        burst must not time its start-up."""
        probe = build(self.scale, 0, 0)
        probe["metadata"]["name"] = PROBE
        self.wait_probe_bound(who, probe)
        delete_pods(self.cluster, NAMESPACE, [PROBE], 1)

    def wait_probe_bound(self, who: str, probe: Obj) -> None:
        """Creates the probe pod and waits until `who` has bound it."""
        call(self.cluster, "POST", PODS.collection(NAMESPACE), probe, wanted={201}, what="probe")

        def bound() -> bool:
            _, pod = self.cluster.request("GET", PODS.item(PROBE, NAMESPACE))
            return bool(pod.get("spec", {}).get("nodeName"))

        self.cluster.wait_for(f"{who} to bind a probe pod", bound, 120, interval=0.1)

    def scheduler_burst(self) -> RunResult:
        self.stop_controller()
        self.cluster.start_scheduler()
        self.ready("kube-scheduler", pinned_pod)
        return self._burst(pinned_pod)

    def _burst(
        self, build: Callable[[Scale, int, int], Obj], apart: Collection[int] = ()
    ) -> RunResult:
        """A run's pods created by `CREATE_THREADS` threads as fast as they go, timed until the
        watch has seen every one bound; then cleared. `apart`: as in `_measuring`."""
        _, pods = self._pods(build)
        usage: list[Usage] = []
        watch = self._watch()
        try:
            with self._measuring(usage, [], apart):
                answered: dict[str, float] = {}
                sent = create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS, answered=answered)
                seen = watch.wait()
        finally:
            watch.stop()
        self._clear(pods)
        return burst_result(sent, seen, usage[0], answered)

    def scheduler_drain(self) -> RunResult:
        self.stop_controller()
        self.cluster.stop_scheduler()
        try:
            return self._drain(pinned_pod, "kube-scheduler", self.cluster.start_scheduler)
        finally:
            self.cluster.stop_scheduler()

    def ceiling(self, shape: Shape) -> RunResult:
        """Only Bindings, from the minimal client in `shape`, for pods created beforehand: the
        same pods as gpuplace's (admitted by its webhook while its controller is stopped), bound
        with the same annotations, so that both bind the same objects."""
        self.stop_controller()
        self.cluster.stop_scheduler()
        run, pods = self._pods(gpuplace_pod)
        create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
        bindings = [binding(self.scale, pod, run) for pod in self.scale.creation_order()]
        usage: list[Usage] = []
        # The same pod watch as in the drains: it loads the apiserver as much here as there, and
        # the rate is read from it the same way.
        watch = self._watch()
        try:
            client = BindingClient(self.cluster, bindings, shape, self.workdir / "ceiling")
            with client, self._measuring(usage, [], apart=client.pids):
                started = time.monotonic()
                client.go()
                posted = client.wait(RUN_TIMEOUT)
                seen = watch.wait()
        finally:
            watch.stop()
        # The client's processes: CPU of the bench client, as when it was one thread pool here.
        usage[0].charge(CLIENT, posted.cpu)
        self._clear(pods)
        result = drain_result(seen, started, usage[0])
        return replace(
            result,
            p50=posted.p(0.5),
            p99=posted.p(0.99),
            extra=result.extra
            | {
                "processes": float(shape.processes),
                "threads per process": float(shape.threads),
                "client pods/s": posted.rate,
                "client processes' CPU": posted.cpu,
            },
        )

    def idle(self, seconds: float = 10.0, settle: float = 15.0) -> dict[str, float]:
        """CPU seconds per second each process uses with nothing to place, once the set-up has
        settled: the background the runs share the machine with (kwok's node heartbeats and
        leases, controllers' resyncs)."""
        time.sleep(settle)
        writes, meter = self._pod_writes(), CpuMeter(self.pids()).start()
        time.sleep(seconds)
        used = meter.stop()
        self._idle_writes = (self._pod_writes() - writes) / seconds
        self.log(f"idle: {self._idle_writes:,.0f} writes/s to the apiserver")
        return {name: cpu / seconds for name, cpu in used.items()}

    def stop(self) -> None:
        if self.components is not None:
            self.note_controller_peak()
            self.components.stop()
        self.cluster.stop()
        self.spans.stop()


# --------------------------------------------------------------------------- reporting


@dataclass
class Results:
    gpuplace_burst: list[RunResult] = field(default_factory=list)
    #: The same burst with the pod webhook unregistered (creates/s without it).
    gpuplace_burst_unhooked: list[RunResult] = field(default_factory=list)
    #: The same burst through the reference webhook (Go, a fixed answer: gpuplace's patch).
    reference_burst: list[RunResult] = field(default_factory=list)
    gpuplace_drain: list[RunResult] = field(default_factory=list)
    scheduler_burst: list[RunResult] = field(default_factory=list)
    scheduler_drain: list[RunResult] = field(default_factory=list)
    ceiling: list[RunResult] = field(default_factory=list)
    #: The ceiling's search: pods/s of each shape of the minimal client tried.
    ceiling_search: dict[Shape, float] = field(default_factory=dict)
    idle_cpu: dict[str, float] = field(default_factory=dict)
    admission: list[Admission] = field(default_factory=list)
    admission_sequential: list[Admission] = field(default_factory=list)
    admission_steady: dict[int, list[Admission]] = field(default_factory=dict)
    #: The steady rate of the target (`TARGET_STEADY_RATE`) through the reference webhook.
    reference_steady: list[Admission] = field(default_factory=list)
    controller_peak_mib: float = 0.0
    webhook_peak_mib: float = 0.0


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1000


def rates(runs: Sequence[RunResult]) -> list[float]:
    return [x.rate for x in runs]


def ratio(a: Sequence[RunResult], b: Sequence[RunResult]) -> list[float]:
    """Repeat i of `a` over repeat i of `b`, for the repeats both ran (a `Budget` may have left
    out the runs after one side's last)."""
    return [x.rate / y.rate for x, y in zip(a, b, strict=False)]


def _p(runs: Sequence[RunResult], which: str) -> list[float]:
    return [getattr(x, which) for x in runs]


def creates_rows(
    label: str,
    through: Sequence[RunResult],
    without: Sequence[RunResult],
    reference: Sequence[RunResult] = (),
) -> list[Measurement]:
    """A burst's creates/s through the webhook and the same burst's without it, per repeat, and
    the webhook's CPU per create: on a machine whose cores the apiserver and the webhook share,
    the ratio moves with that CPU. With `reference`, the same burst through the reference
    webhook (the same patch from a server that costs next to nothing): the floor a webhook's
    round trip leaves in the apiserver on this machine, and how far gpuplace's is from it."""
    hooked = [x.extra["creates_per_s"] for x in through]
    unhooked = [x.extra["creates_per_s"] for x in without]
    floor = [x.extra["creates_per_s"] for x in reference]
    rows = (
        [
            below(
                label, "burst creates/s through the reference webhook (Go, same patch)", floor, "/s"
            ),
            below(
                label,
                "creates/s through the reference webhook / without it",
                [a / b for a, b in zip(floor, unhooked, strict=True)],
                "x",
            ),
            below(
                label,
                "creates/s through gpuplace's webhook / through the reference webhook",
                [a / b for a, b in zip(hooked, floor, strict=True)],
                "x",
            ),
            below(
                label,
                "burst: reference webhook CPU per create",
                [
                    1000 * x.extra[REFERENCE_CPU] / x.pods if x.pods else float("nan")
                    for x in reference
                ],
                "ms",
            ),
            below(
                label,
                "burst: kube-apiserver CPU per create through the reference webhook",
                per_pod_ms(reference, APISERVER),
                "ms",
            ),
            below(
                label,
                "burst: create p99 through the reference webhook",
                _extra(reference, CREATE_P99),
                "s",
            ),
        ]
        if reference
        else []
    )
    return [
        below(label, "burst creates/s through the webhook", hooked, "/s"),
        below(label, "burst creates/s without it (webhook unregistered)", unhooked, "/s"),
        above(
            label,
            "creates/s through the webhook / without it",
            [a / b for a, b in zip(hooked, unhooked, strict=True)],
            "x",
            TARGET_CREATES_RATIO,
        ),
        below(label, "burst: webhook CPU per create", per_pod_ms(through, WEBHOOK), "ms"),
        # What calling a webhook costs the apiserver: on a machine whose cores it shares, the
        # ratio above moves with this more than with the webhook's own CPU.
        below(
            label,
            "burst: kube-apiserver CPU per create through the webhook",
            per_pod_ms(through, APISERVER),
            "ms",
        ),
        below(
            label,
            "burst: kube-apiserver CPU per create without it",
            per_pod_ms(without, APISERVER),
            "ms",
        ),
        # Each create's own latency (sent -> answered), which the webhook's round trip is part of.
        below(label, "burst: create p99 through the webhook", _extra(through, CREATE_P99), "s"),
        below(label, "burst: create p99 without it", _extra(without, CREATE_P99), "s"),
        *rows,
    ]


def _extra(runs: Sequence[RunResult], key: str) -> list[float]:
    """The runs' extra figure `key`, of those that have it."""
    return [x.extra[key] for x in runs if key in x.extra]


def _cpu(runs: Sequence[RunResult], process: str) -> list[float]:
    return [x.cpu.get(process, float("nan")) for x in runs]


def per_pod_ms(runs: Sequence[RunResult], process: str) -> list[float]:
    """The process's CPU milliseconds per pod the run bound."""
    return [
        1000 * x.cpu.get(process, float("nan")) / x.pods if x.pods else float("nan") for x in runs
    ]


def measurements(scale: Scale, r: Results) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    return [*_throughput(label, r), *_admission(label, r), *_details(label, r)]


def _throughput(label: str, r: Results) -> list[Measurement]:
    gp_b, gp_d, ks_b, ks_d = (
        r.gpuplace_burst,
        r.gpuplace_drain,
        r.scheduler_burst,
        r.scheduler_drain,
    )
    controller = "gpuplace controller"
    return [
        below(label, "gpuplace burst: pods/s (create -> bound)", rates(gp_b), "pods/s"),
        below(label, "gpuplace burst: create -> bound p50", _p(gp_b, "p50"), "s"),
        below(label, "gpuplace burst: create -> bound p99", _p(gp_b, "p99"), "s", TARGET_P99_S),
        # Where that latency goes after the create's answer (the create's own p99 is the row
        # "burst: create p99 through the webhook" below).
        below(
            label,
            "gpuplace burst: create answered -> bound p99",
            _extra(gp_b, AFTER_CREATE_P99),
            "s",
        ),
        below(label, "gpuplace burst: controller CPU", _cpu(gp_b, controller), "s"),
        *creates_rows(label, gp_b, r.gpuplace_burst_unhooked, r.reference_burst),
        below(label, "gpuplace controller peak RSS (all runs)", [r.controller_peak_mib], "MiB"),
        below(label, "gpuplace drain: pods/s (binds only)", rates(gp_d), "pods/s"),
        below(label, "gpuplace drain: controller CPU", _cpu(gp_d, controller), "s"),
        below(
            label,
            "gpuplace drain: controller CPU per bound pod (first -> last bind)",
            [1000 * x.extra[BINDING_CPU] for x in gp_d],
            "ms",
            TARGET_CPU_PER_POD_MS,
        ),
        below(
            label,
            "gpuplace drain: controller CPU per bound pod (start-up included)",
            per_pod_ms(gp_d, controller),
            "ms",
        ),
        below(
            label,
            "kube-scheduler drain: CPU per bound pod (first -> last bind)",
            [1000 * x.extra[BINDING_CPU] for x in ks_d],
            "ms",
        ),
        below(
            label,
            "gpuplace drain: controller start -> first bind",
            [x.extra["start_to_first_bound_s"] for x in gp_d],
            "s",
            TARGET_STARTUP_S,
        ),
        below(label, "gpuplace webhook peak RSS", [r.webhook_peak_mib], "MiB"),
        below(label, "kube-scheduler burst: pods/s", rates(ks_b), "pods/s"),
        below(label, "kube-scheduler burst: create -> bound p50", _p(ks_b, "p50"), "s"),
        below(label, "kube-scheduler burst: create -> bound p99", _p(ks_b, "p99"), "s"),
        below(label, "kube-scheduler drain: pods/s", rates(ks_d), "pods/s"),
        below(label, "kube-scheduler drain: CPU", _cpu(ks_d, "kube-scheduler"), "s"),
        *vs(
            label, "gpuplace / kube-scheduler, burst", ("gpuplace", gp_b), ("kube-scheduler", ks_b)
        ),
        *vs(
            label,
            "gpuplace / kube-scheduler, drain",
            ("gpuplace", gp_d),
            ("kube-scheduler", ks_d),
            TARGET_VS_SCHEDULER,
        ),
        *ceiling_rows(label, r),
    ]


def ceiling_rows(label: str, r: Results) -> list[Measurement]:
    """The ceiling with the client's shape that gave it, and gpuplace's rates against it."""
    ceil = r.ceiling
    shapes = {_shape(x).describe() for x in ceil}
    what = f"best of {len(r.ceiling_search)}: {', '.join(sorted(shapes)) or 'none'}"
    return [
        below(label, f"Binding ceiling: pods/s ({what})", rates(ceil), "pods/s"),
        *vs(
            label,
            "gpuplace drain / ceiling",
            ("gpuplace drain", r.gpuplace_drain),
            ("ceiling", ceil),
            TARGET_VS_CEILING,
        ),
        *vs(
            label,
            "gpuplace burst / ceiling",
            ("gpuplace burst", r.gpuplace_burst),
            ("ceiling", ceil),
        ),
        below(label, "ceiling: client CPU per bound pod", per_pod_ms(ceil, CLIENT), "ms"),
    ]


def _shape(run: RunResult) -> Shape:
    """The shape of the minimal client that made a ceiling run."""
    return Shape(int(run.extra["processes"]), int(run.extra["threads per process"]))


def vs(
    label: str,
    what: str,
    a: tuple[str, Sequence[RunResult]],
    b: tuple[str, Sequence[RunResult]],
    limit: float | None = None,
) -> list[Measurement]:
    """The ratio of two contenders' rates, per repeat (checked against `limit` when given), and
    both rates beside it: a ratio alone does not say which side moved."""
    (a_name, a_runs), (b_name, b_runs) = a, b
    ratios = ratio(a_runs, b_runs)
    row = (
        below(label, what, ratios, "x") if limit is None else above(label, what, ratios, "x", limit)
    )
    return [
        row,
        below(label, f"{what}: {a_name}", rates(a_runs), "pods/s"),
        below(label, f"{what}: {b_name}", rates(b_runs), "pods/s"),
    ]


def _traced(
    label: str, when: str, admissions: Sequence[Admission], vs_etcd: float | None = None
) -> list[Measurement]:
    """The webhook calls as the apiserver's traces timed them, one by one (`bench._traces`);
    with `vs_etcd`, their p99 over the same creates' etcd write p99 is held below it."""

    def ms(q: float, etcd: bool = False) -> list[float]:
        return traced_ms(admissions, q, etcd)

    share = [100 * len(a.traced) / a.creates if a.creates else 0.0 for a in admissions]
    etcd = f"the same creates' etcd write p99 (apiserver's traces) {when}"
    ratio_rows = []
    if vs_etcd is not None:
        over = [w / e for w, e in zip(ms(0.99), ms(0.99, etcd=True), strict=True)]
        what = f"webhook p99 / the same creates' etcd write p99 (apiserver's traces) {when}"
        ratio_rows.append(below(label, what, over, "x", vs_etcd))
    return [
        *ratio_rows,
        below(label, f"webhook p99 (apiserver's traces) {when}", ms(0.99), "ms"),
        below(label, etcd, ms(0.99, etcd=True), "ms"),
        below(label, f"webhook p50 (apiserver's traces) {when}", ms(0.5), "ms", detail=True),
        below(label, etcd.replace("p99", "p50"), ms(0.5, etcd=True), "ms", detail=True),
        below(label, f"webhook calls traced {when}", share, "%", detail=True),
    ]


def traced_ms(admissions: Sequence[Admission], q: float, etcd: bool = False) -> list[float]:
    """Each admission's quantile `q` of its traced webhook calls (or of its etcd writes), ms."""
    timed = [a.etcd if etcd else a.traced for a in admissions]
    return [1000 * percentile(t, q) if t else float("nan") for t in timed]


def reference_rows(label: str, r: Results) -> list[Measurement]:
    """The target's steady rate through the reference webhook: its traced p99 against the same
    creates' etcd write, and gpuplace's p99 over it (each repeat against its own)."""
    if not r.reference_steady:
        return []
    rate = TARGET_STEADY_RATE
    when = f"at {rate} creates/s through the reference webhook"
    reference = traced_ms(r.reference_steady, 0.99)
    etcd = traced_ms(r.reference_steady, 0.99, etcd=True)
    ours = traced_ms(r.admission_steady.get(rate, []), 0.99)
    return [
        *_traced(label, when, r.reference_steady),
        below(
            label,
            f"webhook p99 / the same creates' etcd write p99 (apiserver's traces) {when}",
            [w / e for w, e in zip(reference, etcd, strict=True)],
            "x",
        ),
        below(
            label,
            f"webhook p99 at {rate} creates/s (apiserver's traces), gpuplace's / the reference's",
            [g / w for g, w in zip(ours, reference, strict=False)],
            "x",
        ),
    ]


def _waits(label: str, when: str, admissions: Sequence[Admission]) -> list[Measurement]:
    """What the machine left the webhook: its threads' wait for a CPU per call, and how busy
    the machine was (two cores shared by the control plane, kwok and every gpuplace part)."""
    waits = [1000 * a.webhook_wait for a in admissions]
    busy = [a.machine_busy for a in admissions]
    return [
        below(
            label, f"webhook threads' wait for a CPU per admission {when}", waits, "ms", detail=True
        ),
        below(label, f"machine busy {when}", busy, "CPU s/s", detail=True),
    ]


def _admission(label: str, r: Results) -> list[Measurement]:
    def ms(q: float, admissions: Sequence[Admission], side: str) -> list[float]:
        return [_ms(histogram_quantile(q, getattr(a, side))) for a in admissions]

    burst, one = r.admission, r.admission_sequential
    fast = [100 * (share_at_most(0.005, a.apiserver) or 0.0) for a in burst]
    result = [
        below(label, "webhook p50 (apiserver's histogram)", ms(0.5, burst, "apiserver"), "ms"),
        below(label, "webhook p99 (apiserver's histogram)", ms(0.99, burst, "apiserver"), "ms"),
        below(label, "webhook calls <= 5 ms (apiserver's histogram)", fast, "%"),
        below(label, "webhook p50 (webhook's histogram)", ms(0.5, burst, "webhook"), "ms"),
        below(label, "webhook p99 (webhook's histogram)", ms(0.99, burst, "webhook"), "ms"),
        below(
            label,
            "admissions counted by the apiserver",
            [histogram_count(a.apiserver) for a in burst],
            "calls",
        ),
        below(
            label,
            "webhook p50 (apiserver's histogram), one create at a time",
            ms(0.5, one, "apiserver"),
            "ms",
        ),
        below(
            label,
            "webhook p99 (apiserver's histogram), one create at a time",
            ms(0.99, one, "apiserver"),
            "ms",
        ),
        below(
            label,
            "webhook p99 (webhook's histogram), one create at a time",
            ms(0.99, one, "webhook"),
            "ms",
            detail=True,
        ),
        *_waits(label, "one create at a time", one),
        *_traced(label, "one create at a time", one),
    ]
    for rate, steady in sorted(r.admission_steady.items()):
        limit = TARGET_WEBHOOK_VS_ETCD_P99 if rate == TARGET_STEADY_RATE else None
        result += _traced(label, f"at {rate} creates/s", steady, limit)
        what = f"webhook p99 (apiserver's histogram) at {rate} creates/s"
        result.append(below(label, what, ms(0.99, steady, "apiserver"), "ms"))
        what = f"webhook p50 (apiserver's histogram) at {rate} creates/s"
        result.append(below(label, what, ms(0.5, steady, "apiserver"), "ms", detail=True))
        what = f"webhook p99 (webhook's histogram) at {rate} creates/s"
        result.append(below(label, what, ms(0.99, steady, "webhook"), "ms", detail=True))
        fast = [100 * (share_at_most(0.005, a.apiserver) or 0.0) for a in steady]
        what = f"webhook calls <= 5 ms (apiserver's histogram) at {rate} creates/s"
        result.append(below(label, what, fast, "%", detail=True))
        sent = [a.rate for a in steady]
        result.append(below(label, f"creates/s sent, aiming at {rate}", sent, "/s", detail=True))
        result += _waits(label, f"at {rate} creates/s", steady)
    return result + reference_rows(label, r)


def _details(label: str, r: Results) -> list[Measurement]:
    result = [
        below(label, "ceiling: Binding POST p50", _p(r.ceiling, "p50"), "s", detail=True),
        below(label, "ceiling: Binding POST p99", _p(r.ceiling, "p99"), "s", detail=True),
    ]
    for process, share in sorted(r.idle_cpu.items()):
        result.append(below(label, f"idle: CPU of {process}", [share], "s/s", detail=True))
    for shape, rate in sorted(r.ceiling_search.items()):
        what = f"ceiling search: {shape.describe()}"
        result.append(below(label, what, [rate], "pods/s", detail=True))
    for run_name, runs in (
        ("gpuplace burst", r.gpuplace_burst),
        ("gpuplace burst without the webhook", r.gpuplace_burst_unhooked),
        ("gpuplace burst through the reference webhook", r.reference_burst),
        ("gpuplace drain", r.gpuplace_drain),
        ("kube-scheduler burst", r.scheduler_burst),
        ("kube-scheduler drain", r.scheduler_drain),
        ("ceiling", r.ceiling),
    ):
        result += run_details(label, run_name, runs)
    return result


def run_details(label: str, run_name: str, runs: Sequence[RunResult]) -> list[Measurement]:
    """Per run of one contender: each process's CPU seconds, the extra figures and the API
    requests per pod (the details table)."""
    result = []
    for process in sorted({name for run in runs for name in run.cpu}):
        result.append(
            below(label, f"{run_name}: CPU of {process}", _cpu(runs, process), "s", detail=True)
        )
    for key in sorted({k for run in runs for k in run.extra}):
        values = [run.extra[key] for run in runs if key in run.extra]
        result.append(below(label, f"{run_name}: {key}", values, "", detail=True))
    for key in sorted({k for run in runs for k in run.requests}):
        values = [run.requests.get(key, 0.0) for run in runs]
        unit = "s" if key.startswith("APF") else ""
        result.append(below(label, f"{run_name}: {key}", values, unit, detail=True))
    return result


# --------------------------------------------------------------------------- entry points


def contend(
    b: PlacementBench,
    repeats: int,
    log: Callable[[str], None],
    budget: Budget,
    search: Sequence[int] = CEILING_CONCURRENCY,
) -> Results:
    """The contenders on a bench that is set up: the ceiling client's best shape (one process at
    each of `search` threads, then more processes: `bench._ceiling.search`), then `repeats` times
    the steps of `admission_steps` and the runs of `drain_contenders`, each only while `budget`
    allows it (the search always runs whole: the drains are held against its best shape)."""
    results = Results()
    results.idle_cpu = b.idle()
    log(f"idle: the machine busy {results.idle_cpu[MACHINE]:.2f} CPU seconds per second")
    best = ceiling_search(
        lambda shape: b.ceiling(shape).rate,
        search,
        results.ceiling_search,
        log,
        os.cpu_count() or 1,
    )
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"repeat {repeat}"):
            break
        log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f}; {b.storage()})")
        for step, run_step in admission_steps(b, results, log):
            if budget.allows(step):
                run_step()
        if budget.allows("the drains"):
            log(f"  before the drains: {b.storage()}")
            run_contenders(drain_contenders(b, results, best), RunResult.line, log, budget.allows)
    results.controller_peak_mib = b.controller_peak_mib
    results.webhook_peak_mib = b.webhook_peak_mib()
    return results


def admission_steps(
    b: PlacementBench, results: Results, log: Callable[[str], None]
) -> list[tuple[str, Callable[[], None]]]:
    """A repeat's steps before its drains, in order, each with its name: the bursts, the creates
    one at a time, each steady rate, the target's steady rate through the reference webhook."""

    def one_at_a_time() -> None:
        results.admission_sequential.append(b.admission_one_at_a_time())

    def steady(rate: int) -> None:
        admission = b.admission_at(rate, int(rate * STEADY_SECONDS))
        results.admission_steady.setdefault(rate, []).append(admission)
        p99 = _ms(histogram_quantile(0.99, admission.apiserver))
        log(f"  webhook at {rate} creates/s ({admission.rate:.1f} sent): p99 {p99:.1f} ms")

    return [
        ("the bursts", lambda: creates_bursts(b, results, log)),
        ("the creates one at a time", one_at_a_time),
        *[(f"the creates at {rate}/s", lambda rate=rate: steady(rate)) for rate in STEADY_RATES],
        (
            f"the reference webhook at {TARGET_STEADY_RATE} creates/s",
            lambda: reference_steady(b, results, log),
        ),
    ]


def drain_contenders(
    b: PlacementBench, results: Results, best: Shape
) -> list[Contender[RunResult]]:
    """A repeat's drains, in order: gpuplace's, then at once the ceiling at its best shape, so
    that the two sides of their ratio bind on the same cluster, one right after the other (and
    a run cut short by its machine's time has logged both before kube-scheduler's runs)."""
    return [
        ("gpuplace drain", results.gpuplace_drain, b.gpuplace_drain),
        (f"ceiling ({best.describe()})", results.ceiling, lambda: b.ceiling(best)),
        ("kube-scheduler burst", results.scheduler_burst, b.scheduler_burst),
        ("kube-scheduler drain", results.scheduler_drain, b.scheduler_drain),
    ]


def best_concurrency(
    what: str,
    rate: Callable[[int], float],
    search: Sequence[int],
    found: dict[int, float],
    log: Callable[[str], None],
) -> int:
    """Measures `rate` at each concurrency of `search` into `found`; the fastest of them."""
    for concurrency in search:
        found[concurrency] = rate(concurrency)
        log(f"{what} search: {concurrency} threads: {found[concurrency]:,.0f} pods/s")
    return max(found, key=lambda c: found[c])


T = TypeVar("T")
#: One contender of a repeat: its name, its runs so far, and how to run it once more.
Contender = tuple[str, list[T], Callable[[], T]]


def run_contenders(
    contenders: Sequence[Contender[T]],
    line: Callable[[T], str],
    log: Callable[[str], None],
    allows: Callable[[str], bool] = lambda _: True,
) -> None:
    """One more run of each contender, in order, each logged as `line` describes it; a run that
    `allows` refuses (`Budget.allows`) is left out."""
    for name, runs, contender in contenders:
        if allows(name):
            runs.append(contender())
            log(f"  {name}: {line(runs[-1])}")


B = TypeVar("B", bound=PlacementBench)


@contextlib.contextmanager
def running(make: Callable[[Path], B], workdir: Path | None, prefix: str) -> Iterator[B]:
    """A bench set up in `workdir` (default: a temporary directory), stopped after the block."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{prefix}-")))
        b = make(workdir)
        try:
            b.setup()
            yield b
        finally:
            b.stop()


@dataclass(frozen=True)
class Benchmark(Generic[B, R]):
    """A benchmark: the bench `make` builds, set up (in `workdir`, default a temporary directory
    named `prefix`-...), `contend` run on it with `repeats` repeats, stopped; the results."""

    make: Callable[[Scale, Path, Callable[[str], None], Path | None], B]
    prefix: str
    contend: Callable[[B, int, Callable[[str], None], Budget], R]

    def __call__(
        self,
        scale: Scale,
        repeats: int,
        log: Callable[[str], None],
        workdir: Path | None = None,
        profile_dir: Path | None = None,
        budget: float = math.inf,
    ) -> R:
        """`budget`: the seconds in which `contend`'s steps may start, from the end of the set-up
        (`Budget`)."""
        with running(lambda w: self.make(scale, w, log, profile_dir), workdir, self.prefix) as b:
            return self.contend(b, repeats, log, Budget(budget, log))


bench = Benchmark(PlacementBench, "gpuplace-bench", contend)


_stderr = log_to_stderr("placement")


def run(repeats: int, small: bool = False) -> list[Measurement]:
    scale = Scale(nodes=100, pods=500) if small else Scale()
    return measurements(scale, bench(scale, repeats, _stderr))


def creates_bursts(b: PlacementBench, results: Results, log: Callable[[str], None]) -> None:
    """One repeat's bursts: through gpuplace's webhook, without it, through the reference."""
    burst, admission = b.gpuplace_burst()
    results.gpuplace_burst.append(burst)
    results.admission.append(admission)
    log(f"  gpuplace burst: {burst.line()}")
    unhooked = b.gpuplace_burst_unhooked()
    results.gpuplace_burst_unhooked.append(unhooked)
    reference = b.reference_burst()
    results.reference_burst.append(reference)
    log(
        f"  creates/s: {burst.extra['creates_per_s']:,.0f} through gpuplace's pod webhook, "
        f"{unhooked.extra['creates_per_s']:,.0f} without it, "
        f"{reference.extra['creates_per_s']:,.0f} through the reference webhook"
    )


def contend_creates(
    b: PlacementBench, repeats: int, log: Callable[[str], None], budget: Budget
) -> Results:
    """Only the webhook's part: per repeat (while `budget` allows one), the burst through the
    webhook, the same burst without it and through the reference webhook, and the steady rate its
    p99 is held to."""
    results = Results()
    log(f"the webhook serves from {webhook_processes()} process(es) ({PROCESSES_ENV})")
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"repeat {repeat}"):
            break
        log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f})")
        creates_bursts(b, results, log)
        rate = TARGET_STEADY_RATE
        steady = b.admission_at(rate, int(rate * STEADY_SECONDS))
        results.admission_steady.setdefault(rate, []).append(steady)
        reference_steady(b, results, log)
    return results


def reference_steady(b: PlacementBench, results: Results, log: Callable[[str], None]) -> None:
    """The target's steady rate through the reference webhook, after gpuplace's."""
    rate = TARGET_STEADY_RATE
    steady = b.reference_admission_at(rate, int(rate * STEADY_SECONDS))
    results.reference_steady.append(steady)
    (p99,) = traced_ms([steady], 0.99)
    log(f"  the reference webhook at {rate} creates/s: p99 {p99:.1f} ms (traces)")


def creates_measurements(scale: Scale, r: Results) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    rate = TARGET_STEADY_RATE
    return [
        *creates_rows(label, r.gpuplace_burst, r.gpuplace_burst_unhooked, r.reference_burst),
        *_traced(
            label,
            f"at {rate} creates/s",
            r.admission_steady.get(rate, []),
            TARGET_WEBHOOK_VS_ETCD_P99,
        ),
        *reference_rows(label, r),
        *_waits(label, f"at {rate} creates/s", r.admission_steady.get(rate, [])),
        below(label, f"webhook server processes ({PROCESSES_ENV})", [webhook_processes()], ""),
    ]


def _tree_wait(pid: int) -> float:
    """`run_queue_wait` of a process and its children (the webhook's server processes)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    total = run_queue_wait(pid)
    for child in children:
        with contextlib.suppress(OSError, ValueError):  # it ended meanwhile
            total += run_queue_wait(child)
    return total


def webhook_processes() -> int:
    """The server processes the bench's webhook runs (it inherits this environment)."""
    return int(os.environ.get(PROCESSES_ENV) or 1)


bench_creates = Benchmark(PlacementBench, "gpuplace-bench", contend_creates)
#: `--only creates` runs `contend_creates` alone (a minute, not the whole bench).
ONLY_CREATES = ("--only", "creates")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m bench.placement"
    if any(args[i : i + 2] == list(ONLY_CREATES) for i in range(len(args))):
        i = next(i for i in range(len(args)) if args[i : i + 2] == list(ONLY_CREATES))
        rest = args[:i] + args[i + 2 :]
        return cli(prog, __doc__, Scale(), 1, bench_creates, creates_measurements, _stderr, rest)
    return cli(prog, __doc__, Scale(), 3, bench, measurements, _stderr, args)


def cli(
    prog: str,
    doc: str | None,
    default: Scale,
    repeats: int,
    run_bench: Benchmark[Any, R],
    measure: Callable[[Scale, R], list[Measurement]],
    log: Callable[[str], None],
    argv: Sequence[str] | None,
) -> int:
    """`python -m bench.<name> --nodes N --pods N --repeats N [--workdir DIR] [--profile DIR]`:
    one benchmark on its own, its figures one a line."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--nodes", type=int, default=default.nodes)
    parser.add_argument("--pods", type=int, default=default.pods)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the controller with py-spy during gpuplace's runs (collapsed stacks in DIR)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=math.inf,
        metavar="S",
        help="start no step more than S seconds after the set-up: the table then has what ran "
        "(for a machine lent for minutes; default: no limit)",
    )
    args = parser.parse_args(argv)
    scale = replace(default, nodes=args.nodes, pods=args.pods)
    log(f"machine: {describe(machine())}")
    results = run_bench(scale, args.repeats, log, args.workdir, args.profile, args.budget)
    log(f"machine at the end: {describe(machine())}")
    figures = measure(scale, results)
    print_tables(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
