"""Running `gpuplace demo` from the end-to-end tests (tests/e2e and tests/e2e_argocd)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_demo(*flags: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`gpuplace demo FLAGS` to completion (unbuffered, so its output keeps its order)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", "demo", *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
