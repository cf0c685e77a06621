"""Placing pods on one local control plane: gpuplace's binder, kube-scheduler, the Binding ceiling.

One cluster (etcd, kube-apiserver, kube-controller-manager, kwok) with 1,000 kwok nodes x 8 GPUs,
node inventories published as agents publish them (ConfigMap + Lease in gpuplace-inventory), the
real `gpuplace webhook` over HTTPS registered with the apiserver, the real `gpuplace controller`
(default settings), and 50 placement maps of 100 slots, one GPU each, spread over all nodes.
Once set up, the bench measures the idle background and finds the ceiling client's best shape
(2). Each repeat then runs, one contender at a time, the headline's steps first: gpuplace's
drain (1), the ceiling right after it (2), gpuplace's burst through the webhook and without it
(3) and the steady rate the webhook's p99 is held to (4); then the details: kube-scheduler's
burst and drain (5), the burst and that steady rate through the reference webhook (3, 4), the
creates one at a time and the other steady rates (4). The table keeps its order.

1. gpuplace, backlog drain: the controller is stopped, the 5,000 pods are created, the controller
   starts. Rate: (pods - 1) / (first bound -> last bound), which leaves out process start-up and
   the creates, so it compares with the ceiling (2), which also only binds.
2. The ceiling, right after gpuplace's drain (the two sides of their ratio on the same cluster, one
   after the other): gpuplace's own pods, admitted by its webhook while its controller is stopped,
   then a minimal client (`bench._ceiling`: P processes x T threads, one keep-alive connection
   each, the pods split between the processes) that only POSTs their Bindings, carrying the same
   annotations as gpuplace's (a signature included, by a key nobody verifies): the same objects
   and the same writes as gpuplace's drain, with the same pod watch running and the rate read
   from it as in the drains. The best shape is found once, before the repeats: one process at
   32, 64, 128 and 256 threads, then 2, 4, ... processes (up to the machine's CPUs, at most 8)
   around the best so far while more processes help, so that the ceiling is the apiserver's
   rather than one Python process's where the machine has the cores.
3. gpuplace, burst: a pod watch opens, then 16 threads create the 5,000 pods (labels gpuplace.io/map
   and gpuplace.io/index) through the webhook, as a controller would. Rate: pods / (first create
   sent -> last pod seen bound); latency: create sent -> the watch sees spec.nodeName, per pod
   (client clocks: creationTimestamp has whole seconds only), also split at the create's answer
   (the create itself; what the binding takes after it, and from the watch's first sight). The
   controller's CPU seconds over that window and its peak RSS (VmHWM, its bind processes'
   added); the admission latency of the webhook as the apiserver measured it
   (apiserver_admission_webhook_admission_duration_seconds, bucket deltas) and as the
   webhook measured it (gpuplace_webhook_admission_duration_seconds). The same burst then runs
   with the pod webhook's configuration deleted ("without it") and, among the details, with its
   entry pointed at the reference webhook (`bench/refwebhook`, Go's net/http over TLS, HTTP/1.1,
   answering every review with gpuplace's own patch for these pods, asked of gpuplace's webhook
   first): the apiserver does the same work as through gpuplace's, the server next to none, so
   "through the reference / without it" is the floor a webhook leaves on this machine and
   "gpuplace's / the reference" is the share that is gpuplace's server's.
4. The webhook at a steady rate: 50 creates a second for 20 s (the target's rate), the webhook's
   calls and the same creates' etcd writes timed by the apiserver's traces; among the details
   the same through the reference webhook, 25 and 100 creates a second, and 300 creates one at
   a time.
5. kube-scheduler (client QPS raised to 5,000, burst 10,000) on the same pods, each pinned to the
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
through the reference webhook, the steady 50 creates/s) and the rows it feeds, then the same
burst and steady rate through gpuplace's webhook app served by candidate servers instead of its
own (`bench._candidates`: granian, Rust over WSGI, and gunicorn's gthread worker, each with TLS
on loopback, HTTP/1.1, as many processes as the webhook's): per candidate its creates/s and
their ratio to gpuplace's own server's, its processes' CPU per create, its traced p99 at 50/s
against the same creates' etcd writes and against gpuplace's own server's; a candidate that is
not installed or does not start reads "not run" (the log says why);
`--profile DIR` samples the controller with py-spy (`python -m bench._stacks DIR/*.txt` sums it up);
`--budget S` starts no step (a burst, a steady rate, a drain, a repeat) more than S seconds after
the set-up, so that a machine lent for minutes prints the table of what ran: the figures of the
steps left out read "not run" (the ceiling search always runs whole, and the headline's steps
start before the details').
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench import Measurement, log_to_stderr
from bench._cli import Benchmark, cli
from bench._report import creates_measurements, measurements
from bench._runs import Results
from bench._steps import PlacementBench, contend, contend_creates
from bench._workload import Scale

__all__ = [
    "ONLY_CREATES",
    "Benchmark",
    "PlacementBench",
    "Results",
    "Scale",
    "bench",
    "bench_creates",
    "cli",
    "contend",
    "main",
    "measurements",
    "run",
]

bench = Benchmark(PlacementBench, "gpuplace-bench", contend)
bench_creates = Benchmark(PlacementBench, "gpuplace-bench", contend_creates)
#: `--only creates` runs `contend_creates` alone (a minute, not the whole bench).
ONLY_CREATES = ("--only", "creates")

_stderr = log_to_stderr("placement")


def run(repeats: int, small: bool = False) -> list[Measurement]:
    scale = Scale(nodes=100, pods=500) if small else Scale()
    return measurements(scale, bench(scale, repeats, _stderr))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m bench.placement"
    if any(args[i : i + 2] == list(ONLY_CREATES) for i in range(len(args))):
        i = next(i for i in range(len(args)) if args[i : i + 2] == list(ONLY_CREATES))
        rest = args[:i] + args[i + 2 :]
        return cli(prog, __doc__, Scale(), 1, bench_creates, creates_measurements, _stderr, rest)
    return cli(prog, __doc__, Scale(), 3, bench, measurements, _stderr, args)


if __name__ == "__main__":
    sys.exit(main())
