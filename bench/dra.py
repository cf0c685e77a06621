"""Placing pods with DRA ResourceClaims: gpuplace in `dra` enforcement, kube-scheduler with claims
whose CEL selects the same GPU UUIDs, and a minimal client that only allocates and binds.

One cluster (etcd, kube-apiserver, kube-controller-manager, kwok) with 100 kwok nodes x 8 GPUs,
the agents' inventories, one ResourceSlice per node for driver gpu.nvidia.com (device `gpu-<i>`,
attribute `uuid`, as NVIDIA's DRA driver publishes them) and a DeviceClass `gpu.nvidia.com`; the
real `gpuplace webhook` and `gpuplace controller` with `--enforcement=dra`, and 8 placement maps of
100 slots, one GPU each. Each repeat runs, one contender at a time, on the same 800 slots:

1. gpuplace, burst: 16 threads create the pods of the maps through the webhook, which gives each
   the map's ResourceClaimTemplate; kube-controller-manager generates the claims; the binder
   writes each claim's finalizer and status (allocation + reservedFor), then the Binding. Rate:
   pods / (first create sent -> last pod seen bound); latency: create sent -> bound, per pod.
2. gpuplace, backlog drain: with the leader running and every node cordoned, the pods are
   created, kube-controller-manager generates every claim and the controller writes each claim's
   finalizer as it appears (reported apart: "finalizers per pod, written when seen"); the leader
   stops, the nodes are uncordoned and, once the apiserver is quiet, a new leader starts on the
   backlog (a failover; no node write falls inside the timed window, as none does in the minimal
   client's). Rate: pods / (first claim seen allocated -> last pod seen bound), from a watch of
   the claims beside the pod watch: binding only, timed over the same work whether a contender writes all claims before
   its first Binding (kube-scheduler's pipeline) or claim and Binding pod by pod.
3. kube-scheduler (client QPS 5,000) on the same pods, each with a ResourceClaim of its own that
   requests one device of the DeviceClass whose CEL selector names the slot's GPU UUID
   (`device.attributes["gpu.nvidia.com"].uuid == "GPU-..."`), pinned to its node by required
   node affinity as in the placement benchmark (that only helps kube-scheduler). Burst: 16
   threads create claim, then pod (latency from the claim's create); drain as in (2). A run
   that has not bound every pod within `SCHEDULER_CAP` seconds reports what was bound by then.
   One more drain without the node affinity, as a DRA user writes such a pod: only the claim's
   CEL picks device and node (the target compares with the pinned pods, kube-scheduler's best).
   In a burst kube-controller-manager (client QPS 200) generates gpuplace's claims from the
   map's template; kube-scheduler's claims come from the bench itself.
4. The minimal client: gpuplace's own pods exist beforehand, admitted by its webhook while its
   controller is stopped, with the claims kube-controller-manager generates from the map's
   template; threads write only each claim's status (the allocation and reservedFor that
   gpuplace writes) and then the pod's Binding with gpuplace's annotations (a signature
   included, by a key nobody verifies): the same objects and writes as gpuplace's drain. The better of
   `MINIMAL_CONCURRENCY` threads counts, found once before the repeats; rate as in (2). It
   writes no delete-protection finalizer (a claim it allocated could vanish while allocated):
   it is the floor of writes, not a safe scheduler. The target: gpuplace's drain at least
   `TARGET_VS_MINIMAL` of its rate ("DRA drain / minimal claim+Binding client", both rates
   beside it).

After each run every bound pod's claim must hold exactly its slot's device: the three place the
same thing.

API writes per pod count the apiserver's POST, PUT, PATCH, DELETE and APPLY requests over each
run (apiserver_request_total): "claims + Bindings" those on resourceclaims (and status) and
pods/binding, "all" every write, kwok's pod status updates and node heartbeats included;
"finalizer writes" the PATCH and PUT requests on the claims themselves (not their status): the
delete-protection finalizer, which gpuplace writes when it first sees a claim and kube-scheduler
before it allocates one. Between runs every pod and claim is deleted and the apiserver left to
quiesce.

`make bench` runs every contender at 100 nodes (`DEFAULT`) and, at 1,000 nodes (`WIDE`), the two
of the target (`--only-ratio`: gpuplace's drain and the minimal client).
`python -m bench.dra --nodes 20 --pods 100 --repeats 1` runs a small version.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bench import Budget, Measurement, above, below, log_to_stderr
from bench._cli import Benchmark, cli
from bench._kube import (
    Obj,
    Observed,
    PodWatch,
    call,
    concurrently,
    create_pods,
    process_cpu,
    profiling,
)
from bench._proc import BenchError
from bench._report import rates, ratio, run_details
from bench._runs import RunResult, Usage, burst_result, drain_result
from bench._stats import counter_delta, counter_totals, percentile
from bench._steps import Contender, PlacementBench, best_concurrency, run_contenders
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    PROBE,
    SETUP_THREADS,
    Scale,
    bench_pod,
    binding,
    gpu_uuid,
    gpuplace_pod,
    inventory,
    node_name,
    pod_name,
)
from kubeio.paths import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from placement.dra import (
    RESOURCE_API,
    DraDevice,
    DraSettings,
    Enforcement,
    allocation_status,
    claim_spec,
    device_name,
    slice_for,
)
from placement.types import GpuUuid, NodeName

NAME = "dra"
SETTINGS = DraSettings()
#: The claim entry of kube-scheduler's and the minimal client's pods.
CLAIM_ENTRY = "gpu"
MINIMAL_CONCURRENCY = (32, 128)
#: kube-scheduler's DRA scheduling may be slow: a run reports what it bound by then.
SCHEDULER_CAP = 240.0
RUN_TIMEOUT = 300.0
TARGET_VS_SCHEDULER = 5.0
TARGET_VS_MINIMAL = 0.8
VS_MINIMAL = "DRA drain / minimal claim+Binding client"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
#: The delete-protection finalizer: an update of the claim itself, not of its status.
FINALIZER_VERBS = frozenset({"PUT", "PATCH"})
CLAIM_METADATA = frozenset({("resourceclaims", "")})
FINALIZER_METRIC = "gpuplace_claim_finalizer_writes_total"
#: Its `when` of the finalizers written as the claims appeared (not on the Binding path).
SEEN = "seen"
#: What the contenders write to place a pod: its claim (created, finalizer, status) and Binding.
PLACEMENT_RESOURCES = frozenset(
    {("resourceclaims", ""), ("resourceclaims", "status"), ("pods", "binding")}
)
CLAIMS = RESOURCE_CLAIMS.collection(NAMESPACE)
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


# --------------------------------------------------------------------------- the workload


def device_class(settings: DraSettings) -> Obj:
    """The DeviceClass kube-scheduler's claims request: every device of the driver."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": settings.device_class},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{settings.driver}"'}}]},
    }


def uuid_selector(uuid: str, settings: DraSettings) -> str:
    """The CEL expression that selects the device whose UUID attribute is `uuid`; an unqualified
    attribute is in the driver's domain, as the slices publish it."""
    domain, _, attribute = settings.attribute.rpartition("/")
    return f'device.attributes["{domain or settings.driver}"].{attribute} == "{uuid}"'


def cel_claim(scale: Scale, pod: int, run: int, settings: DraSettings = SETTINGS) -> Obj:
    """The claim a kube-scheduler user writes for the slot: exactly its GPU, by UUID."""
    uuid = gpu_uuid(pod % scale.nodes, scale.device(pod))
    selector = uuid_selector(uuid, settings)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": pod_name(scale, pod, run)},
        "spec": claim_spec(settings, {"selectors": [{"cel": {"expression": selector}}]}),
    }


def _claim_pod(name: str, spec: Obj) -> Obj:
    """A pod whose container uses the claim of the pod's name."""
    spec = {"resourceClaims": [{"name": CLAIM_ENTRY, "resourceClaimName": name}], **spec}
    return bench_pod(name, {}, spec, {"claims": [{"name": CLAIM_ENTRY}]})


def cel_pod(scale: Scale, pod: int, run: int) -> Obj:
    """kube-scheduler's pod: its own claim, pinned to the slot's node by required node affinity."""
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [scale.node(pod)]}
        ]
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return _claim_pod(pod_name(scale, pod, run), {"affinity": affinity})


def cel_only_pod(scale: Scale, pod: int, run: int) -> Obj:
    """kube-scheduler's pod as a DRA user writes it: only the claim's CEL picks device and node."""
    return _claim_pod(pod_name(scale, pod, run), {})


def slot_device(scale: Scale, pod: int) -> DraDevice:
    """The slot's GPU as its ResourceSlice names it (one pool per node, named after it)."""
    node = NodeName(scale.node(pod))
    index = scale.device(pod)
    return DraDevice(node, node, device_name(index), GpuUuid(gpu_uuid(pod % scale.nodes, index)))


def writes_per_pod(
    before: str,
    after: str,
    pods: int,
    resources: Iterable[tuple[str, str]] | None = None,
    verbs: Iterable[str] = WRITE_VERBS,
) -> float:
    """API writes per pod between two scrapes of the apiserver's /metrics
    (apiserver_request_total), over `resources` ((resource, subresource) pairs) or all, counting
    `verbs` (every write verb by default)."""
    wanted = None if resources is None else set(resources)
    written = set(verbs)
    by = ("verb", "resource", "subresource")
    delta = counter_delta(
        *(counter_totals(text, "apiserver_request_total", by) for text in (before, after))
    )
    total = sum(
        count
        for (verb, resource, sub), count in delta.items()
        if verb in written and (wanted is None or (resource, sub) in wanted)
    )
    return total / pods


def allocation_errors(claims: Iterable[Obj], expected: Mapping[str, DraDevice]) -> list[str]:
    """What differs from the plan: every pod of `expected` (pod name -> its slot's device) must
    have exactly one claim reserved for it, allocated exactly that device on its node."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        for reserved in status.get("reservedFor") or []:
            found.setdefault(str(reserved.get("name")), []).extend(
                (str(r.get("driver")), str(r.get("pool")), str(r.get("device"))) for r in results
            )
    errors = []
    for pod, device in sorted(expected.items()):
        want = [(SETTINGS.driver, device.pool, device.name)]
        if found.get(pod) != want:
            errors.append(f"{pod}: allocated {found.get(pod, [])}, planned {want}")
    return errors


def placement_rate(allocated: Iterable[float], bound: Iterable[float]) -> float:
    """Pods bound per second from the first claim seen allocated to the last pod seen bound:
    a contender that writes every claim before its first Binding (kube-scheduler's pipeline)
    and one that writes claim and Binding pod by pod are timed over the same work."""
    times = list(bound)
    seconds = max(times) - min(allocated)
    return len(times) / seconds if seconds > 0 else float("inf")


def with_placement_rate(
    result: RunResult, allocated: Iterable[float], bound: Iterable[float]
) -> RunResult:
    """The drain's result timed from the first allocation; its first -> last Binding rate stays
    in the details."""
    return replace(
        result,
        rate=placement_rate(allocated, bound),
        extra=result.extra | {"pods/s, first -> last Binding": result.rate},
    )


@dataclass(frozen=True)
class DraRun:
    result: RunResult
    placement_writes: float
    all_writes: float
    #: Of `placement_writes`: the claims' delete-protection finalizers.
    finalizer_writes: float = float("nan")


# --------------------------------------------------------------------------- the bench


class DraBench(PlacementBench):
    """The placement benchmark's cluster and gpuplace in `dra` enforcement, with slices."""

    enforcement = Enforcement.DRA.value

    def setup(self) -> None:
        super().setup()
        call(
            self.cluster, "POST", DEVICE_CLASSES.collection(), device_class(SETTINGS), wanted={201}
        )

        def publish(n: int) -> None:
            body = slice_for(inventory(n, self.scale.gpus), SETTINGS)
            call(self.cluster, "POST", RESOURCE_SLICES.collection(), body, wanted={201})

        concurrently(list(range(self.scale.nodes)), publish, SETUP_THREADS)
        self.log(f"{self.scale.nodes} ResourceSlices published")

    # -- helpers ---------------------------------------------------------------------------------
    def _count(self, path: str) -> int:
        return len(call(self.cluster, "GET", path)["items"])

    def _create_generating_claims(self, pods: Sequence[Obj]) -> None:
        """Creates the map's pods and waits for kube-controller-manager to generate each claim."""
        create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
        self.cluster.wait_for(
            "kube-controller-manager to generate every pod's claim",
            lambda: self._claims_made() >= len(pods),
            RUN_TIMEOUT,
            interval=0.5,
        )

    def _generated_claims(self) -> tuple[dict[str, str], dict[str, str]]:
        """Each pod's generated claim's name and each pod's uid, by pod name."""
        claims: dict[str, str] = {}
        uids: dict[str, str] = {}
        for pod in call(self.cluster, "GET", PODS.collection(NAMESPACE))["items"]:
            name = pod["metadata"]["name"]
            uids[name] = pod["metadata"]["uid"]
            for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
                if status.get("resourceClaimName"):
                    claims[name] = status["resourceClaimName"]
        return claims, uids

    def _claims_made(self) -> int:
        """Pods whose claim kube-controller-manager has generated."""
        body = call(self.cluster, "GET", PODS.collection(NAMESPACE))
        return sum(1 for p in body["items"] if (p.get("status") or {}).get("resourceClaimStatuses"))

    def _clear_claims(self, pods: Sequence[Obj], delete: bool) -> None:
        """Deletes the pods; then the claims (`delete`: the bench made them) and waits until none
        is left, so the next run finds every device free."""
        self._clear(pods)
        if delete:
            names = [pod["metadata"]["name"] for pod in pods]

            def remove(name: str) -> None:
                call(
                    self.cluster,
                    "DELETE",
                    RESOURCE_CLAIMS.item(name, NAMESPACE),
                    wanted={200, 202, 404},
                )

            concurrently(names, remove, CREATE_THREADS)
        self.cluster.wait_for(
            "every claim of the run to be gone",
            lambda: self._count(f"{CLAIMS}?limit=1") == 0,
            RUN_TIMEOUT,
            interval=0.5,
        )
        self._quiesce()

    def _watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return self._watching(PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout))

    def _claim_watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return self._watching(
            PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout, claims=True)
        )

    @contextlib.contextmanager
    def _watching_claims(self, timeout: float = RUN_TIMEOUT) -> Iterator[tuple[PodWatch, PodWatch]]:
        """A watch of the run's pods and one of their claims, both stopped after the block."""
        watch, claims = self._watch(timeout), self._claim_watch(timeout)
        try:
            yield watch, claims
        finally:
            watch.stop()
            claims.stop()

    def _check(self, run: int, bound: Iterable[str]) -> None:
        """Every bound pod of the run got its slot's device: the contenders placed the same."""
        body = call(self.cluster, "GET", CLAIMS)
        slots = {pod_name(self.scale, p, run): p for p in range(self.scale.pods)}
        expected = {name: slot_device(self.scale, slots[name]) for name in bound}
        errors = allocation_errors(body["items"], expected)
        if errors:
            raise BenchError(f"{len(errors)} pods without their planned device: {errors[:3]}")

    def _drained(
        self,
        run: int,
        pods: Sequence[Obj],
        delete: bool,
        seen: Observed,
        allocated: Observed,
        started: float,
        usage: Usage,
    ) -> RunResult:
        """Checks a drain's placements and clears its pods and claims (`delete`: as in
        `_clear_claims`); its result, timed from the first claim seen `allocated`."""
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=delete)
        result = drain_result(seen, started, usage)
        return with_placement_rate(result, allocated.bound.values(), seen.bound.values())

    def _writes(self, metrics: list[str], result: RunResult) -> DraRun:
        pods = self.scale.pods
        return DraRun(
            result,
            writes_per_pod(metrics[0], metrics[1], pods, PLACEMENT_RESOURCES),
            writes_per_pod(metrics[0], metrics[1], pods),
            writes_per_pod(metrics[0], metrics[1], pods, CLAIM_METADATA, FINALIZER_VERBS),
        )

    def _create_with_claims(
        self, run: int, build: Callable[[Scale, int, int], Obj]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Creates every slot's claim, then its pod; returns when each claim's create was sent
        and each pod's uid."""
        order = self.scale.creation_order()

        def create(pod: int) -> tuple[float, str]:
            claim, body = cel_claim(self.scale, pod, run), build(self.scale, pod, run)
            sent = time.monotonic()
            call(self.cluster, "POST", CLAIMS, claim, wanted={201})
            response = call(self.cluster, "POST", PODS.collection(NAMESPACE), body, wanted={201})
            return sent, str(response["metadata"]["uid"])

        results = concurrently(order, create, CREATE_THREADS)
        names = [pod_name(self.scale, p, run) for p in order]
        return (
            {n: sent for n, (sent, _) in zip(names, results, strict=True)},
            {n: uid for n, (_, uid) in zip(names, results, strict=True)},
        )

    # -- contenders ------------------------------------------------------------------------------
    def gpuplace_dra_burst(self) -> DraRun:
        self.cluster.stop_scheduler()
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)
            self._clear_claims([], delete=False)  # the probe's claim
        run, pods = self._pods(gpuplace_pod)
        usage: list[Usage] = []
        metrics: list[str] = []
        watch = self._watch()
        before = self._finalizers_written()
        try:
            with (
                self._measuring(usage, metrics),
                profiling(self._controller_pid(), self._profile("dra-burst")),
            ):
                sent = create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
                seen = watch.wait()
        finally:
            watch.stop()
        where = self._finalizers_where(before)
        self.note_controller_peak()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=False)
        result = burst_result(sent, seen, usage[0])
        return self._writes(metrics, replace(result, extra=result.extra | where))

    def gpuplace_dra_drain(self) -> DraRun:
        """The backlog forms while the leader runs, as it does in a cluster: every node cordoned,
        the pods created, kube-controller-manager generates their claims and the controller
        writes each claim's finalizer as it appears (counted apart, by the metric's `when`).
        Then the leader stops, the nodes are uncordoned and the apiserver left to quiesce, and a
        new leader starts on the backlog (a failover): the drain is timed from the first claim
        seen allocated, over the claims' status and the Bindings, with no node writes inside
        it (the minimal client's window has none either)."""
        self.cluster.stop_scheduler()
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)
            self._clear_claims([], delete=False)  # the probe's claim
        run, pods = self._pods(gpuplace_pod)
        before = self._finalizers_written()
        self._cordon(True)
        try:
            self._create_generating_claims(pods)
            if before:
                self.cluster.wait_for(
                    "the controller to write every claim's finalizer as it appeared",
                    lambda: self._finalizers_since(before, SEEN) >= len(pods),
                    RUN_TIMEOUT,
                    interval=0.5,
                )
            formed = self._finalizers_where(before)
            self.stop_controller()
        finally:
            self._cordon(False)
        self.cluster.wait_for(
            "kube-controller-manager to untaint every uncordoned node",
            lambda: self._tainted_unschedulable() == 0,
            RUN_TIMEOUT,
            interval=0.5,
        )
        self._quiesce()
        usage: list[Usage] = []
        metrics: list[str] = []
        with self._watching_claims() as (watch, claims), self._measuring(usage, metrics):
            started = time.monotonic()
            self.start_controller()
            pid = self._controller_pid()
            with profiling(pid, self._profile("dra-drain")):
                seen = watch.wait()
                allocated = claims.wait()
        usage[0].add("gpuplace controller", process_cpu(pid))
        # The new leader's counters start at zero: its writes are all of the drain's.
        drained = self._finalizers_where({})
        where = {k: v + drained.get(k, 0.0) for k, v in formed.items()}
        self.note_controller_peak()
        result = self._drained(run, pods, False, seen, allocated, started, usage[0])
        return self._writes(metrics, replace(result, extra=result.extra | where))

    def _cordon(self, unschedulable: bool) -> None:
        """Marks every node (un)schedulable: the binder binds to no cordoned node."""

        def mark(n: int) -> None:
            body = {"spec": {"unschedulable": unschedulable or None}}
            call(self.cluster, "PATCH", f"/api/v1/nodes/{node_name(n)}", body)

        concurrently(list(range(self.scale.nodes)), mark, SETUP_THREADS)

    def _tainted_unschedulable(self) -> int:
        """Nodes that still carry the taint kube-controller-manager keeps in step with
        spec.unschedulable (a GET and a PATCH of each node it changes, at its client QPS)."""
        nodes = call(self.cluster, "GET", "/api/v1/nodes")["items"]
        return sum(
            1
            for node in nodes
            if any(
                t.get("key") == UNSCHEDULABLE_TAINT
                for t in node.get("spec", {}).get("taints") or ()
            )
        )

    def _finalizers_since(self, before: Mapping[str, float], when: str) -> float:
        return self._finalizers_written().get(when, 0.0) - before.get(when, 0.0)

    def _finalizers_written(self) -> dict[str, float]:
        """The controller's claim finalizer writes so far, by where they were written (`seen`:
        when the claim was first seen, `bind`: on the Binding path); empty if not scraped."""
        if self.components is None or self.controller is None:
            return {}
        port = self.components.metrics_ports.get("controller")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError as exc:
            self.log(f"  (the controller's metrics were not read: {exc})")
            return {}
        return {key[0]: n for key, n in counter_totals(text, FINALIZER_METRIC, ("when",)).items()}

    def _finalizers_where(self, before: Mapping[str, float]) -> dict[str, float]:
        """Per pod, the finalizers written since `before`: early, and on the Binding path."""
        after = self._finalizers_written()
        if not after:
            return {}
        pods = self.scale.pods
        return {
            f"finalizers per pod, {label}": (after.get(when, 0.0) - before.get(when, 0.0)) / pods
            for when, label in (("seen", "written when seen"), ("bind", "on the Binding path"))
        }

    def _scheduler_ready(self) -> None:
        """kube-scheduler has synced once it binds a probe pod with a claim."""
        probe = cel_pod(self.scale, 0, 0)
        claim = cel_claim(self.scale, 0, 0)
        for item in (probe, claim):
            item["metadata"]["name"] = PROBE
        probe["spec"]["resourceClaims"][0]["resourceClaimName"] = PROBE
        call(self.cluster, "POST", CLAIMS, claim, wanted={201}, what="the probe's claim")
        self.wait_probe_bound("kube-scheduler", probe)
        self._clear_claims([probe], delete=True)

    def scheduler_dra_burst(self) -> DraRun:
        self.stop_controller()
        self.cluster.start_scheduler()
        self._scheduler_ready()
        run, pods = self._pods(cel_pod)
        usage: list[Usage] = []
        metrics: list[str] = []
        watch = self._watch(SCHEDULER_CAP)
        try:
            with self._measuring(usage, metrics):
                sent, _ = self._create_with_claims(run, cel_pod)
                seen = watch.wait(partial=True)
        finally:
            watch.stop()
        self.cluster.stop_scheduler()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=True)
        done = {name: t for name, t in sent.items() if name in seen.bound}
        result = burst_result(done, seen, usage[0])
        result = replace(result, extra=result.extra | {"bound share": len(done) / len(sent)})
        return self._writes(metrics, result)

    def scheduler_dra_drain(self, build: Callable[[Scale, int, int], Obj] = cel_pod) -> DraRun:
        self.stop_controller()
        self.cluster.stop_scheduler()
        run, pods = self._pods(build)
        self._create_with_claims(run, build)
        self._quiesce()
        usage: list[Usage] = []
        metrics: list[str] = []
        with self._watching_claims(SCHEDULER_CAP) as (watch, claims):
            with self._measuring(usage, metrics):
                started = time.monotonic()
                self.cluster.start_scheduler()
                seen = watch.wait(partial=True)
                allocated = claims.wait(partial=True)
            usage[0].add("kube-scheduler", process_cpu(self.pids()["kube-scheduler"]))
        self.cluster.stop_scheduler()
        result = self._drained(run, pods, True, seen, allocated, started, usage[0])
        result = replace(result, extra=result.extra | {"bound share": len(seen.bound) / len(pods)})
        return self._writes(metrics, result)

    def minimal(self, concurrency: int) -> DraRun:
        """Only the claim status and the Binding, from `concurrency` threads, for gpuplace's own
        pods: admitted by its webhook while its controller is stopped, their claims generated by
        kube-controller-manager from the map's template. The same objects and writes as
        gpuplace's drain (the Binding's annotations and signature included), less the finalizer."""
        self.stop_controller()
        self.cluster.stop_scheduler()
        run, pods = self._pods(gpuplace_pod)
        self._create_generating_claims(pods)
        claim_of, uids = self._generated_claims()
        self._quiesce()
        order = self.scale.creation_order()

        def place(pod: int) -> tuple[float, float]:
            name = pod_name(self.scale, pod, run)
            device = slot_device(self.scale, pod)
            status_body = allocation_status(
                [device], device.node, name, uids[name], SETTINGS.driver
            )
            body = binding(self.scale, pod, run, uids[name], cuda=device.uuid)
            sent = time.monotonic()
            call(
                self.cluster,
                "PATCH",
                RESOURCE_CLAIMS.item(claim_of[name], NAMESPACE, "status"),
                {"status": status_body},
            )
            call(self.cluster, "POST", PODS.item(name, NAMESPACE, "binding"), body)
            return sent, time.monotonic()

        usage: list[Usage] = []
        metrics: list[str] = []
        with self._watching_claims() as (watch, claims), self._measuring(usage, metrics):
            started = time.monotonic()
            times = concurrently(order, place, concurrency)
            seen = watch.wait()
            allocated = claims.wait()
        result = self._drained(run, pods, False, seen, allocated, started, usage[0])
        latencies = [done - sent for sent, done in times]
        result = replace(
            result,
            p50=percentile(latencies, 0.5),
            p99=percentile(latencies, 0.99),
            extra=result.extra | {"concurrency": float(concurrency)},
        )
        return self._writes(metrics, result)


# --------------------------------------------------------------------------- reporting


@dataclass
class DraResults:
    gpuplace_burst: list[DraRun] = field(default_factory=list)
    gpuplace_drain: list[DraRun] = field(default_factory=list)
    scheduler_burst: list[DraRun] = field(default_factory=list)
    scheduler_drain: list[DraRun] = field(default_factory=list)
    scheduler_cel_only: list[DraRun] = field(default_factory=list)
    minimal: list[DraRun] = field(default_factory=list)
    minimal_search: dict[int, float] = field(default_factory=dict)


def measurements(scale: Scale, r: DraResults) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    runs = {
        "gpuplace dra burst": r.gpuplace_burst,
        "gpuplace dra drain": r.gpuplace_drain,
        "kube-scheduler dra burst": r.scheduler_burst,
        "kube-scheduler dra drain": r.scheduler_drain,
        "kube-scheduler dra drain, no node affinity": r.scheduler_cel_only,
        "minimal claim status + Binding": r.minimal,
    }
    best = int(r.minimal[0].result.extra["concurrency"]) if r.minimal else 0
    result: list[Measurement] = []
    for name, xs in runs.items():
        if xs:
            result += _contender(label, name, xs, best)
    comparisons = (
        ("gpuplace / kube-scheduler, dra drain", r.gpuplace_drain, r.scheduler_drain),
        (
            "gpuplace / kube-scheduler, dra drain, no node affinity",
            r.gpuplace_drain,
            r.scheduler_cel_only,
        ),
        ("gpuplace / kube-scheduler, dra burst", r.gpuplace_burst, r.scheduler_burst),
    )
    targets = {"gpuplace / kube-scheduler, dra drain": TARGET_VS_SCHEDULER}
    for what, a, b in comparisons:
        if a and b:
            ratios = ratio([x.result for x in a], [x.result for x in b])
            limit = targets.get(what)
            result.append(
                above(label, what, ratios, "x", limit) if limit else below(label, what, ratios, "x")
            )
    result += vs_minimal(label, r.gpuplace_drain, r.minimal)
    for concurrency, rate in sorted(r.minimal_search.items()):
        result.append(
            below(label, f"minimal search: {concurrency} threads", [rate], "pods/s", detail=True)
        )
    for name, xs in runs.items():
        p50 = [x.result.p50 for x in xs if x.result.p50 is not None]
        if p50:
            result.append(below(label, f"{name}: p50", p50, "s", detail=True))
        result += run_details(label, name, [x.result for x in xs])
    return result


def vs_minimal(label: str, drain: Sequence[DraRun], minimal: Sequence[DraRun]) -> list[Measurement]:
    """The target's row, each repeat's two runs measured in the same repeat, with both rates."""
    if not drain or not minimal:
        return []
    a, b = [x.result for x in drain], [x.result for x in minimal]
    return [
        above(label, VS_MINIMAL, ratio(a, b), "x", TARGET_VS_MINIMAL),
        below(label, f"{VS_MINIMAL}: DRA drain", rates(a), "pods/s"),
        below(label, f"{VS_MINIMAL}: minimal client", rates(b), "pods/s"),
    ]


def _contender(label: str, name: str, xs: Sequence[DraRun], best: int) -> list[Measurement]:
    """One contender's headline figures: rate, p99, writes per pod, the share bound in time."""
    p99 = [x.result.p99 if x.result.p99 is not None else float("nan") for x in xs]
    what = f"{name} ({best} threads)" if name.startswith("minimal") else name
    result = [below(label, f"{what}: pods/s", rates([x.result for x in xs]), "pods/s")]
    if name.endswith("burst"):
        result.append(below(label, f"{name}: create -> bound p99", p99, "s"))
    if name.startswith("minimal"):
        result.append(below(label, f"{name}: status + Binding p99", p99, "s"))
    placement = [x.placement_writes for x in xs]
    result.append(below(label, f"{name}: writes per pod, claims + Bindings", placement, ""))
    finalizers = [x.finalizer_writes for x in xs]
    if not any(math.isnan(f) for f in finalizers):
        result.append(below(label, f"{name}: finalizer writes per pod", finalizers, ""))
    result.append(below(label, f"{name}: writes per pod, all", [x.all_writes for x in xs], ""))
    shares = [100 * x.result.extra["bound share"] for x in xs if "bound share" in x.result.extra]
    if shares:
        result.append(below(label, f"{name}: bound within {SCHEDULER_CAP:.0f} s", shares, "%"))
    return result


# --------------------------------------------------------------------------- entry points


def contend(
    b: DraBench,
    repeats: int,
    log: Callable[[str], None],
    budget: Budget,
    only_ratio: bool = False,
) -> DraResults:
    """The minimal client's best concurrency, then `repeats` times every contender while `budget`
    allows it (`only_ratio`: gpuplace's drain and the minimal client, the two runs of the
    target)."""
    results = DraResults()
    best = best_concurrency(
        "minimal",
        lambda c: b.minimal(c).result.rate,
        MINIMAL_CONCURRENCY,
        results.minimal_search,
        log,
    )
    drain: Contender[DraRun] = ("gpuplace dra drain", results.gpuplace_drain, b.gpuplace_dra_drain)
    minimal: Contender[DraRun] = (
        f"minimal ({best} threads)",
        results.minimal,
        lambda: b.minimal(best),
    )
    contenders: list[Contender[DraRun]] = [drain, minimal]
    if not only_ratio:
        contenders = [
            ("gpuplace dra burst", results.gpuplace_burst, b.gpuplace_dra_burst),
            drain,
            ("kube-scheduler dra burst", results.scheduler_burst, b.scheduler_dra_burst),
            ("kube-scheduler dra drain", results.scheduler_drain, b.scheduler_dra_drain),
            (
                "kube-scheduler dra drain, no node affinity",
                results.scheduler_cel_only,
                lambda: b.scheduler_dra_drain(cel_only_pod),
            ),
            minimal,
        ]
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"repeat {repeat}"):
            break
        log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f})")
        run_contenders(contenders, _line, log, budget.allows)
    return results


def contend_ratio(
    b: DraBench, repeats: int, log: Callable[[str], None], budget: Budget
) -> DraResults:
    return contend(b, repeats, log, budget, only_ratio=True)


bench = Benchmark(DraBench, "gpuplace-dra", contend)
bench_ratio = Benchmark(DraBench, "gpuplace-dra", contend_ratio)


def _line(run: DraRun) -> str:
    r = run.result
    p99 = f", p99 {r.p99:.3f} s" if r.p99 is not None else ""
    early = r.extra.get("finalizers per pod, written when seen")
    late = r.extra.get("finalizers per pod, on the Binding path")
    where = f": {early:.2f} when seen, {late:.2f} on the bind path" if early is not None else ""
    return (
        f"{r.rate:,.1f} pods/s{p99}, writes per pod {run.placement_writes:.2f} "
        f"(finalizers {run.finalizer_writes:.2f}{where}; all {run.all_writes:.2f})"
    )


_stderr = log_to_stderr("dra")


DEFAULT = Scale(nodes=100, pods=800)
#: The target's two contenders on a cluster ten times as wide (same pods: one a node).
WIDE = Scale(nodes=1000, pods=800)
SMALL = Scale(nodes=20, pods=100)
SMALL_WIDE = Scale(nodes=200, pods=100)


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """Part of every `make bench`: set-up and one repeat take about five minutes on two busy
    cores at 100 nodes, and the two runs of the target a few more at 1,000 nodes, so one repeat
    runs (`python -m bench.dra --repeats N` for more)."""
    scale, wide = (SMALL, SMALL_WIDE) if small else (DEFAULT, WIDE)
    figures = measurements(scale, bench(scale, min(repeats, 1), _stderr))
    return figures + measurements(wide, bench_ratio(wide, min(repeats, 1), _stderr))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--only-ratio",
        action="store_true",
        help="run only the target's contenders: gpuplace's drain and the minimal client",
    )
    known, rest = parser.parse_known_args(argv)
    if known.only_ratio:
        return cli(
            "python -m bench.dra", __doc__, WIDE, 1, bench_ratio, measurements, _stderr, rest
        )
    return cli("python -m bench.dra", __doc__, DEFAULT, 1, bench, measurements, _stderr, rest)


if __name__ == "__main__":
    sys.exit(main())
