"""Where the locally built ArgoCD components are: ``hack/build-argocd.sh`` builds them into
``$GPUPLACE_CACHE/argocd-<version>`` (default ``~/.cache/gpuplace``) and prints that directory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuplace_dev.builtcache import find_built
from gpuplace_dev.localcluster.binaries import cache_root

_HACK = Path(__file__).resolve().parents[3] / "hack"
_BUILD_SCRIPT = _HACK / "build-argocd.sh"
_WRAPPER_MOD = _HACK / "argocd" / "go.mod"
_REQUIRE = re.compile(r"^\s*(?:require\s+)?github\.com/argoproj/argo-cd/v3\s+(v\S+)", re.MULTILINE)

#: The components `LocalArgoCD` runs, each a symlink to the one `argocd` binary.
COMPONENTS = (
    "argocd-repo-server",
    "argocd-application-controller",
    "argocd-applicationset-controller",
)


class ArgoCDBinariesError(Exception):
    """The ArgoCD binaries are missing and could not be built."""


@dataclass(frozen=True)
class ArgoCDBinaries:
    root: Path
    version: str

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def crds_dir(self) -> Path:
        return self.root / "crds"

    @property
    def kustomize(self) -> Path:
        return self.bin_dir / "kustomize"

    def component(self, name: str) -> Path:
        return self.bin_dir / name

    def complete(self) -> bool:
        return (
            (self.root / f".complete-{self.version}").is_file()
            and all(self.component(c).exists() for c in COMPONENTS)
            and self.kustomize.is_file()
            and any(self.crds_dir.glob("*.yaml"))
        )


def argocd_version() -> str:
    """The argo-cd release hack/argocd/go.mod pins."""
    match = _REQUIRE.search(_WRAPPER_MOD.read_text())
    if match is None:
        raise ArgoCDBinariesError(f"{_WRAPPER_MOD}: no 'github.com/argoproj/argo-cd/v3 vX.Y.Z'")
    return match.group(1)


def cached() -> ArgoCDBinaries:
    """The cache location of the pinned release, built or not."""
    version = argocd_version()
    return ArgoCDBinaries(cache_root() / f"argocd-{version}", version)


def available() -> bool:
    """Whether the pinned release is built (nothing is built by asking)."""
    return cached().complete()


def find_argocd(*, build: bool = True) -> ArgoCDBinaries:
    """The built components; with ``build`` builds them first when missing (several minutes the
    first time; progress goes to stderr)."""
    binaries = cached()
    return find_built(
        binaries,
        _BUILD_SCRIPT,
        build=build,
        not_built=f"ArgoCD {binaries.version} is not built; run `make argocd` "
        "(hack/build-argocd.sh)",
        error=ArgoCDBinariesError,
    )
