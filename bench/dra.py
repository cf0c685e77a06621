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
import math
import os
import sys
from collections.abc import Callable, Sequence

from bench import Budget, Measurement, above, below, log_to_stderr
from bench._cli import Benchmark, cli
from bench._dra_runs import DraBench
from bench._dra_workload import (
    MINIMAL_CONCURRENCY,
    SCHEDULER_CAP,
    TARGET_VS_MINIMAL,
    TARGET_VS_SCHEDULER,
    VS_MINIMAL,
    DraResults,
    DraRun,
    cel_only_pod,
)
from bench._report import rates, ratio, run_details
from bench._steps import Contender, best_concurrency, run_contenders
from bench._workload import Scale

NAME = "dra"


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
