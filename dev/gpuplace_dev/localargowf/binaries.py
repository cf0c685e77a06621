"""Where the locally built Argo Workflows components are: ``hack/build-argo-workflows.sh`` builds
them into ``$GPUPLACE_CACHE/argo-workflows-<version>`` (default ``~/.cache/gpuplace``) and prints
that directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuplace_dev.gobuild import HACK, find_built
from gpuplace_dev.localcluster.binaries import cache_root

_BUILD_SCRIPT = HACK / "build-argo-workflows.sh"
_VERSION_FILE = HACK / "argo-workflows" / "version"


class ArgoWorkflowsBinariesError(Exception):
    """The Argo Workflows binaries are missing and could not be built."""


@dataclass(frozen=True)
class ArgoWorkflowsBinaries:
    root: Path
    version: str

    @property
    def controller(self) -> Path:
        return self.root / "bin" / "workflow-controller"

    @property
    def argoexec(self) -> Path:
        return self.root / "bin" / "argoexec"

    @property
    def crds_dir(self) -> Path:
        return self.root / "crds"

    @property
    def executor_role(self) -> Path:
        return self.root / "rbac" / "executor-role.yaml"

    def complete(self) -> bool:
        return (
            (self.root / f".complete-{self.version}").is_file()
            and self.controller.is_file()
            and self.argoexec.is_file()
            and (self.crds_dir / "argoproj.io_workflows.yaml").is_file()
            and self.executor_role.is_file()
        )


def argo_workflows_version() -> str:
    """The argo-workflows release hack/argo-workflows/version pins."""
    version = _VERSION_FILE.read_text().strip()
    if not version.startswith("v"):
        raise ArgoWorkflowsBinariesError(f"{_VERSION_FILE}: expected a version like v4.0.5")
    return version


def cached() -> ArgoWorkflowsBinaries:
    """The cache location of the pinned release, built or not."""
    version = argo_workflows_version()
    return ArgoWorkflowsBinaries(cache_root() / f"argo-workflows-{version}", version)


def find_argo_workflows(*, build: bool = True) -> ArgoWorkflowsBinaries:
    """The built components; with ``build`` builds them first when missing (many minutes the
    first time; progress goes to stderr)."""
    binaries = cached()
    return find_built(
        binaries,
        _BUILD_SCRIPT,
        build=build,
        not_built=f"Argo Workflows {binaries.version} is not built; run `make argo-workflows` "
        "(hack/build-argo-workflows.sh)",
        error=ArgoWorkflowsBinariesError,
    )
