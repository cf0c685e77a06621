"""`python -m bench.drains [--nodes N] [--pods N] [--settings W,...] [--ceilings PxT,...]
[--rounds R] [--age PODS] [--budget S] [--workdir DIR] [--profile DIR]`: gpuplace's backlog drain
at several binder settings against the Binding ceiling at fixed shapes, taking turns on one
cluster.

`make bench` runs gpuplace's drain once a repeat, at the controller's defaults, against the best
ceiling its search finds. To compare settings where each run counts (a larger machine lent for
minutes), this bench runs each contender once a round, in the same order every round, on one
cluster: a setting `W` is a drain by a new leader with W Bindings in flight from its request loop;
a shape `PxT` is the minimal client in P processes x T threads. It
logs a line per run, stops starting runs once `--budget` seconds have passed, and prints each
contender's medians: pods/s, the drain's ratio to the best ceiling, the binder's CPU per pod
(its process with any children, and its own process alone) and the control plane's (kube-apiserver's;
etcd's and kwok's in the details), from the first bind to the last, and start to first bind.
`--profile DIR` samples each drain's leader with py-spy (`python -m bench._stacks DIR/*.txt`
sums it up).

`make bench` drains after its ceiling search and its bursts have put tens of thousands of pods
through the cluster. `--age PODS` runs the rounds twice: on the fresh cluster, then again after
PODS more pods have come and gone (created through the webhook, bound by the minimal client at
the first ceiling shape, deleted; each of those runs logged with its rate). Each phase's
contenders are held against that phase's best ceiling, and the log says what etcd holds at the
start of each phase, so one run tells whether a used cluster is slower for every contender or
for gpuplace's drain alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import (
    Budget,
    Measurement,
    below,
    describe,
    log_to_stderr,
    machine,
    print_tables,
)
from bench._ceiling import Shape
from bench._cli import Benchmark
from bench._runs import APISERVER, BINDING_CPU, ETCD, KWOK, LEADER_CPU, RunResult, window_cpu
from bench._steps import PlacementBench
from bench._workload import Scale

NAME = "drains"


@dataclass(frozen=True)
class Setting:
    """A leader's binder: `in_flight` Bindings in flight from its request loop (--bind-workers)."""

    in_flight: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        form = "a setting is W, Bindings in flight, e.g. 256"
        try:
            in_flight = int(text)
        except ValueError:
            raise ValueError(f"{text!r}: {form}") from None
        if in_flight < 1:
            raise ValueError(f"{text!r}: {form}, at least 1")
        return cls(in_flight)

    def describe(self) -> str:
        return f"drain {self.in_flight}"

    def environment(self) -> dict[str, str]:
        """What the controller the bench starts reads them from."""
        return {"GPUPLACE_BIND_WORKERS": str(self.in_flight)}


def parse_shape(text: str) -> Shape:
    return Shape(*_pair(text, "x", "a ceiling shape is PxT, e.g. 8x128", (1, 1)))


def _pair(text: str, separator: str, form: str, least: tuple[int, int]) -> tuple[int, int]:
    """Two integers written `A<separator>B`, each at least its `least`."""
    first, _, second = text.partition(separator)
    try:
        pair = int(first), int(second)
    except ValueError:
        raise ValueError(f"{text!r}: {form}") from None
    if pair[0] < least[0] or pair[1] < least[1]:
        raise ValueError(f"{text!r}: {form}, with at least {least[0]}{separator}{least[1]}")
    return pair


def ceiling_name(shape: Shape) -> str:
    return f"ceiling {shape.processes}x{shape.threads}"


@dataclass
class Rounds:
    """Every contender's runs in one phase, in the order they were given; `phase` says how used
    the cluster was ("" when the bench runs one phase)."""

    settings: Sequence[Setting]
    shapes: Sequence[Shape]
    runs: dict[str, list[RunResult]] = field(default_factory=dict)
    phase: str = ""

    def __post_init__(self) -> None:
        for name in [s.describe() for s in self.settings] + [ceiling_name(s) for s in self.shapes]:
            self.runs.setdefault(name, [])


def phases(settings: Sequence[Setting], shapes: Sequence[Shape], age: int) -> list[Rounds]:
    """One phase on the fresh cluster, and with `age` a second after that many more pods."""
    if not age:
        return [Rounds(settings, shapes)]
    return [
        Rounds(settings, shapes, phase="fresh cluster"),
        Rounds(settings, shapes, phase=f"after {age:,} more pods"),
    ]


def contend_phases(
    b: PlacementBench,
    rounds: Sequence[Rounds],
    count: int,
    age: int,
    budget: Budget,
    log: Callable[[str], None],
) -> list[Rounds]:
    """Each phase's `count` rounds; before every phase but the first, `age` pods come and go;
    every run while `budget` allows it."""
    for number, phase in enumerate(rounds):
        if number:
            aged = age_cluster(b, phase.shapes[0], age, budget, log)
            if aged < age:
                log(f"{aged:,} of {age:,} pods went through: no more runs")
                break
        if phase.phase:
            log(f"{phase.phase}: {b.storage()}")
        contend(b, phase, count, budget, log)
    return list(rounds)


def age_cluster(
    b: PlacementBench, shape: Shape, pods: int, budget: Budget, log: Callable[[str], None]
) -> int:
    """`pods` more pods through the cluster, a run of the minimal client at a time (its pods are
    gpuplace's, admitted by the webhook, bound, deleted), while `budget` allows; the pods that
    went through."""
    done = 0
    while done < pods and budget.allows("aging the cluster"):
        result = b.ceiling(shape)
        done += result.pods
        log(f"aging: {done:,} of {pods:,} pods, {ceiling_name(shape)}: {result.rate:,.0f} pods/s")
    return done


def contend(
    b: PlacementBench,
    rounds: Rounds,
    count: int,
    budget: Budget,
    log: Callable[[str], None],
) -> Rounds:
    """`count` rounds of every contender in turn, each run while `budget` allows it."""
    saved = {key: os.environ.get(key) for key in Setting(1).environment()}
    try:
        for number in range(count):
            contenders: list[Setting | Shape] = [*rounds.settings, *rounds.shapes]
            where = f" ({rounds.phase})" if rounds.phase else ""
            for contender in contenders:
                if isinstance(contender, Setting):
                    name = contender.describe()
                else:
                    name = ceiling_name(contender)
                if not budget.allows(f"round {number}{where} {name}"):
                    return rounds
                if isinstance(contender, Setting):
                    os.environ.update(contender.environment())  # the controller inherits it
                    result = b.gpuplace_drain()
                else:
                    result = b.ceiling(contender)
                rounds.runs[name].append(result)
                log(f"round {number}{where} {name}: {line(result)}")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return rounds


def line(result: RunResult) -> str:
    extra = result.extra
    parts = [f"{result.rate:,.0f} pods/s"]
    if BINDING_CPU in extra:
        parts.append(f"binder CPU/pod {1000 * extra[BINDING_CPU]:.3f} ms")
    if LEADER_CPU in extra:
        parts.append(f"its own process {1000 * extra[LEADER_CPU]:.3f} ms")
    if window_cpu(APISERVER) in extra:
        parts.append(f"apiserver CPU/pod {1000 * extra[window_cpu(APISERVER)]:.3f} ms")
    if window_cpu(ETCD) in extra:
        parts.append(f"etcd {1000 * extra[window_cpu(ETCD)]:.3f} ms")
    parts.append(f"start->first {extra.get('start_to_first_bound_s', float('nan')):.2f} s")
    parts.append(f"machine busy {extra.get('machine_busy_share', float('nan')):.2f}")
    return ", ".join(parts)


def measurements(scale: Scale, phases: Sequence[Rounds]) -> list[Measurement]:
    """Each phase's rows, its contenders held against its own best ceiling."""
    return [row for rounds in phases for row in phase_measurements(scale, rounds)]


def phase_measurements(scale: Scale, rounds: Rounds) -> list[Measurement]:
    label = f"{NAME} {scale.label}" + (f", {rounds.phase}" if rounds.phase else "")
    ceilings = {
        name: statistics.median(r.rate for r in runs)
        for shape in rounds.shapes
        if (runs := rounds.runs[name := ceiling_name(shape)])
    }
    best = max(ceilings, key=lambda name: ceilings[name], default=None)
    rows: list[Measurement] = []
    for name, runs in rounds.runs.items():
        if not runs:
            continue
        rows.append(below(label, f"{name}: pods/s", [r.rate for r in runs], "pods/s"))
        if best is not None and not name.startswith("ceiling"):
            rows.append(
                below(
                    label,
                    f"{name} / {best}",
                    [r.rate / ceilings[best] for r in runs],
                    "x",
                )
            )
        for key, what, detail in (
            (BINDING_CPU, "binder", False),
            (LEADER_CPU, "binder's own process", False),
            (window_cpu(APISERVER), APISERVER, False),
            # Whether a used cluster's history costs etcd more a write shows here; kwok writes
            # the pods' status after each Binding.
            (window_cpu(ETCD), ETCD, True),
            (window_cpu(KWOK), KWOK, True),
        ):
            values = [1000 * r.extra[key] for r in runs if key in r.extra]
            if values:
                metric = f"{name}: {what} CPU per pod, first -> last bind"
                rows.append(below(label, metric, values, "ms", detail=detail))
        if not name.startswith("ceiling"):
            rows.append(
                below(
                    label,
                    f"{name}: start -> first bind",
                    [r.extra["start_to_first_bound_s"] for r in runs],
                    "s",
                    detail=True,
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drains", description=__doc__)
    parser.add_argument("--nodes", type=int, default=Scale().nodes)
    parser.add_argument("--pods", type=int, default=Scale().pods)
    parser.add_argument(
        "--settings",
        default="256",
        help="gpuplace's drains, comma-separated: W Bindings in flight from the leader's loop",
    )
    parser.add_argument(
        "--ceilings", default="1x256", help="the ceiling's shapes, comma-separated: PxT"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--age",
        type=int,
        default=0,
        metavar="PODS",
        help="run the rounds again after PODS more pods have come and gone (default: once)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=float("inf"),
        help="start no run more than this many seconds after the set-up",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    parser.add_argument("--profile", type=Path, help="sample each drain's leader with py-spy here")
    args = parser.parse_args(argv)
    try:
        settings = [Setting.parse(s) for s in args.settings.split(",") if s]
        shapes = [parse_shape(s) for s in args.ceilings.split(",") if s]
    except ValueError as exc:
        parser.error(str(exc))
    if args.age < 0 or (args.age and not shapes):
        parser.error("--age takes a number of pods and at least one ceiling shape to bind them")
    scale = replace(Scale(), nodes=args.nodes, pods=args.pods)
    _log(f"machine: {describe(machine())}")
    benchmark = Benchmark(
        PlacementBench,
        "gpuplace-drains",
        lambda b, count, log, budget: contend_phases(
            b, phases(settings, shapes, args.age), count, args.age, budget, log
        ),
    )
    rounds = benchmark(scale, args.rounds, _log, args.workdir, args.profile, args.budget)
    print_tables(measurements(scale, rounds))
    return 0


_log = log_to_stderr(NAME)


if __name__ == "__main__":
    sys.exit(main())
