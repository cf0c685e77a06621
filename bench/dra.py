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
2. gpuplace, backlog drain: the controller is stopped, the pods are created and
   kube-controller-manager has generated every claim; the controller starts. Rate: pods /
   (first claim seen allocated -> last pod seen bound), from a watch of the claims beside the pod
   watch: binding only, timed over the same work whether a contender writes all claims before
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
4. The minimal client: pods with a schedulerName nobody serves and their claims exist
   beforehand; threads (one keep-alive connection each) write only each claim's status (the
   allocation and reservedFor that gpuplace writes) and then the pod's Binding. The better of
   `MINIMAL_CONCURRENCY` threads counts, found once before the repeats; rate as in (2).

After each run every bound pod's claim must hold exactly its slot's device: the three place the
same thing.

API writes per pod count the apiserver's POST, PUT, PATCH, DELETE and APPLY requests over each
run (apiserver_request_total): "claims + Bindings" those on resourceclaims (and status) and
pods/binding, "all" every write, kwok's pod status updates and node heartbeats included. Between
runs every pod and claim is deleted and the apiserver left to quiesce.

`python -m bench.dra --nodes 20 --pods 100 --repeats 1` runs a small version.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import Measurement, above, below, describe, machine
from bench._kube import (
    BenchError,
    Obj,
    PodWatch,
    concurrently,
    create_pods,
    expect,
    process_cpu,
    profiling,
)
from bench._stats import counter_delta, counter_totals, percentile
from bench.placement import (
    CREATE_THREADS,
    NAMESPACE,
    SETUP_THREADS,
    UNSERVED_SCHEDULER,
    PlacementBench,
    RunResult,
    Scale,
    Usage,
    _pod,
    burst_result,
    drain_result,
    gpu_uuid,
    gpuplace_pod,
    inventory,
    pod_name,
)
from gpuplace.localcluster import ApiConnection
from placement.dra import (
    REQUEST_NAME,
    RESOURCE_API,
    DraDevice,
    DraSettings,
    Enforcement,
    allocation_status,
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
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
#: What the contenders write to place a pod: its claim (created, finalizer, status) and Binding.
PLACEMENT_RESOURCES = frozenset(
    {("resourceclaims", ""), ("resourceclaims", "status"), ("pods", "binding")}
)
CLAIMS = f"/apis/{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"


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
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": pod_name(scale, pod, run)},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": REQUEST_NAME,
                        "exactly": {
                            "deviceClassName": settings.device_class,
                            "selectors": [{"cel": {"expression": uuid_selector(uuid, settings)}}],
                        },
                    }
                ]
            }
        },
    }


def _claim_pod(name: str, spec: Obj) -> Obj:
    """A pod whose container uses the claim of the pod's name."""
    spec = {"resourceClaims": [{"name": CLAIM_ENTRY, "resourceClaimName": name}], **spec}
    return _pod(name, {}, spec, {"claims": [{"name": CLAIM_ENTRY}]})


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


def minimal_pod(scale: Scale, pod: int, run: int) -> Obj:
    return _claim_pod(pod_name(scale, pod, run), {"schedulerName": UNSERVED_SCHEDULER})


def slot_device(scale: Scale, pod: int) -> DraDevice:
    """The slot's GPU as its ResourceSlice names it (one pool per node, named after it)."""
    node = NodeName(scale.node(pod))
    index = scale.device(pod)
    return DraDevice(node, node, device_name(index), GpuUuid(gpu_uuid(pod % scale.nodes, index)))


def writes_per_pod(
    before: str, after: str, pods: int, resources: Iterable[tuple[str, str]] | None = None
) -> float:
    """API writes per pod between two scrapes of the apiserver's /metrics
    (apiserver_request_total), over `resources` ((resource, subresource) pairs) or all."""
    wanted = None if resources is None else set(resources)
    by = ("verb", "resource", "subresource")
    delta = counter_delta(
        *(counter_totals(text, "apiserver_request_total", by) for text in (before, after))
    )
    total = sum(
        count
        for (verb, resource, sub), count in delta.items()
        if verb in WRITE_VERBS and (wanted is None or (resource, sub) in wanted)
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


# --------------------------------------------------------------------------- the bench


class DraBench(PlacementBench):
    """The placement benchmark's cluster and gpuplace in `dra` enforcement, with slices."""

    def __init__(
        self,
        scale: Scale,
        workdir: Path,
        log: Callable[[str], None],
        profile_dir: Path | None = None,
    ) -> None:
        super().__init__(scale, workdir, log, profile_dir, enforcement=Enforcement.DRA.value)

    def setup(self) -> None:
        super().setup()
        status, body = self.cluster.request(
            "POST", f"/apis/{RESOURCE_API}/deviceclasses", device_class(SETTINGS)
        )
        expect(status, body, {201}, "DeviceClass")

        def publish(connection: ApiConnection, n: int) -> None:
            body = slice_for(inventory(n, self.scale.gpus), SETTINGS)
            status, response = connection.request(
                "POST", f"/apis/{RESOURCE_API}/resourceslices", body
            )
            expect(status, response, {201}, f"ResourceSlice of node {n}")

        concurrently(self.cluster, list(range(self.scale.nodes)), publish, SETUP_THREADS)
        self.log(f"{self.scale.nodes} ResourceSlices published")

    # -- helpers ---------------------------------------------------------------------------------
    def _count(self, path: str) -> int:
        status, body = self.cluster.request("GET", path)
        expect(status, body, {200}, f"listing {path}")
        return len(body["items"])

    def _claims_made(self) -> int:
        """Pods whose claim kube-controller-manager has generated."""
        status, body = self.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        expect(status, body, {200}, "listing pods")
        return sum(1 for p in body["items"] if (p.get("status") or {}).get("resourceClaimStatuses"))

    def _clear_claims(self, pods: Sequence[Obj], delete: bool) -> None:
        """Deletes the pods; then the claims (`delete`: the bench made them) and waits until none
        is left, so the next run finds every device free."""
        self._clear(pods)
        if delete:
            names = [pod["metadata"]["name"] for pod in pods]

            def remove(connection: ApiConnection, name: str) -> None:
                status, body = connection.request("DELETE", f"{CLAIMS}/{name}")
                expect(status, body, {200, 202, 404}, f"deleting claim {name}")

            concurrently(self.cluster, names, remove, CREATE_THREADS)
        self.cluster.wait_for(
            "every claim of the run to be gone",
            lambda: self._count(f"{CLAIMS}?limit=1") == 0,
            RUN_TIMEOUT,
            interval=0.5,
        )
        self._quiesce()

    def _watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout)

    def _claim_watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout, claims=True)

    def _check(self, run: int, bound: Iterable[str]) -> None:
        """Every bound pod of the run got its slot's device: the contenders placed the same."""
        status, body = self.cluster.request("GET", CLAIMS)
        expect(status, body, {200}, "listing claims")
        slots = {pod_name(self.scale, p, run): p for p in range(self.scale.pods)}
        expected = {name: slot_device(self.scale, slots[name]) for name in bound}
        errors = allocation_errors(body["items"], expected)
        if errors:
            raise BenchError(f"{len(errors)} pods without their planned device: {errors[:3]}")

    def _writes(self, metrics: list[str], result: RunResult) -> DraRun:
        pods = self.scale.pods
        return DraRun(
            result,
            writes_per_pod(metrics[0], metrics[1], pods, PLACEMENT_RESOURCES),
            writes_per_pod(metrics[0], metrics[1], pods),
        )

    def _create_with_claims(
        self, run: int, build: Callable[[Scale, int, int], Obj]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Creates every slot's claim, then its pod; returns when each claim's create was sent
        and each pod's uid."""
        order = self.scale.creation_order()

        def create(connection: ApiConnection, pod: int) -> tuple[float, str]:
            claim, body = cel_claim(self.scale, pod, run), build(self.scale, pod, run)
            sent = time.monotonic()
            status, response = connection.request("POST", CLAIMS, claim)
            expect(status, response, {201}, f"creating claim {claim['metadata']['name']}")
            status, response = connection.request(
                "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body
            )
            expect(status, response, {201}, f"creating pod {body['metadata']['name']}")
            return sent, str(response["metadata"]["uid"])

        results = concurrently(self.cluster, order, create, CREATE_THREADS)
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
        try:
            with (
                self._measuring(usage, metrics),
                profiling(self._controller_pid(), self._profile("dra-burst")),
            ):
                sent = create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
                seen = watch.wait()
        finally:
            watch.stop()
        self.note_controller_peak()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=False)
        return self._writes(metrics, burst_result(sent, seen, usage[0]))

    def gpuplace_dra_drain(self) -> DraRun:
        self.stop_controller()
        self.cluster.stop_scheduler()
        run, pods = self._pods(gpuplace_pod)
        create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
        self.cluster.wait_for(
            "kube-controller-manager to generate every pod's claim",
            lambda: self._claims_made() >= len(pods),
            RUN_TIMEOUT,
            interval=0.5,
        )
        self._quiesce()
        usage: list[Usage] = []
        metrics: list[str] = []
        watch, claims = self._watch(), self._claim_watch()
        try:
            with self._measuring(usage, metrics):
                started = time.monotonic()
                self.start_controller()
                with profiling(self._controller_pid(), self._profile("dra-drain")):
                    seen = watch.wait()
                    allocated = claims.wait()
            usage[0].add("gpuplace controller", process_cpu(self._controller_pid()))
        finally:
            watch.stop()
            claims.stop()
        self.note_controller_peak()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=False)
        result = drain_result(seen, started, usage[0])
        result = with_placement_rate(result, allocated.bound.values(), seen.bound.values())
        return self._writes(metrics, result)

    def _scheduler_ready(self) -> None:
        """kube-scheduler has synced once it binds a probe pod with a claim."""
        probe = cel_pod(self.scale, 0, 0)
        claim = cel_claim(self.scale, 0, 0)
        for item in (probe, claim):
            item["metadata"]["name"] = "bench-probe"
        probe["spec"]["resourceClaims"][0]["resourceClaimName"] = "bench-probe"
        status, body = self.cluster.request("POST", CLAIMS, claim)
        expect(status, body, {201}, "creating the kube-scheduler probe claim")
        status, body = self.cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", probe)
        expect(status, body, {201}, "creating the kube-scheduler probe pod")

        def bound() -> bool:
            _, pod = self.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/bench-probe")
            return bool(pod.get("spec", {}).get("nodeName"))

        self.cluster.wait_for("kube-scheduler to bind a probe pod", bound, 120, interval=0.1)
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
        watch, claims = self._watch(SCHEDULER_CAP), self._claim_watch(SCHEDULER_CAP)
        try:
            with self._measuring(usage, metrics):
                started = time.monotonic()
                self.cluster.start_scheduler()
                seen = watch.wait(partial=True)
                allocated = claims.wait(partial=True)
            usage[0].add("kube-scheduler", process_cpu(self.pids()["kube-scheduler"]))
        finally:
            watch.stop()
            claims.stop()
        self.cluster.stop_scheduler()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=True)
        result = drain_result(seen, started, usage[0])
        result = with_placement_rate(result, allocated.bound.values(), seen.bound.values())
        result = replace(result, extra=result.extra | {"bound share": len(seen.bound) / len(pods)})
        return self._writes(metrics, result)

    def minimal(self, concurrency: int) -> DraRun:
        """Only the claim status and the Binding, from `concurrency` threads."""
        self.stop_controller()
        self.cluster.stop_scheduler()
        run, pods = self._pods(minimal_pod)
        _, uids = self._create_with_claims(run, minimal_pod)
        self._quiesce()
        order = self.scale.creation_order()

        def place(connection: ApiConnection, pod: int) -> tuple[float, float]:
            name = pod_name(self.scale, pod, run)
            device = slot_device(self.scale, pod)
            status_body = allocation_status(
                [device], device.node, name, uids[name], SETTINGS.driver
            )
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": device.node},
            }
            sent = time.monotonic()
            status, response = connection.request(
                "PATCH", f"{CLAIMS}/{name}/status", {"status": status_body}
            )
            expect(status, response, {200}, f"allocating claim {name}")
            status, response = connection.request(
                "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding", binding
            )
            done = time.monotonic()
            expect(status, response, {201}, f"binding {name}")
            return sent, done

        usage: list[Usage] = []
        metrics: list[str] = []
        watch, claims = self._watch(), self._claim_watch()
        try:
            with self._measuring(usage, metrics):
                started = time.monotonic()
                times = concurrently(self.cluster, order, place, concurrency)
                seen = watch.wait()
                allocated = claims.wait()
        finally:
            watch.stop()
            claims.stop()
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=True)
        result = drain_result(seen, started, usage[0])
        result = with_placement_rate(result, allocated.bound.values(), seen.bound.values())
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

    def rates(xs: Sequence[DraRun]) -> list[float]:
        return [x.result.rate for x in xs]

    def ratio(a: Sequence[DraRun], b: Sequence[DraRun]) -> list[float]:
        return [x.result.rate / y.result.rate for x, y in zip(a, b, strict=True)]

    def p99(xs: Sequence[DraRun]) -> list[float]:
        return [x.result.p99 if x.result.p99 is not None else float("nan") for x in xs]

    best = int(r.minimal[0].result.extra["concurrency"]) if r.minimal else 0
    result: list[Measurement] = []
    for name, xs in runs.items():
        if not xs:
            continue
        what = f"{name} ({best} threads)" if name.startswith("minimal") else name
        result.append(below(label, f"{what}: pods/s", rates(xs), "pods/s"))
        if name.endswith("burst"):
            result.append(below(label, f"{name}: create -> bound p99", p99(xs), "s"))
        if name.startswith("minimal"):
            result.append(below(label, f"{name}: status + Binding p99", p99(xs), "s"))
        placement = [x.placement_writes for x in xs]
        result.append(below(label, f"{name}: writes per pod, claims + Bindings", placement, ""))
        result.append(below(label, f"{name}: writes per pod, all", [x.all_writes for x in xs], ""))
        shares = [
            100 * x.result.extra["bound share"] for x in xs if "bound share" in x.result.extra
        ]
        if shares:
            result.append(below(label, f"{name}: bound within {SCHEDULER_CAP:.0f} s", shares, "%"))
    if r.gpuplace_drain and r.scheduler_drain:
        result.append(
            above(
                label,
                "gpuplace / kube-scheduler, dra drain",
                ratio(r.gpuplace_drain, r.scheduler_drain),
                "x",
                TARGET_VS_SCHEDULER,
            )
        )
    if r.gpuplace_drain and r.scheduler_cel_only:
        result.append(
            below(
                label,
                "gpuplace / kube-scheduler, dra drain, no node affinity",
                ratio(r.gpuplace_drain, r.scheduler_cel_only),
                "x",
            )
        )
    if r.gpuplace_burst and r.scheduler_burst:
        result.append(
            below(
                label,
                "gpuplace / kube-scheduler, dra burst",
                ratio(r.gpuplace_burst, r.scheduler_burst),
                "x",
            )
        )
    if r.gpuplace_drain and r.minimal:
        result.append(
            above(
                label,
                "gpuplace dra drain / minimal",
                ratio(r.gpuplace_drain, r.minimal),
                "x",
                TARGET_VS_MINIMAL,
            )
        )
    for concurrency, rate in sorted(r.minimal_search.items()):
        result.append(
            below(label, f"minimal search: {concurrency} threads", [rate], "pods/s", detail=True)
        )
    for name, xs in runs.items():
        for key in ("p50",):
            values = [x.result.p50 for x in xs if x.result.p50 is not None]
            if values:
                result.append(below(label, f"{name}: {key}", values, "s", detail=True))
        for process in sorted({p for x in xs for p in x.result.cpu}):
            values = [x.result.cpu.get(process, float("nan")) for x in xs]
            result.append(below(label, f"{name}: CPU of {process}", values, "s", detail=True))
        for key in sorted({k for x in xs for k in x.result.extra}):
            values = [x.result.extra[key] for x in xs if key in x.result.extra]
            result.append(below(label, f"{name}: {key}", values, "", detail=True))
        for key in sorted({k for x in xs for k in x.result.requests}):
            values = [x.result.requests.get(key, 0.0) for x in xs]
            unit = "s" if key.startswith("APF") else ""
            result.append(below(label, f"{name}: {key}", values, unit, detail=True))
    return result


# --------------------------------------------------------------------------- entry points


def bench(
    scale: Scale,
    repeats: int,
    log: Callable[[str], None],
    workdir: Path | None = None,
    profile_dir: Path | None = None,
) -> DraResults:
    results = DraResults()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuplace-dra-")))
        b = DraBench(scale, workdir, log, profile_dir)
        try:
            b.setup()
            for concurrency in MINIMAL_CONCURRENCY:
                run = b.minimal(concurrency)
                results.minimal_search[concurrency] = run.result.rate
                log(f"minimal search: {concurrency} threads: {run.result.rate:,.0f} pods/s")
            best = max(results.minimal_search, key=lambda c: results.minimal_search[c])
            for repeat in range(1, repeats + 1):
                log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f})")
                run = b.gpuplace_dra_burst()
                results.gpuplace_burst.append(run)
                log(f"  gpuplace dra burst: {_line(run)}")
                run = b.gpuplace_dra_drain()
                results.gpuplace_drain.append(run)
                log(f"  gpuplace dra drain: {_line(run)}")
                run = b.scheduler_dra_burst()
                results.scheduler_burst.append(run)
                log(f"  kube-scheduler dra burst: {_line(run)}")
                run = b.scheduler_dra_drain()
                results.scheduler_drain.append(run)
                log(f"  kube-scheduler dra drain: {_line(run)}")
                run = b.scheduler_dra_drain(cel_only_pod)
                results.scheduler_cel_only.append(run)
                log(f"  kube-scheduler dra drain, no node affinity: {_line(run)}")
                run = b.minimal(best)
                results.minimal.append(run)
                log(f"  minimal ({best} threads): {_line(run)}")
        finally:
            b.stop()
    return results


def _line(run: DraRun) -> str:
    r = run.result
    p99 = f", p99 {r.p99:.3f} s" if r.p99 is not None else ""
    return (
        f"{r.rate:,.1f} pods/s{p99}, writes per pod {run.placement_writes:.2f} "
        f"(all {run.all_writes:.2f})"
    )


def _stderr(message: str) -> None:
    print(f"[dra] {message}", file=sys.stderr, flush=True)


DEFAULT = Scale(nodes=100, pods=800)
SMALL = Scale(nodes=20, pods=100)


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """Part of every `make bench`: set-up and one repeat take about five minutes on two busy
    cores, so one repeat runs (`python -m bench.dra --repeats N` for more)."""
    scale = SMALL if small else DEFAULT
    return measurements(scale, bench(scale, min(repeats, 1), _stderr))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dra", description=__doc__)
    parser.add_argument("--nodes", type=int, default=DEFAULT.nodes)
    parser.add_argument("--pods", type=int, default=DEFAULT.pods)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the controller with py-spy during gpuplace's runs (collapsed stacks in DIR)",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    args = parser.parse_args(argv)
    scale = Scale(nodes=args.nodes, pods=args.pods)
    _stderr(f"machine: {describe(machine())}")
    results = bench(scale, args.repeats, _stderr, args.workdir, args.profile)
    _stderr(f"machine at the end: {describe(machine())}")
    for m in measurements(scale, results):
        flag = "" if m.ok is None else (" ok" if m.ok else " MISSED")
        print(f"{m.metric}: {m.value:.4g} {m.unit} {m.target}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
