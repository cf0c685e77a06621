"""The webhook's latency as pods arrive one at a time or at a steady rate (below saturation, as
controllers scale up), through gpuplace's webhook or the reference webhook: the apiserver's and
the webhook's histograms, and each call and the same creates' etcd writes as the apiserver's
traces timed them (`bench._traces`); and those steps of a repeat."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from bench._kube import create_pods, machine_busy, run_queue_wait
from bench._runs import Admission, Results, traced_ms
from bench._stats import bucket_delta, histogram_buckets, histogram_count, histogram_quantile
from bench._traces import ETCD_SPAN, WEBHOOK_SPAN, trace_id
from bench._webhooks import APISERVER_WEBHOOK_METRIC, WebhookSwitch
from bench._workload import NAMESPACE, STEADY_SECONDS, TARGET_STEADY_RATE, gpuplace_pod
from webhook.manifests import POD_WEBHOOK

#: Threads that keep a steady create rate (each create takes a few ms to tens of ms).
STEADY_THREADS = 8
#: How long the apiserver may take to export the spans of a run's creates (it batches every 5 s).
TRACE_WAIT = 20.0


class Admissions(WebhookSwitch):
    """Creates one at a time and at steady rates, timed as the webhook's calls."""

    def admission_one_at_a_time(self, count: int = 300) -> Admission:
        """The webhook's latency with one pod create at a time: in a burst the apiserver's own
        CPU is saturated and its figure for the webhook call holds the apiserver's wait for a
        CPU as well; here it is close to the webhook's own cost plus a TLS round trip."""
        return self.admission_at(None, count)

    def admission_at(self, rate: float | None, count: int) -> Admission:
        """The webhook's latency with `count` pods created at a steady `rate` per second (below
        saturation, as pods arrive when controllers scale up), or one at a time (None); the
        pods are bound meanwhile, as in production."""
        self.gpuplace_binding()
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

    def reference_admission_at(self, rate: float, count: int) -> Admission:
        """`admission_at` with the pod webhook's entry pointed at the reference webhook: what a
        webhook call costs on this machine when the server does next to nothing (its traces'
        p99 against gpuplace's at the same rate)."""
        self.gpuplace_binding()
        with self._through_reference():
            return self.admission_at(rate, count)


def one_at_a_time(b: Admissions, results: Results) -> None:
    results.admission_sequential.append(b.admission_one_at_a_time())


def steady(b: Admissions, results: Results, log: Callable[[str], None], rate: int) -> None:
    """`STEADY_SECONDS` of creates at `rate` per second through gpuplace's webhook."""
    admission = b.admission_at(rate, int(rate * STEADY_SECONDS))
    results.admission_steady.setdefault(rate, []).append(admission)
    quantile = histogram_quantile(0.99, admission.apiserver)
    p99 = float("nan") if quantile is None else quantile * 1000
    (traced,) = traced_ms([admission], 0.99)
    (etcd,) = traced_ms([admission], 0.99, etcd=True)
    log(
        f"  webhook at {rate} creates/s ({admission.rate:.1f} sent): p99 {p99:.1f} ms; "
        f"traced {traced:.1f} ms against etcd's {etcd:.1f} ms"
    )


def reference_steady(b: Admissions, results: Results, log: Callable[[str], None]) -> None:
    """The target's steady rate through the reference webhook, after gpuplace's."""
    rate = TARGET_STEADY_RATE
    steady = b.reference_admission_at(rate, int(rate * STEADY_SECONDS))
    results.reference_steady.append(steady)
    (p99,) = traced_ms([steady], 0.99)
    log(f"  the reference webhook at {rate} creates/s: p99 {p99:.1f} ms (traces)")


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
