"""Where the control-plane binaries are: overrides from the environment, else the build cache.

Resolution, per component:

1. ``TEST_ASSET_<NAME>`` (``TEST_ASSET_KUBE_APISERVER``, ``TEST_ASSET_KUBE_CONTROLLER_MANAGER``,
   ``TEST_ASSET_KUBE_SCHEDULER``, ``TEST_ASSET_KUBECTL``, ``TEST_ASSET_ETCD``, ``TEST_ASSET_KWOK``),
2. ``$KUBEBUILDER_ASSETS/<name>`` when that file exists (envtest's layout),
3. ``$GPUPLACE_CACHE/k8s-<version>/bin/<name>`` (default cache root ``~/.cache/gpuplace``), built by
   ``hack/build-control-plane.sh`` when missing.

The same rules are implemented by the build script, which skips whatever is overridden.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

COMPONENTS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "etcd",
    "kwok",
)

_REPO_ROOT = Path(__file__).resolve().parents[3]
_HACK = _REPO_ROOT / "hack"
_BUILD_SCRIPT = _HACK / "build-control-plane.sh"
_K8S_GO_MOD = _HACK / "k8s" / "go.mod"


class BinariesError(RuntimeError):
    """The control-plane binaries cannot be found or built."""


@dataclass(frozen=True)
class ControlPlaneBinaries:
    """Absolute paths of every control-plane binary, plus the cache directory they are built into."""

    bin_dir: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path

    def path(self, component: str) -> Path:
        """The binary of one component by its command name, e.g. ``path("kube-apiserver")``."""
        if component not in COMPONENTS:
            raise KeyError(f"unknown control-plane component {component!r}; one of {COMPONENTS}")
        path: Path = getattr(self, component.replace("-", "_"))
        return path


def cache_root() -> Path:
    """``$GPUPLACE_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/gpuplace``."""
    explicit = os.environ.get("GPUPLACE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpuplace"


def kubernetes_version() -> str:
    """The pinned Kubernetes release, read from the wrapper module (``hack/k8s/go.mod``)."""
    try:
        text = _K8S_GO_MOD.read_text()
    except FileNotFoundError:
        raise BinariesError(
            f"{_K8S_GO_MOD}: not found; the control plane is built from a gpuplace checkout, or set "
            "KUBEBUILDER_ASSETS / TEST_ASSET_* to prebuilt binaries"
        ) from None
    match = re.search(r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+\S*)", text, re.MULTILINE)
    if match is None:
        raise BinariesError(f"{_K8S_GO_MOD}: no 'k8s.io/kubernetes vX.Y.Z' requirement")
    return match.group(1)


def cache_bin_dir() -> Path:
    """The directory the build script installs binaries into."""
    return cache_root() / f"k8s-{kubernetes_version()}" / "bin"


def override(component: str) -> Path | None:
    """The binary the environment asks for instead of the cached build, if any."""
    variable = "TEST_ASSET_" + component.upper().replace("-", "_")
    explicit = os.environ.get(variable)
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BinariesError(
                f"{variable}={explicit}: not an executable file; fix the path or unset {variable}"
            )
        return path.absolute()
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        candidate = Path(assets).expanduser() / component
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.absolute()
    return None


def find_binaries(*, build: bool = True) -> ControlPlaneBinaries:
    """Resolves every binary; with ``build`` (the default) builds what is missing or stale first.

    The build script prints progress on stderr, which is passed through so that a first run shows
    what it is doing; a warm run costs a fraction of a second.
    """
    overrides = {c: override(c) for c in COMPONENTS}
    bin_dir = cache_bin_dir()
    if build and any(path is None for path in overrides.values()):
        _run_build_script()
    paths: dict[str, Path] = {}
    missing: list[str] = []
    for component, explicit in overrides.items():
        path = explicit or bin_dir / component
        if not (path.is_file() and os.access(path, os.X_OK)):
            missing.append(component)
        paths[component.replace("-", "_")] = path
    if missing:
        raise BinariesError(
            f"{bin_dir}: missing {', '.join(missing)}; run `make control-plane` (or "
            "hack/build-control-plane.sh), or set KUBEBUILDER_ASSETS / TEST_ASSET_*"
        )
    return ControlPlaneBinaries(bin_dir=bin_dir, **paths)


def bin_dir() -> Path:
    """The cache directory holding the built binaries (built first when missing)."""
    return find_binaries().bin_dir


def _run_build_script() -> None:
    if not _BUILD_SCRIPT.is_file():
        raise BinariesError(
            f"{_BUILD_SCRIPT}: not found; build the control plane from a gpuplace checkout, or set "
            "KUBEBUILDER_ASSETS / TEST_ASSET_* to prebuilt binaries"
        )
    result = subprocess.run(
        ["bash", str(_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise BinariesError(
            f"{_BUILD_SCRIPT} failed with exit status {result.returncode}; its messages are above"
        )
