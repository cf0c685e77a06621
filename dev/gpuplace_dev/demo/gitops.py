"""A throw-away GitOps repository and a sync that does what ArgoCD does with it: build the
committed revision with kustomize and server-side apply the result."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git
import yaml

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import (
    PLACEMENT_MAP_LABEL,
    REVISION_ANNOTATION,
    SOURCE_PATH_ANNOTATION,
)


@dataclass
class SyncResult:
    ok: bool
    output: str


class GitOpsRepo:
    def __init__(self, path: Path, source: Path) -> None:
        shutil.copytree(source, path)
        self.path = path
        self.repo = git.Repo.init(path, initial_branch="main")
        with self.repo.config_writer() as config:
            config.set_value("user", "name", "Platform Team")
            config.set_value("user", "email", "platform@example.com")

    def commit(self, message: str) -> str:
        self.repo.git.add(A=True)
        return self.repo.index.commit(message).hexsha[:12]

    def edit(self, relative: str, old: str, new: str) -> None:
        target = self.path / relative
        text = target.read_text()
        if old not in text:
            raise ValueError(f"{relative}: {old!r} not found")
        target.write_text(text.replace(old, new, 1))

    def sync(self, cluster: LocalCluster, directory: str, revision: str = "HEAD") -> SyncResult:
        """kustomize build of `directory` at `revision`, then kubectl apply --server-side."""
        with tempfile.TemporaryDirectory(prefix="gpuplace-sync-") as tmp:
            checkout = Path(tmp) / "rev"
            self.repo.git.worktree("add", "--detach", str(checkout), revision)
            try:
                built = cluster.kubectl("kustomize", str(checkout / directory), check=False)
                if built.returncode != 0:
                    return SyncResult(False, built.stderr)
                commit = self.repo.commit(revision).hexsha
                manifests = stamp_provenance(built.stdout, commit, directory)
                applied = cluster.kubectl(
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "--field-manager=gpuplace-demo-sync",
                    "-f",
                    "-",
                    input=manifests,
                    check=False,
                )
                return SyncResult(applied.returncode == 0, applied.stdout + applied.stderr)
            finally:
                self.repo.git.worktree("remove", "--force", str(checkout))


def stamp_provenance(manifests: str, revision: str, directory: str) -> str:
    """What the ApplicationSet of argocd/ adds to every map ConfigMap (commonAnnotations): the
    revision rendered and the Application's directory."""
    documents = [d for d in yaml.safe_load_all(manifests) if d]
    for doc in documents:
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if doc.get("kind") == "ConfigMap" and labels.get(PLACEMENT_MAP_LABEL) == "true":
            annotations = doc["metadata"].setdefault("annotations", {})
            annotations[REVISION_ANNOTATION] = revision
            annotations[SOURCE_PATH_ANNOTATION] = directory
    return yaml.safe_dump_all(documents, sort_keys=False)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", *args], capture_output=True, text=True, check=False
    )
