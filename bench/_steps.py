"""The steps of a placement bench and their order: the ceiling client's best shape, then per repeat
the headline's steps before the details', each only while the budget (`--budget`) allows it.

The headline: gpuplace's drain and the ceiling bound right after it (their ratio), the bursts
through the webhook and without it (creates/s, the burst's p99) and the steady rate the
webhook's p99 is held to against etcd's. The details: kube-scheduler's runs, the reference
webhook's, the creates one at a time and the other steady rates; then the next repeat. A machine
lent for minutes thus prints the headline's figures first (the table keeps its order)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

from bench import Budget
from bench._admissions import Admissions, one_at_a_time, reference_steady, steady
from bench._backlog import Backlogs
from bench._bursts import Bursts, creates_bursts, reference_bursts, webhook_bursts
from bench._candidates import ENGINES
from bench._ceiling import Shape
from bench._ceiling import search as ceiling_search
from bench._kube import MACHINE
from bench._proc import BenchError
from bench._runs import CANDIDATE_CPU, Results, RunResult, traced_ms
from bench._workload import (
    PROCESSES_ENV,
    STEADY_RATES,
    STEADY_SECONDS,
    TARGET_STEADY_RATE,
    webhook_processes,
)
from gpuplace_dev.localcluster import ClusterError

#: The ceiling client's threads tried in one process; `bench._ceiling.search` then tries more.
CEILING_CONCURRENCY = (32, 64, 128, 256)

T = TypeVar("T")
#: One contender of a repeat: its name, its runs so far, and how to run it once more.
Contender = tuple[str, list[T], Callable[[], T]]
#: One step of a repeat: its name (as `Budget` logs it) and how to run it.
Step = tuple[str, Callable[[], None]]


class PlacementBench(Bursts, Admissions, Backlogs):
    """Sets the cluster and gpuplace up once; runs the contenders on it."""


def contend(
    b: PlacementBench,
    repeats: int,
    log: Callable[[str], None],
    budget: Budget,
    search: Sequence[int] = CEILING_CONCURRENCY,
) -> Results:
    """The contenders on a bench that is set up: the ceiling client's best shape (one process at
    each of `search` threads, then more processes: `bench._ceiling.search`), then `repeats` times
    the steps of `headline_steps` and then of `detail_steps`, each only while `budget` allows it
    (the search always runs whole: the drains are held against its best shape)."""
    results = Results()
    results.idle_cpu = b.idle()
    log(f"idle: the machine busy {results.idle_cpu[MACHINE]:.2f} CPU seconds per second")
    best = ceiling_search(
        lambda shape: b.ceiling(shape).rate,
        search,
        results.ceiling_search,
        log,
        os.cpu_count() or 1,
    )
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"repeat {repeat}"):
            break
        log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f}; {b.storage()})")
        for step, run_step in [
            *headline_steps(b, results, best, log),
            *detail_steps(b, results, log),
        ]:
            if budget.allows(step):
                run_step()
    results.controller_peak_mib = b.controller_peak_mib
    results.webhook_peak_mib = b.webhook_peak_mib()
    return results


def headline_steps(
    b: PlacementBench, results: Results, best: Shape, log: Callable[[str], None]
) -> list[Step]:
    """A repeat's steps of the headline, in order: gpuplace's drain, then at once the ceiling at
    its best shape, so that the two sides of their ratio bind on the same cluster, one right
    after the other; the bursts through the webhook and without it; the target's steady rate."""
    return [
        *contender_steps(drain_contenders(b, results, best), RunResult.line, log),
        ("the bursts through the webhook and without it", lambda: webhook_bursts(b, results, log)),
        (
            f"the creates at {TARGET_STEADY_RATE}/s",
            lambda: steady(b, results, log, TARGET_STEADY_RATE),
        ),
    ]


def detail_steps(b: PlacementBench, results: Results, log: Callable[[str], None]) -> list[Step]:
    """A repeat's steps after its headline's, in order: kube-scheduler's burst and drain, the
    burst and the target's steady rate through the reference webhook, the creates one at a time
    and the other steady rates."""
    return [
        *contender_steps(scheduler_contenders(b, results), RunResult.line, log),
        ("the burst through the reference webhook", lambda: reference_bursts(b, results, log)),
        (
            f"the reference webhook at {TARGET_STEADY_RATE} creates/s",
            lambda: reference_steady(b, results, log),
        ),
        ("the creates one at a time", lambda: one_at_a_time(b, results)),
        *[
            (f"the creates at {rate}/s", lambda rate=rate: steady(b, results, log, rate))
            for rate in STEADY_RATES
            if rate != TARGET_STEADY_RATE
        ],
    ]


def drain_contenders(b: Backlogs, results: Results, best: Shape) -> list[Contender[RunResult]]:
    """The headline's drains: gpuplace's, then at once the ceiling at its best shape."""
    return [
        ("gpuplace drain", results.gpuplace_drain, b.gpuplace_drain),
        (f"ceiling ({best.describe()})", results.ceiling, lambda: b.ceiling(best)),
    ]


def scheduler_contenders(b: PlacementBench, results: Results) -> list[Contender[RunResult]]:
    """kube-scheduler's runs on the same pods, pinned to their slots' nodes."""
    return [
        ("kube-scheduler burst", results.scheduler_burst, b.scheduler_burst),
        ("kube-scheduler drain", results.scheduler_drain, b.scheduler_drain),
    ]


def contender_steps(
    contenders: Sequence[Contender[T]], line: Callable[[T], str], log: Callable[[str], None]
) -> list[Step]:
    """Each contender's next run as a step, logged as `line` describes it."""

    def step(name: str, runs: list[T], contender: Callable[[], T]) -> Step:
        def run() -> None:
            runs.append(contender())
            log(f"  {name}: {line(runs[-1])}")

        return name, run

    return [step(*contender) for contender in contenders]


def run_contenders(
    contenders: Sequence[Contender[T]],
    line: Callable[[T], str],
    log: Callable[[str], None],
    allows: Callable[[str], bool] = lambda _: True,
) -> None:
    """One more run of each contender, in order, each logged as `line` describes it; a run that
    `allows` refuses (`Budget.allows`) is left out."""
    for name, run in contender_steps(contenders, line, log):
        if allows(name):
            run()


def best_concurrency(
    what: str,
    rate: Callable[[int], float],
    search: Sequence[int],
    found: dict[int, float],
    log: Callable[[str], None],
) -> int:
    """Measures `rate` at each concurrency of `search` into `found`; the fastest of them."""
    for concurrency in search:
        found[concurrency] = rate(concurrency)
        log(f"{what} search: {concurrency} threads: {found[concurrency]:,.0f} pods/s")
    return max(found, key=lambda c: found[c])


def contend_creates(
    b: PlacementBench, repeats: int, log: Callable[[str], None], budget: Budget
) -> Results:
    """Only the webhook's part: per repeat (while `budget` allows one), the burst through the
    webhook, the same burst without it and through the reference webhook, and the steady rate its
    p99 is held to, through gpuplace's webhook and the reference's; then the same burst and
    steady rate through gpuplace's webhook app served by each candidate server
    (`candidate_runs`): after gpuplace's own steps in odd repeats, before them in even ones."""
    results = Results()
    log(f"the webhook serves from {webhook_processes()} process(es) ({PROCESSES_ENV})")
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"repeat {repeat}"):
            break
        log(f"repeat {repeat}/{repeats} (load {os.getloadavg()[0]:.2f})")
        # Every other repeat the candidates go first, in the other order: a machine that gets
        # quieter (or busier) over a run favours no server in the medians.
        first = repeat % 2 == 0
        engines = tuple(reversed(ENGINES)) if first else ENGINES
        if first:
            for engine in engines:
                candidate_runs(b, results, log, engine)
        creates_bursts(b, results, log)
        rate = TARGET_STEADY_RATE
        admission = b.admission_at(rate, int(rate * STEADY_SECONDS))
        results.admission_steady.setdefault(rate, []).append(admission)
        reference_steady(b, results, log)
        if not first:
            for engine in engines:
                candidate_runs(b, results, log, engine)
    return results


def candidate_runs(
    b: PlacementBench, results: Results, log: Callable[[str], None], engine: str
) -> None:
    """The burst and the target's steady rate through gpuplace's webhook app served by the
    candidate server `engine` (`bench._candidates`), started once for both. One that is not
    installed or does not start is left out, the reason logged: its rows read "not run"."""
    b.gpuplace_binding()
    rate = TARGET_STEADY_RATE
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(b.through_candidate(engine))
        except (BenchError, ClusterError) as exc:
            log(f"  {engine}: not run: {exc}")
            return
        burst = b.candidate_burst(server)
        results.candidate_burst.setdefault(engine, []).append(burst)
        cpu = 1000 * burst.extra[CANDIDATE_CPU] / max(1, burst.pods)
        log(
            f"  creates/s: {burst.extra['creates_per_s']:,.0f} through gpuplace's webhook served "
            f"by {engine} ({cpu:.2f} ms of its CPU per create)"
        )
        steady = b.admission_at(rate, int(rate * STEADY_SECONDS))
        results.candidate_steady.setdefault(engine, []).append(steady)
        (p99,) = traced_ms([steady], 0.99)
        (etcd,) = traced_ms([steady], 0.99, etcd=True)
        log(
            f"  served by {engine} at {rate} creates/s: p99 {p99:.1f} ms (traces) against "
            f"etcd's {etcd:.1f} ms"
        )
