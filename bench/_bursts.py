"""A burst: a run's pods created by `CREATE_THREADS` threads as fast as they go, timed until a
pod watch has seen every one bound. gpuplace's through its webhook, the same without it, through
the reference webhook and through its app served by a candidate server, kube-scheduler's; and the
bursts' steps of a repeat."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from bench._candidates import CandidateServer
from bench._kube import Obj, create_pods, process_cpu, profiling
from bench._runs import (
    CANDIDATE_CPU,
    REFERENCE_CPU,
    Admission,
    Results,
    RunResult,
    Usage,
    burst_result,
)
from bench._stats import bucket_delta, histogram_buckets
from bench._webhooks import APISERVER_WEBHOOK_METRIC, WebhookSwitch
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    Scale,
    admitted_gpuplace_pod,
    gpuplace_pod,
    pinned_pod,
)
from webhook.manifests import POD_WEBHOOK


class Bursts(WebhookSwitch):
    """The bursts of the contenders."""

    def gpuplace_burst(self) -> tuple[RunResult, Admission]:
        self.gpuplace_binding()
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
        schedulerName and the wiring the webhook would set (the pod-bindings policy refuses a
        map's pod without the first, the binder places none without the second), and the
        controller binds them as in the burst."""
        self.gpuplace_binding()
        with self._unhooked():
            return self._burst(admitted_gpuplace_pod)

    def reference_burst(self) -> RunResult:
        """The same burst with the pod webhook's entry pointed at the reference webhook (Go, one
        fixed answer: gpuplace's patch for these pods): the apiserver does the same work as
        with gpuplace's webhook, the server next to none. Its CPU is in the result's extra."""
        self.gpuplace_binding()
        with self._through_reference() as reference:
            cpu = process_cpu(reference.pid)
            result = self._burst(gpuplace_pod, apart=[reference.pid])
            cpu = process_cpu(reference.pid) - cpu
        return replace(result, extra=result.extra | {REFERENCE_CPU: cpu})

    def candidate_burst(self, server: CandidateServer) -> RunResult:
        """The same burst through gpuplace's webhook app served by a candidate server (the pod
        webhook's entry pointed at it: `through_candidate`); its process tree's CPU is in the
        result's extra (`CANDIDATE_CPU`)."""
        cpu = process_cpu(server.pid)
        result = self._burst(gpuplace_pod, apart=[server.pid])
        cpu = process_cpu(server.pid) - cpu
        return replace(result, extra=result.extra | {CANDIDATE_CPU: cpu})

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


def webhook_bursts(b: Bursts, results: Results, log: Callable[[str], None]) -> None:
    """One repeat's bursts of the headline: through gpuplace's webhook, and without it."""
    burst, admission = b.gpuplace_burst()
    results.gpuplace_burst.append(burst)
    results.admission.append(admission)
    log(f"  gpuplace burst: {burst.line()}")
    unhooked = b.gpuplace_burst_unhooked()
    results.gpuplace_burst_unhooked.append(unhooked)
    log(
        f"  creates/s: {burst.extra['creates_per_s']:,.0f} through gpuplace's pod webhook, "
        f"{unhooked.extra['creates_per_s']:,.0f} without it"
    )


def reference_bursts(b: Bursts, results: Results, log: Callable[[str], None]) -> None:
    """One repeat's burst through the reference webhook (a detail: the floor a webhook leaves)."""
    reference = b.reference_burst()
    results.reference_burst.append(reference)
    log(f"  creates/s: {reference.extra['creates_per_s']:,.0f} through the reference webhook")


def creates_bursts(b: Bursts, results: Results, log: Callable[[str], None]) -> None:
    """One repeat's bursts: through gpuplace's webhook, without it, through the reference."""
    webhook_bursts(b, results, log)
    reference_bursts(b, results, log)
