"""Helper processes of the benchmarks, and their one error type."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from gpuplace_dev.localcluster.process import die_with_parent


class BenchError(RuntimeError):
    """The workload could not run as planned (a request failed, pods did not bind in time)."""


def start_ready(argv: Sequence[str], what: str) -> subprocess.Popen[str]:
    """A helper process that prints ``ready`` when it is; it dies with this process."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "ready":
        proc.kill()
        proc.wait()
        raise BenchError(f"{what} did not start: {first!r}")
    return proc
