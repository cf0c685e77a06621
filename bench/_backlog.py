"""A backlog drain: a run's pods exist, then a binder starts on them and binds them all.
gpuplace's controller, kube-scheduler, and the ceiling: a minimal client (`bench._ceiling`) that
only POSTs the same Bindings as gpuplace's."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from bench._bench import ClusterBench
from bench._ceiling import BindingClient, Shape
from bench._kube import CpuSampler, Obj, create_pods, process_cpu, profiling
from bench._runs import BINDING_CPU, CLIENT, LEADER_CPU, RunResult, Usage, drain_result
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    RUN_TIMEOUT,
    Scale,
    binding,
    gpuplace_pod,
    pinned_pod,
)


class Backlogs(ClusterBench):
    """The drains of the contenders and the ceiling's."""

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
