"""Benchmarks run by `make bench` (`python -m bench`).

Every module in this package that defines `run(repeats: int, small: bool = False) ->
list[Measurement]` is a benchmark (`small`: a quick, scaled-down run); `bench.__main__` finds them,
runs each, prints one markdown table and writes `out/bench.json`.
Measure in a fresh subprocess (see `run_worker`) whatever depends on the process's history, such
as peak memory, and report medians over `repeats` runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._stats import meminfo_kib

if importlib.util.find_spec("gpuplace_dev") is None:
    # A checkout used without its .venv (PYTHONPATH=<checkout>, as on a machine that only runs
    # the benchmarks): the development environment's package is in dev/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))


@dataclass(frozen=True, slots=True)
class Measurement:
    """One figure of one benchmark; `target` is a bound like "< 2 s" and `ok` whether it is met
    (None when there is no target). `detail` figures (e.g. each process's CPU time) go into a
    second table and the JSON."""

    benchmark: str
    metric: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    samples: tuple[float, ...] = ()
    detail: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["samples"] = list(self.samples)
        return data


def below(
    benchmark: str,
    metric: str,
    samples: Sequence[float],
    unit: str,
    limit: float | None = None,
    *,
    detail: bool = False,
) -> Measurement:
    """The median of `samples`, checked against an upper `limit` when one is given."""
    return _median(
        benchmark, metric, samples, unit, None if limit is None else ("<", limit), detail
    )


def above(
    benchmark: str,
    metric: str,
    samples: Sequence[float],
    unit: str,
    limit: float,
    *,
    detail: bool = False,
) -> Measurement:
    """The median of `samples`, checked against a lower `limit` (met when at least `limit`)."""
    return _median(benchmark, metric, samples, unit, (">=", limit), detail)


def _median(
    benchmark: str,
    metric: str,
    samples: Sequence[float],
    unit: str,
    bound: tuple[str, float] | None,
    detail: bool,
) -> Measurement:
    value = statistics.median(samples) if samples else math.nan
    target, ok = "", None
    if bound is not None:
        op, limit = bound
        target = f"{op} {limit:g} {unit}"
        if samples:  # a figure whose runs were left out (`Budget`) is neither met nor missed
            ok = value < limit if op == "<" else value >= limit
    return Measurement(benchmark, metric, value, unit, target, ok, tuple(samples), detail)


def _value(m: Measurement) -> str:
    if not m.samples:
        return NOT_RUN
    if math.isnan(m.value) or math.isinf(m.value):
        return str(m.value)
    if m.value >= 100 or m.value == int(m.value):
        return f"{m.value:,.0f}"
    return f"{m.value:.3g}" if m.value < 1 else f"{m.value:.2f}"


def table(measurements: Sequence[Measurement]) -> str:
    """The figures as one markdown table."""
    rows = ["| benchmark | metric | median | target | met |", "|---|---|---|---|---|"]
    for m in measurements:
        met = "" if m.ok is None else ("yes" if m.ok else "**no**")
        unit = f" {m.unit}" if m.samples else ""
        rows.append(f"| {m.benchmark} | {m.metric} | {_value(m)}{unit} | {m.target} | {met} |")
    return "\n".join(rows)


def print_tables(measurements: Sequence[Measurement]) -> None:
    """The headline figures, then the details, as markdown tables on stdout."""
    print(table([m for m in measurements if not m.detail]))
    details = [m for m in measurements if m.detail]
    if details:
        print("\nDetails:\n")
        print(table(details))


#: The median column of a figure none of whose runs ran (their budget was spent first).
NOT_RUN = "not run"


class Budget:
    """The seconds in which a benchmark's steps may start (`--budget`), from when it is made: a
    step asked for later is left out (the one running finishes), and the first left out says so
    in the log. Its figures then have no samples and read "not run" in the table, so that a run
    on a machine lent for minutes prints what it measured before its time is up."""

    def __init__(
        self,
        seconds: float,
        log: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self._log = log
        self._clock = clock
        self._deadline = clock() + seconds
        #: The steps left out, in the order they were asked for.
        self.left_out: list[str] = []

    def allows(self, step: str) -> bool:
        """Whether `step` may start now; if not, it is noted as left out."""
        if self._clock() <= self._deadline:
            return True
        if not self.left_out:
            self._log(f"budget of {self.seconds:,.0f} s spent: {step} and what follows not run")
        self.left_out.append(step)
        return False


def machine() -> dict[str, Any]:
    """The machine the figures come from: cores, memory, CPU model, load average."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "arch": platform.machine(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        info["memory_gib"] = round(meminfo_kib(Path("/proc/meminfo").read_text()) / 2**20, 1)
        cpuinfo = Path("/proc/cpuinfo").read_text()
        models = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        ]
        info["cpu_model"] = models[0] if models else platform.processor()
    except (OSError, ValueError):
        pass  # not Linux: cores and load are still known
    return info


def describe(info: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in info.get("loadavg", []))
    return (
        f"{info.get('cpus')} cores ({info.get('cpu_model', '?')}), "
        f"{info.get('memory_gib', '?')} GiB memory, load average {load}"
    )


def log_to_stderr(name: str) -> Callable[[str], None]:
    """A benchmark's log: each line on stderr as `[name +S s] message`, S the seconds since its
    first line (so a run's log says how long each step took)."""
    began: list[float] = []

    def log(message: str) -> None:
        if not began:
            began.append(time.monotonic())
        elapsed = time.monotonic() - began[0]
        print(f"[{name} +{elapsed:.0f} s] {message}", file=sys.stderr, flush=True)

    return log


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
