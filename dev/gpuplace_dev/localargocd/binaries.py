"""Where the locally built ArgoCD components are: ``hack/build-argocd.sh`` builds them into
``$GPUPLACE_CACHE/argocd-<version>`` (default ``~/.cache/gpuplace``) and prints that directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuplace_dev.gobuild import HACK, find_built, go_mod_version
from gpuplace_dev.localcluster.binaries import cache_root

_BUILD_SCRIPT = HACK / "build-argocd.sh"
_WRAPPER_MOD = HACK / "argocd" / "go.mod"

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
    return go_mod_version(_WRAPPER_MOD, "github.com/argoproj/argo-cd/v3", ArgoCDBinariesError)


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
