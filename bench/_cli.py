"""A placement bench as a benchmark: set up, its contenders run, stopped (`Benchmark`); and the
command line every such benchmark shares (`cli`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from bench import Budget, Measurement, describe, machine, print_tables
from bench._bench import ClusterBench
from bench._workload import Scale

B = TypeVar("B", bound=ClusterBench)
R = TypeVar("R")


@contextlib.contextmanager
def running(make: Callable[[Path], B], workdir: Path | None, prefix: str) -> Iterator[B]:
    """A bench set up in `workdir` (default: a temporary directory), stopped after the block."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{prefix}-")))
        b = make(workdir)
        try:
            b.setup()
            yield b
        finally:
            b.stop()


@dataclass(frozen=True)
class Benchmark(Generic[B, R]):
    """A benchmark: the bench `make` builds, set up (in `workdir`, default a temporary directory
    named `prefix`-...), `contend` run on it with `repeats` repeats, stopped; the results."""

    make: Callable[[Scale, Path, Callable[[str], None], Path | None], B]
    prefix: str
    contend: Callable[[B, int, Callable[[str], None], Budget], R]

    def __call__(
        self,
        scale: Scale,
        repeats: int,
        log: Callable[[str], None],
        workdir: Path | None = None,
        profile_dir: Path | None = None,
        budget: float = math.inf,
    ) -> R:
        """`budget`: the seconds in which `contend`'s steps may start, from the end of the set-up
        (`Budget`)."""
        with running(lambda w: self.make(scale, w, log, profile_dir), workdir, self.prefix) as b:
            return self.contend(b, repeats, log, Budget(budget, log))


def cli(
    prog: str,
    doc: str | None,
    default: Scale,
    repeats: int,
    run_bench: Benchmark[Any, R],
    measure: Callable[[Scale, R], list[Measurement]],
    log: Callable[[str], None],
    argv: Sequence[str] | None,
) -> int:
    """`python -m bench.<name> --nodes N --pods N --repeats N [--workdir DIR] [--profile DIR]`:
    one benchmark on its own, its figures one a line."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--nodes", type=int, default=default.nodes)
    parser.add_argument("--pods", type=int, default=default.pods)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the controller with py-spy during gpuplace's runs (collapsed stacks in DIR)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=math.inf,
        metavar="S",
        help="start no step more than S seconds after the set-up: the table then has what ran "
        "(for a machine lent for minutes; default: no limit)",
    )
    args = parser.parse_args(argv)
    scale = replace(default, nodes=args.nodes, pods=args.pods)
    log(f"machine: {describe(machine())}")
    results = run_bench(scale, args.repeats, log, args.workdir, args.profile, args.budget)
    log(f"machine at the end: {describe(machine())}")
    figures = measure(scale, results)
    print_tables(figures)
    return 0
