"""Where the locally built training operators are: ``hack/build-training-operators.sh`` builds
JobSet's and LeaderWorkerSet's controller managers into
``$GPUPLACE_CACHE/training-operators-<jobset>-<lws>`` (default ``~/.cache/gpuplace``) and prints
that directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuplace_dev.gobuild import HACK, find_built, go_mod_version
from gpuplace_dev.localcluster.binaries import cache_root

_BUILD_SCRIPT = HACK / "build-training-operators.sh"
_GO_MOD = HACK / "training-operators" / "go.mod"
OPERATORS = ("jobset", "lws")


class TrainingOperatorsBinariesError(Exception):
    """The training operators are missing and could not be built."""


@dataclass(frozen=True)
class TrainingOperatorsBinaries:
    root: Path
    versions: tuple[str, str]  # jobset, lws

    def manager(self, operator: str) -> Path:
        return self.root / "bin" / f"{operator}-controller"

    def crds_dir(self, operator: str) -> Path:
        return self.root / "crds" / operator

    def webhook_dir(self, operator: str) -> Path:
        """The operator's webhook kustomization (its configurations, patched as it ships them)."""
        return self.root / "webhook" / operator

    def complete(self) -> bool:
        return (self.root / ".complete").is_file() and all(
            self.manager(o).is_file()
            and any(self.crds_dir(o).glob("*.yaml"))
            and (self.webhook_dir(o) / "kustomization.yaml").is_file()
            for o in OPERATORS
        )


def versions() -> tuple[str, str]:
    """The JobSet and LeaderWorkerSet releases hack/training-operators/go.mod pins."""
    return (
        go_mod_version(_GO_MOD, "sigs.k8s.io/jobset", TrainingOperatorsBinariesError),
        go_mod_version(_GO_MOD, "sigs.k8s.io/lws", TrainingOperatorsBinariesError),
    )


def cached() -> TrainingOperatorsBinaries:
    """The cache location of the pinned releases, built or not."""
    jobset, lws = versions()
    return TrainingOperatorsBinaries(
        cache_root() / f"training-operators-{jobset}-{lws}", (jobset, lws)
    )


def find_training_operators(*, build: bool = True) -> TrainingOperatorsBinaries:
    """The built managers; with ``build`` builds them first when missing (minutes the first
    time; progress goes to stderr)."""
    binaries = cached()
    return find_built(
        binaries,
        _BUILD_SCRIPT,
        build=build,
        not_built="JobSet and LeaderWorkerSet are not built; run hack/build-training-operators.sh",
        error=TrainingOperatorsBinariesError,
    )
