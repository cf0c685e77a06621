"""Go components that a hack/ script builds into the cache (`cache_root()`) and that run on the
host against a `LocalCluster`: what the launchers of ArgoCD (`localargocd`), Argo Workflows
(`localargowf`) and the training operators (`localtraining`) share.

A release's directory, ``$GPUPLACE_CACHE/<name>-<versions>``, is named from the versions the
repository pins, the way its script names it (hack/lib.sh's ``claim_release``): while the pins
stay, the lookup finds what was built before and nothing is rebuilt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.process import ProcessGroup, poll, spawn
from kubeio.paths import CUSTOM_RESOURCE_DEFINITIONS

HACK = Path(__file__).resolve().parents[2] / "hack"


class Built(Protocol):
    """A release's directory in the cache, complete once its script has built everything."""

    @property
    def root(self) -> Path: ...

    def complete(self) -> bool: ...


B = TypeVar("B", bound=Built)


def go_mod_version(go_mod: Path, module: str, error: type[Exception]) -> str:
    """The version of `module` that `go_mod` requires, in a require block or on a ``require``
    line (as hack/lib.sh's ``go_version`` reads it for the script); raises `error` when none."""
    pattern = rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)"
    match = re.search(pattern, go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise error(f"{go_mod}: no '{module} vX.Y.Z' requirement")
    return match.group(1)


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


class HostComponents(ProcessGroup):
    """A release's components run on the host with a copy of the cluster's admin kubeconfig in
    `workdir`, each logging to the cluster's logs directory under its own name. `wait` fails with
    the subclass's `error` on a timeout, or early when a component died."""

    def __init__(self, cluster: LocalCluster, workdir: Path | None, *, prefix: str) -> None:
        self.cluster = cluster
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=prefix))
        super().__init__()

    def install_crds(self, crds_dir: Path, names: Iterable[str], owner: str) -> None:
        """Applies the CRDs in `crds_dir` and waits until those named are Established (their
        resources are served)."""
        crds = tuple(names)
        self.cluster.kubectl("apply", "--server-side", "-f", str(crds_dir))
        self.wait(f"{owner} CRDs Established", lambda: all(map(self._established, crds)), 60.0)

    def copy_kubeconfig(self) -> Path:
        """The cluster's admin kubeconfig, copied into `workdir` for the components to use (and
        to change: ArgoCD sets its namespace there)."""
        kubeconfig = self.workdir / "kubeconfig"
        shutil.copyfile(self.cluster.kubeconfig, kubeconfig)
        return kubeconfig

    def environment(self, **variables: str) -> dict[str, str]:
        """The host's PATH and `workdir` as HOME, then `variables` (which may replace them)."""
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return {"PATH": path, "HOME": str(self.workdir), **variables}

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        log = self.cluster.logs_dir / f"{name}.log"
        self.processes.append(spawn(name, argv, log=log, env=env))

    def wait(self, what: str, probe: Callable[[], Any], timeout: float) -> Any:
        """Polls ``probe`` until it returns something true; fails early when a component died."""
        result = poll(probe, timeout, self.check_alive)
        if not result:
            raise self.error(f"timed out after {timeout:.0f}s waiting for {what}")
        return result

    def _established(self, crd: str) -> bool:
        status, body = self.cluster.request("GET", CUSTOM_RESOURCE_DEFINITIONS.item(crd))
        conditions = (body.get("status") or {}).get("conditions") or [] if status == 200 else []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
