"""The table of a placement bench's runs: its headline figures against their targets, then the
details (every process's CPU, API requests per pod, the ceiling search, the idle background)."""

from __future__ import annotations

from collections.abc import Sequence

from bench import Measurement, above, below
from bench._candidates import ENGINES
from bench._ceiling import Shape
from bench._runs import (
    AFTER_CREATE_P99,
    APISERVER,
    BINDING_CPU,
    CANDIDATE_CPU,
    CLIENT,
    CREATE_P99,
    REFERENCE_CPU,
    WEBHOOK,
    Admission,
    Results,
    RunResult,
    traced_ms,
)
from bench._stats import histogram_count, histogram_quantile, share_at_most
from bench._workload import (
    PROCESSES_ENV,
    STEADY_RATES,
    TARGET_STEADY_RATE,
    Scale,
    webhook_processes,
)

NAME = "placement"
TARGET_VS_SCHEDULER = 2.0
TARGET_VS_CEILING = 0.9
TARGET_CPU_PER_POD_MS = 0.6
TARGET_STARTUP_S = 10.0
TARGET_P99_S = 1.0
#: The webhook's p99 at the steady rate against the same creates' etcd write p99 (both from the
#: apiserver's traces): what a create waits for the webhook, next to what it waits for storage.
TARGET_WEBHOOK_VS_ETCD_P99 = 2.0
#: A burst's creates/s through the webhook, against the same burst with the webhook unregistered.
TARGET_CREATES_RATIO = 0.85


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
    reference: Sequence[RunResult] | None = None,
) -> list[Measurement]:
    """A burst's creates/s through the webhook and the same burst's without it, per repeat, and
    the webhook's CPU per create: on a machine whose cores the apiserver and the webhook share,
    the ratio moves with that CPU. With `reference`, the same burst through the reference
    webhook (the same patch from a server that costs next to nothing): the floor a webhook's
    round trip leaves in the apiserver on this machine, and how far gpuplace's is from it (rows
    that read "not run" where the budget left its runs out). Ratios pair the repeats both sides
    ran (`ratio`)."""
    hooked = [x.extra["creates_per_s"] for x in through]
    unhooked = [x.extra["creates_per_s"] for x in without]
    floor = [x.extra["creates_per_s"] for x in reference or ()]
    rows = (
        [
            below(
                label, "burst creates/s through the reference webhook (Go, same patch)", floor, "/s"
            ),
            below(
                label,
                "creates/s through the reference webhook / without it",
                [a / b for a, b in zip(floor, unhooked, strict=False)],
                "x",
            ),
            below(
                label,
                "creates/s through gpuplace's webhook / through the reference webhook",
                [a / b for a, b in zip(hooked, floor, strict=False)],
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
        if reference is not None
        else []
    )
    return [
        below(label, "burst creates/s through the webhook", hooked, "/s"),
        below(label, "burst creates/s without it (webhook unregistered)", unhooked, "/s"),
        above(
            label,
            "creates/s through the webhook / without it",
            [a / b for a, b in zip(hooked, unhooked, strict=False)],
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


def reference_rows(label: str, r: Results, always: bool = False) -> list[Measurement]:
    """The target's steady rate through the reference webhook: its traced p99 against the same
    creates' etcd write, and gpuplace's p99 over it (each repeat against its own); none if it
    did not run, unless `always` (then they read "not run")."""
    if not r.reference_steady and not always:
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
    # Every rate's rows, those of a rate the budget left out reading "not run".
    for rate in sorted({*STEADY_RATES, *r.admission_steady}):
        steady = r.admission_steady.get(rate, [])
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
    return result + reference_rows(label, r, always=True)


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
        *reference_rows(label, r, always=True),
        *_waits(label, f"at {rate} creates/s", r.admission_steady.get(rate, [])),
        below(label, f"webhook server processes ({PROCESSES_ENV})", [webhook_processes()], ""),
        *candidate_rows(label, r),
    ]


def candidate_rows(label: str, r: Results) -> list[Measurement]:
    """Per candidate server of gpuplace's webhook app (`bench._candidates`): the same burst's
    creates/s through it, over gpuplace's own server's, and its processes' CPU per create; the
    target's steady rate through it, its traced p99 against the same creates' etcd writes and
    over gpuplace's own server's (each repeat against its own). A candidate that did not run
    (not installed, did not start: the log says why) has its rows, reading "not run"."""
    rate = TARGET_STEADY_RATE
    hooked = [x.extra["creates_per_s"] for x in r.gpuplace_burst]
    ours = traced_ms(r.admission_steady.get(rate, []), 0.99)
    rows = []
    for engine in ENGINES:
        burst = r.candidate_burst.get(engine, [])
        steady = r.candidate_steady.get(engine, [])
        served = f"gpuplace's webhook served by {engine}"
        creates = [x.extra["creates_per_s"] for x in burst]
        p99 = traced_ms(steady, 0.99)
        etcd = traced_ms(steady, 0.99, etcd=True)
        when = f"at {rate} creates/s through {served}"
        rows += [
            below(label, f"burst creates/s through {served}", creates, "/s"),
            below(
                label,
                f"creates/s through {served} / through its own server",
                [c / h for c, h in zip(creates, hooked, strict=False)],
                "x",
            ),
            below(
                label,
                f"burst: {engine} CPU per create (its processes)",
                [1000 * x.extra[CANDIDATE_CPU] / x.pods if x.pods else float("nan") for x in burst],
                "ms",
            ),
            below(label, f"webhook p99 (apiserver's traces) {when}", p99, "ms"),
            below(
                label,
                f"webhook p99 / the same creates' etcd write p99 (apiserver's traces) {when}",
                [w / e for w, e in zip(p99, etcd, strict=True)],
                "x",
            ),
            below(
                label,
                f"webhook p99 at {rate} creates/s (apiserver's traces), served by {engine} / "
                "by its own server",
                [c / o for c, o in zip(p99, ours, strict=False)],
                "x",
            ),
        ]
    return rows
