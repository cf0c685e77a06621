"""Where the tools built for the local cluster live, and helm from them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "charts" / "gpuplace"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUPLACE_CACHE") or Path.home() / ".cache" / "gpuplace")


def helm_binary() -> Path:
    """helm from hack/build-tools.sh (`make tools`; built here the first time)."""
    path = cache_dir() / "tools" / "bin" / "helm"
    if not path.is_file():
        subprocess.run(
            [str(REPO_ROOT / "hack" / "build-tools.sh")], check=True, capture_output=True
        )
    return path


def helm_env(kubeconfig: Path | None = None) -> dict[str, str]:
    """helm's environment: a private home (no user configuration leaks in)."""
    home = cache_dir() / "tools" / "helm-home"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env
