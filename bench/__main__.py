"""`python -m bench [NAME...] [--repeats N] [--small] [--out out/bench.json]`: run the benchmarks.

Runs every module of this package that defines `run(repeats, small=False)` (or only those named;
a module that sets `BY_DEFAULT = False`, a long tier, runs only when named), prints the machine,
one markdown table of medians (and one of details) and writes every figure with its samples to a
JSON file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, cast

import bench
from bench import Measurement, describe, machine, print_tables


class Runner(Protocol):
    def __call__(self, repeats: int, small: bool = False) -> list[Measurement]: ...


def discover() -> tuple[dict[str, Runner], set[str]]:
    """Every benchmark by name, and the names of those run only when named."""
    runners: dict[str, Runner] = {}
    named_only: set[str] = set()
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        run = getattr(module, "run", None)
        if callable(run):
            runners[info.name] = cast(Runner, run)
            if not getattr(module, "BY_DEFAULT", True):
                named_only.add(info.name)
    return runners, named_only


def main(argv: Sequence[str] | None = None) -> int:
    runners, named_only = discover()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"of {', '.join(runners)} (default: all but {', '.join(sorted(named_only))})",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per benchmark (default 3)")
    parser.add_argument(
        "--small", action="store_true", help="scaled-down workloads, for a quick check"
    )
    parser.add_argument("--out", default="out/bench.json", help="JSON results file")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in runners]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; have {', '.join(runners)}")
    selected = args.names or [name for name in runners if name not in named_only]
    before = machine()
    print(f"machine: {describe(before)}", file=sys.stderr, flush=True)
    measurements: list[Measurement] = []
    failures: list[str] = []
    for name in selected:
        started = time.perf_counter()
        print(f"running {name} ({args.repeats} repeats)...", file=sys.stderr, flush=True)
        try:
            measurements.extend(runners[name](args.repeats, small=args.small))
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            failures.append(f"{name}: {exc}")
            print(f"{name} failed: {exc}", file=sys.stderr)
        print(f"{name} took {time.perf_counter() - started:.1f} s", file=sys.stderr)
    after = machine()
    print(f"machine: {describe(before)}; at the end: load average {after['loadavg']}\n")
    print_tables(measurements)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "host": before,
        "loadavg_after": after["loadavg"],
        "small": args.small,
        "repeats": args.repeats,
        "measurements": [m.to_json() for m in measurements],
        "failures": failures,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}", file=sys.stderr)
    missed = [m for m in measurements if m.ok is False]
    return 1 if failures or missed else 0


if __name__ == "__main__":
    sys.exit(main())
