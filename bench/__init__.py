"""Benchmarks run by `make bench` (`python -m bench`).

Every module in this package that defines `run(repeats: int) -> list[Measurement]` is a benchmark;
`bench.__main__` finds them, runs each, prints one markdown table and writes `out/bench.json`.
Measure in a fresh subprocess (see `run_worker`) whatever depends on the process's history, such
as peak memory, and report medians over `repeats` runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Measurement:
    """One figure of one benchmark; `target` is a bound like "< 2 s" and `ok` whether it is met
    (None when there is no target)."""

    benchmark: str
    metric: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    samples: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["samples"] = list(self.samples)
        return data


def below(
    benchmark: str, metric: str, samples: Sequence[float], unit: str, limit: float | None = None
) -> Measurement:
    """The median of `samples`, checked against an upper `limit` when one is given."""
    value = statistics.median(samples)
    return Measurement(
        benchmark,
        metric,
        value,
        unit,
        target=f"< {limit:g} {unit}" if limit is not None else "",
        ok=None if limit is None else value < limit,
        samples=tuple(samples),
    )


def run_worker(module: str, *args: str) -> dict[str, Any]:
    """Runs `python -m <module> <args>` in a fresh interpreter and returns the JSON object it prints
    as its last line of stdout."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
