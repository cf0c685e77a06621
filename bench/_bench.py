"""The cluster of the placement benchmarks and gpuplace on it, set up once, and what every run
on it shares: the processes taking part, what a run costs them (`ClusterBench._measuring`), a
run's pods, clearing them and waiting for the apiserver to come back to its idle background."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

from bench import _setup
from bench._kube import (
    CpuMeter,
    CpuSampler,
    Obj,
    PodWatch,
    call,
    delete_pods,
    metrics,
    peak_rss_mib,
)
from bench._proc import BenchError
from bench._runs import CLIENT, WINDOWED, Usage
from bench._stats import Buckets, counter_delta, counter_totals, histogram_buckets
from bench._traces import SpanSink
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    PROBE,
    RUN_TIMEOUT,
    Scale,
    gpuplace_pod,
    node_name,
)
from gpuplace_dev.demo.components import Component, Components
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from gpuplace_dev.localcluster.layout import ClusterState
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.paths import PODS
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from webhook.admission import Endpoint

SCHEDULER_QPS = 5000.0
#: Between runs, the apiserver's write rate must come back to within this of the idle rate
#: (kwok works through a run's pods for a while after they are deleted).
QUIESCE_MARGIN = 1.25
QUIESCE_SLACK = 5.0  # writes/s
WEBHOOK_METRIC = "gpuplace_webhook_admission_duration_seconds"
APF_WAIT_METRIC = "apiserver_flowcontrol_request_wait_duration_seconds_sum"


class ClusterBench:
    """Sets the cluster and gpuplace up once; what the contenders' runs on it share (the runs
    themselves are in `bench._bursts`, `bench._admissions` and `bench._backlog`)."""

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
        """kube-scheduler's requests in API Priority and Fairness' exempt level
        (`_setup.scheduler_exemption`)."""
        _setup.exempt_scheduler(self.cluster)

    def publish_inventories(self) -> None:
        _setup.publish_inventories(self.cluster, self.scale, self.lease_seconds)

    def apply_maps(self) -> None:
        _setup.apply_maps(self.cluster, self.scale)

    def _webhook_registered(self) -> bool:
        return _setup.pod_webhook_registered(self.cluster)

    def _maps_valid(self) -> bool:
        phases = _setup.map_phases(self.cluster)
        if phases is None:
            return False
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
        """What etcd holds (`_setup.storage`)."""
        return _setup.storage(self.cluster)

    def _webhook_buckets(self) -> Buckets:
        """gpuplace's webhook's pod admissions (/mutate). Its map validations (/validate) are left
        out: the controller's status writes to a map's ConfigMap go through them whichever server
        the pod webhook's entry points at, so counting them read a block through another server
        as calls to gpuplace's."""
        return histogram_buckets(
            self._webhook_metrics(), WEBHOOK_METRIC, {"operation": Endpoint.MUTATE.value}
        )

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

    def gpuplace_binding(self) -> None:
        """gpuplace's controller running and synced: started again if a run stopped it (a drain,
        the ceiling, kube-scheduler's runs)."""
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)

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
