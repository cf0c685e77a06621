"""Components built from Go modules by a hack/ script into the cache (`cache_root()`), once: the
lookup that ArgoCD's and Argo Workflows' launchers share (`localargocd`, `localargowf`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol, TypeVar


class Built(Protocol):
    """A release's directory in the cache, complete once its script has built everything."""

    @property
    def root(self) -> Path: ...

    def complete(self) -> bool: ...


B = TypeVar("B", bound=Built)


def find_built(
    binaries: B, script: Path, *, build: bool, not_built: str, error: type[Exception]
) -> B:
    """`binaries` when complete; else, with `build`, after running `script` (progress on stderr;
    its stdout, the directory it printed, is not needed). Raises `error`, saying `not_built`
    without `build`, or naming the script when it fails or leaves the release incomplete."""
    if binaries.complete():
        return binaries
    if not build:
        raise error(f"{binaries.root}: {not_built}")
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0 or not binaries.complete():
        raise error(f"{script} failed with exit status {result.returncode}; its messages are above")
    return binaries
