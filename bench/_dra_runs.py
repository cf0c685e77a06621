"""The DRA contenders' runs: gpuplace's burst and drain (a failover onto a backlog whose claims
exist), kube-scheduler's with claims whose CEL selects the slot's GPU, and the minimal client
that writes only each claim's status and the pod's Binding."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from bench._dra_cluster import DraCluster
from bench._dra_workload import (
    RUN_TIMEOUT,
    SCHEDULER_CAP,
    SEEN,
    SETTINGS,
    DraRun,
    cel_pod,
    slot_device,
)
from bench._kube import Obj, call, concurrently, create_pods, process_cpu, profiling
from bench._runs import Usage, burst_result
from bench._stats import percentile
from bench._workload import CREATE_THREADS, NAMESPACE, Scale, binding, gpuplace_pod, pod_name
from kubeio.paths import PODS, RESOURCE_CLAIMS
from placement.dra import allocation_status


class DraBench(DraCluster):
    """Every contender of the DRA benchmark."""

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
