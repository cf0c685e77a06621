"""A benchmark's budget (`--budget`): the steps it lets start, what it leaves out, and the table
of a run it cut short, which still prints what ran."""

from __future__ import annotations

from typing import cast

import pytest

from bench import Budget, above, table
from bench._ceiling import Shape
from bench._kube import MACHINE
from bench._report import measurements
from bench._runs import BINDING_CPU, REFERENCE_CPU, Admission, RunResult
from bench._steps import PlacementBench, contend
from bench._workload import Scale
from bench.drains import Setting, contend_phases, phases

SCALE = Scale(nodes=20, pods=100)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_budget_lets_steps_start_until_its_seconds_are_spent_and_says_so_once() -> None:
    clock, logged = Clock(), list[str]()
    budget = Budget(10, logged.append, clock)
    assert budget.allows("a")
    clock.now = 10.0
    assert budget.allows("b")  # at its last second a step still starts
    clock.now = 10.5
    assert not budget.allows("c")
    assert not budget.allows("d")
    assert budget.left_out == ["c", "d"]
    assert logged == ["budget of 10 s spent: c and what follows not run"]


def test_a_figure_none_of_whose_runs_ran_reads_not_run_and_is_neither_met_nor_missed() -> None:
    left_out = above("b", "x / y", [], "x", 0.9)
    assert left_out.ok is None and left_out.samples == () and left_out.target == ">= 0.9 x"
    ran = above("b", "x / z", [0.8], "x", 0.9)
    assert ran.ok is False
    assert table([left_out, ran]).splitlines()[2:] == [
        "| b | x / y | not run | >= 0.9 x |  |",
        "| b | x / z | 0.8 x | >= 0.9 x | **no** |",
    ]


def _run(rate: float, **extra: float) -> RunResult:
    return RunResult(rate=rate, seconds=1.0, p50=0.1, p99=0.5, pods=100, extra=extra)


#: Where `FakeBench` spends its budget: the search's first ceiling, the first after the drain.
IN_THE_SEARCH, AFTER_THE_DRAIN = "in the search", "after the drain"


class FakeBench:
    """Every step of a placement repeat, recorded; the clock jumps past the budget during the
    step `spend_on` (a step's name, `IN_THE_SEARCH` or `AFTER_THE_DRAIN`)."""

    controller_peak_mib = 100.0

    def __init__(self, clock: Clock, spend_on: str = AFTER_THE_DRAIN) -> None:
        self.clock = clock
        self.spend_on = spend_on
        self.calls: list[str] = []

    def _step(self, name: str) -> None:
        ceiling = name.startswith("ceiling ")
        if (
            name == self.spend_on
            or (ceiling and self.spend_on == IN_THE_SEARCH)
            or (ceiling and self.spend_on == AFTER_THE_DRAIN and "gpuplace drain" in self.calls)
        ):
            self.clock.now = 1e9
        self.calls.append(name)

    def idle(self) -> dict[str, float]:
        return {MACHINE: 1.0}

    def storage(self) -> str:
        return "etcd 1 MiB"

    def webhook_peak_mib(self) -> float:
        return 50.0

    def ceiling(self, shape: Shape) -> RunResult:
        self._step(f"ceiling {shape.describe()}")
        extra = {"processes": float(shape.processes), "threads per process": float(shape.threads)}
        return _run(600, **extra)

    def gpuplace_burst(self) -> tuple[RunResult, Admission]:
        self._step("burst")
        return _run(300, creates_per_s=400), Admission({}, {})

    def gpuplace_burst_unhooked(self) -> RunResult:
        self._step("burst without the webhook")
        return _run(300, creates_per_s=500)

    def reference_burst(self) -> RunResult:
        self._step("burst through the reference")
        return _run(300, creates_per_s=450, **{REFERENCE_CPU: 0.01})

    def admission_one_at_a_time(self) -> Admission:
        self._step("one at a time")
        return Admission({}, {})

    def admission_at(self, rate: float, count: int) -> Admission:
        self._step(f"{rate:g}/s")
        # Each webhook call 3 ms and each etcd write 2 ms, as the apiserver's traces time them.
        return Admission({}, {}, rate=rate, traced=(0.003,) * 10, creates=10, etcd=(0.002,) * 10)

    def reference_admission_at(self, rate: float, count: int) -> Admission:
        self._step(f"reference {rate:g}/s")
        return Admission({}, {})

    def gpuplace_drain(self) -> RunResult:
        self._step("gpuplace drain")
        return _run(540, **{BINDING_CPU: 0.0005, "start_to_first_bound_s": 1.5})

    def scheduler_burst(self) -> RunResult:
        self._step("kube-scheduler burst")
        return _run(100)

    def scheduler_drain(self) -> RunResult:
        self._step("kube-scheduler drain")
        return _run(280, **{BINDING_CPU: 0.003, "start_to_first_bound_s": 2.0})


#: The steps of a repeat after its headline's, in order, as `Budget` names them.
DETAILS = [
    "kube-scheduler burst",
    "kube-scheduler drain",
    "the burst through the reference webhook",
    "the reference webhook at 50 creates/s",
    "the creates one at a time",
    "the creates at 25/s",
    "the creates at 100/s",
]


def test_a_run_cut_short_after_the_ceiling_still_holds_the_drain_against_it() -> None:
    clock, logged = Clock(), list[str]()
    bench, budget = FakeBench(clock), Budget(300, logged.append, clock)
    results = contend(cast(PlacementBench, bench), 2, logged.append, budget, search=(32,))
    # After the search: the repeat's drain and the ceiling right after it.
    assert bench.calls[bench.calls.index("gpuplace drain") :] == [
        "gpuplace drain",
        "ceiling 1 process x 32 threads",
    ]
    assert budget.left_out == [
        "the bursts through the webhook and without it",
        "the creates at 50/s",
        *DETAILS,
        "repeat 2",
    ]
    assert (
        "budget of 300 s spent: the bursts through the webhook and without it and what follows "
        "not run" in logged
    )
    rows = {m.metric: m for m in measurements(SCALE, results)}
    drain = rows["gpuplace drain / ceiling"]
    assert drain.samples == (540 / 600,) and drain.ok is True
    for left_out in (
        "creates/s through the webhook / without it",
        "kube-scheduler drain: pods/s",
        "gpuplace / kube-scheduler, drain",
    ):
        assert rows[left_out].samples == () and rows[left_out].ok is None, left_out
    printed = table(list(rows.values()))
    assert "| gpuplace / kube-scheduler, drain | not run | >= 2 x |  |" in printed


def test_a_budget_spent_in_the_headline_leaves_out_the_details_and_measures_the_headline() -> None:
    clock, logged = Clock(), list[str]()
    bench, budget = FakeBench(clock, spend_on="50/s"), Budget(300, logged.append, clock)
    results = contend(cast(PlacementBench, bench), 2, logged.append, budget, search=(32,))
    assert bench.calls[bench.calls.index("gpuplace drain") :] == [
        "gpuplace drain",
        "ceiling 1 process x 32 threads",
        "burst",
        "burst without the webhook",
        "50/s",
    ]
    assert budget.left_out == [*DETAILS, "repeat 2"]
    rows = {m.metric: m for m in measurements(SCALE, results)}
    headline = {
        "gpuplace drain / ceiling": 540 / 600,
        "creates/s through the webhook / without it": 400 / 500,
        "gpuplace burst: create -> bound p99": 0.5,
        "webhook p99 / the same creates' etcd write p99 (apiserver's traces) at 50 creates/s": (
            3 / 2
        ),
    }
    for metric, value in headline.items():
        measured = rows[metric]
        assert len(measured.samples) == 1 and measured.value == pytest.approx(value), metric
    details = [
        "gpuplace / kube-scheduler, drain",
        "kube-scheduler burst: pods/s",
        "burst creates/s through the reference webhook (Go, same patch)",
        "creates/s through gpuplace's webhook / through the reference webhook",
        "webhook p99 at 50 creates/s (apiserver's traces), gpuplace's / the reference's",
        "webhook p99 (apiserver's histogram), one create at a time",
        "webhook p99 (apiserver's traces) at 25 creates/s",
        "webhook p99 (apiserver's traces) at 100 creates/s",
    ]
    for metric in details:
        assert rows[metric].samples == () and rows[metric].ok is None, metric
    printed = table(list(rows.values()))
    assert "| gpuplace / kube-scheduler, drain | not run | >= 2 x |  |" in printed


def test_a_budget_spent_in_the_search_leaves_out_every_repeat_and_still_gives_a_table() -> None:
    clock, logged = Clock(), list[str]()
    bench = FakeBench(clock, spend_on=IN_THE_SEARCH)
    budget = Budget(60, logged.append, clock)
    results = contend(cast(PlacementBench, bench), 1, logged.append, budget, search=(32, 64))
    assert all(call.startswith("ceiling ") for call in bench.calls)  # the search ran whole
    assert {"ceiling 1 process x 32 threads", "ceiling 1 process x 64 threads"} <= set(bench.calls)
    assert budget.left_out == ["repeat 1"]
    rows = measurements(SCALE, results)
    ran = {m.metric for m in rows if m.samples}
    assert "ceiling search: 1 process x 64 threads" in ran
    assert "gpuplace drain / ceiling" not in ran
    assert all(m.ok is None for m in rows)
    table(rows)


class FakeDrains:
    """The two contenders of `bench.drains`, recorded; the clock passes the budget during the
    `spend_on`-th run."""

    def __init__(self, clock: Clock, spend_on: int) -> None:
        self.clock, self.spend_on = clock, spend_on
        self.calls: list[str] = []

    def _step(self, name: str) -> RunResult:
        self.calls.append(name)
        if len(self.calls) == self.spend_on:
            self.clock.now = 1e9
        return _run(500, start_to_first_bound_s=1.0)

    def storage(self) -> str:
        return "etcd 1 MiB"

    def gpuplace_drain(self) -> RunResult:
        return self._step("drain")

    def ceiling(self, shape: Shape) -> RunResult:
        return self._step(f"ceiling {shape.describe()}")


def test_the_drains_bench_starts_no_run_and_no_aging_once_its_budget_is_spent() -> None:
    clock, logged = Clock(), list[str]()
    bench, budget = FakeDrains(clock, spend_on=3), Budget(100, logged.append, clock)
    shape = Shape(1, 16)
    rounds = contend_phases(
        cast(PlacementBench, bench),
        phases([Setting(256)], [shape], 1000),
        1,
        1000,
        budget,
        log=logged.append,
    )
    # The one round of the fresh cluster, then one aging run that spends the budget: no second,
    # and no round of the phase after the aging.
    assert bench.calls == [
        "drain",
        "ceiling 1 process x 16 threads",
        "ceiling 1 process x 16 threads",
    ]
    assert [len(runs) for runs in rounds[0].runs.values()] == [1, 1]
    assert [len(runs) for runs in rounds[1].runs.values()] == [0, 0]
    assert budget.left_out == ["aging the cluster"]
    assert "100 of 1,000 pods went through: no more runs" in logged


def test_a_drains_round_stops_at_the_first_run_its_budget_refuses() -> None:
    clock = Clock()
    bench, budget = FakeDrains(clock, spend_on=1), Budget(100, print, clock)
    phase = phases([Setting(256)], [Shape(1, 16)], 0)
    rounds = contend_phases(cast(PlacementBench, bench), phase, 2, 0, budget, log=print)
    assert bench.calls == ["drain"]
    assert budget.left_out == ["round 0 ceiling 1x16"]
    assert [len(runs) for runs in rounds[0].runs.values()] == [1, 0]
