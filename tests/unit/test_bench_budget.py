"""A benchmark's budget (`--budget`): the steps it lets start, what it leaves out, and the table
of a run it cut short, which still prints what ran."""

from __future__ import annotations

from typing import cast

from bench import Budget, above, table
from bench._ceiling import Shape
from bench._kube import MACHINE
from bench.drains import Setting, contend_phases, phases
from bench.placement import (
    BINDING_CPU,
    REFERENCE_CPU,
    Admission,
    PlacementBench,
    RunResult,
    Scale,
    contend,
    measurements,
)

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


class FakeBench:
    """Every step of a placement repeat, recorded; the clock jumps past the budget during the
    first ceiling after gpuplace's drain, or (`spend_in_search`) during the search's first."""

    controller_peak_mib = 100.0

    def __init__(self, clock: Clock, spend_in_search: bool = False) -> None:
        self.clock = clock
        self.spend_in_search = spend_in_search
        self.calls: list[str] = []

    def _step(self, name: str) -> None:
        self.calls.append(name)

    def idle(self) -> dict[str, float]:
        return {MACHINE: 1.0}

    def storage(self) -> str:
        return "etcd 1 MiB"

    def webhook_peak_mib(self) -> float:
        return 50.0

    def ceiling(self, shape: Shape) -> RunResult:
        if self.spend_in_search or "gpuplace drain" in self.calls:
            self.clock.now = 1e9
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
        return Admission({}, {}, rate=rate)

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


def test_a_run_cut_short_after_the_ceiling_still_holds_the_drain_against_it() -> None:
    clock, logged = Clock(), list[str]()
    bench, budget = FakeBench(clock), Budget(300, logged.append, clock)
    results = contend(cast(PlacementBench, bench), 2, logged.append, budget, search=(32,))
    after_search = bench.calls[bench.calls.index("burst") :]
    assert after_search == [
        "burst",
        "burst without the webhook",
        "burst through the reference",
        "one at a time",
        "25/s",
        "50/s",
        "100/s",
        "reference 50/s",
        "gpuplace drain",
        "ceiling 1 process x 32 threads",
    ]
    assert budget.left_out == ["kube-scheduler burst", "kube-scheduler drain", "repeat 2"]
    assert "budget of 300 s spent: kube-scheduler burst and what follows not run" in logged
    rows = {m.metric: m for m in measurements(SCALE, results)}
    drain = rows["gpuplace drain / ceiling"]
    assert drain.samples == (540 / 600,) and drain.ok is True
    assert rows["creates/s through the webhook / without it"].samples == (400 / 500,)
    for left_out in ("kube-scheduler drain: pods/s", "gpuplace / kube-scheduler, drain"):
        assert rows[left_out].samples == () and rows[left_out].ok is None, left_out
    printed = table(list(rows.values()))
    assert "| gpuplace / kube-scheduler, drain | not run | >= 2 x |  |" in printed


def test_a_budget_spent_in_the_search_leaves_out_every_repeat_and_still_gives_a_table() -> None:
    clock, logged = Clock(), list[str]()
    bench = FakeBench(clock, spend_in_search=True)
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
        phases([Setting(0, 256)], [shape], 1000),
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
    phase = phases([Setting(0, 256)], [Shape(1, 16)], 0)
    rounds = contend_phases(cast(PlacementBench, bench), phase, 2, 0, budget, log=print)
    assert bench.calls == ["drain"]
    assert budget.left_out == ["round 0 ceiling 1x16"]
    assert [len(runs) for runs in rounds[0].runs.values()] == [1, 0]
