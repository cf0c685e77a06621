"""Placement maps read straight from a git repository (for clusters without ArgoCD).

A thread clones the repository once, then fetches the branch every interval and, when its head
moved, hands every PlacementMap document under the path to the controller exactly as if it had
arrived in a source ConfigMap, stamped with the commit and its file (gpuplace.io/revision,
gpuplace.io/source-file). Maps that disappear from git are removed; a map whose file holds a
document that does not parse is not: it turns Invalid and keeps serving its last valid version.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import git

from controller.changes import Change, SourceChanged, SourceDeleted
from controller.settings import GitSourceSettings
from placement.annotations import PLACEMENT_KEY, REVISION_ANNOTATION, SOURCE_FILE_ANNOTATION
from placement.errors import PlacementError
from placement.yamlsource import load_documents

log = logging.getLogger(__name__)
Obj = dict[str, Any]
_SEPARATOR = re.compile(r"^---\s*$", re.MULTILINE)


def documents(text: str) -> list[str]:
    return [d for d in _SEPARATOR.split(text) if d.strip()]


def map_objects(
    root: Path, commit: str, repo_root: Path | None = None
) -> tuple[dict[tuple[str, str], Obj], dict[str, str]]:
    """Source-ConfigMap-shaped objects for every PlacementMap document under `root`, and the
    first unreadable document of each file that has one (file -> text): which map such a
    document meant cannot be told, so the maps its file held before are not taken as deleted."""
    found: dict[tuple[str, str], Obj] = {}
    broken: dict[str, str] = {}
    base = repo_root or root
    for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        if ".git" in path.parts:
            continue
        file = path.relative_to(base).as_posix() if path.is_relative_to(base) else str(path)
        for doc in documents(path.read_text(errors="replace")):
            try:
                # The bounded reader every component shares: a few hundred bytes of merge keys
                # in a commit must not cost the controller gigabytes.
                parsed = list(load_documents(doc, str(path)))
            except PlacementError as exc:
                log.warning("%s: unreadable YAML document: %s", path, exc.diagnostics[0].format())
                broken.setdefault(file, doc.lstrip("\n"))
                continue
            value = parsed[0].value if len(parsed) == 1 else None
            if not isinstance(value, dict) or value.get("kind") != "PlacementMap":
                continue
            meta = value.get("metadata") or {}
            name, namespace = meta.get("name"), meta.get("namespace")
            if not isinstance(name, str) or not isinstance(namespace, str):
                log.warning("%s: PlacementMap without metadata.name/namespace", path)
                broken.setdefault(file, doc.lstrip("\n"))
                continue
            found[(namespace, name)] = {
                "metadata": {
                    "namespace": namespace,
                    "name": name,
                    "resourceVersion": commit,
                    "annotations": {REVISION_ANNOTATION: commit, SOURCE_FILE_ANNOTATION: file},
                },
                "data": {PLACEMENT_KEY: doc.lstrip("\n")},
            }
    return found, broken


class GitSource:
    def __init__(self, settings: GitSourceSettings, emit: Callable[[Change], None]) -> None:
        self.settings = settings
        self.emit = emit  # SourceChanged | SourceDeleted
        self._stop = threading.Event()
        self._head = ""
        self._known: dict[tuple[str, str], Obj] = {}
        self.synced = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="git-source", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        workdir = Path(tempfile.mkdtemp(prefix="gpuplace-git-"))
        repo: git.Repo | None = None
        while not self._stop.is_set():
            try:
                if repo is None:
                    repo = git.Repo.clone_from(
                        self.settings.repo, workdir / "repo", branch=self.settings.branch, depth=1
                    )
                else:
                    repo.remotes.origin.fetch(self.settings.branch, depth=1)
                    repo.git.reset("--hard", f"origin/{self.settings.branch}")
                head = repo.head.commit.hexsha
                if head != self._head:
                    workdir_root = Path(repo.working_dir)
                    self._publish(workdir_root / self.settings.path, head[:12], workdir_root)
                    self._head = head
                self.synced.set()
            except (git.GitCommandError, OSError, ValueError) as exc:
                log.warning("git source %s: %s", self.settings.repo, exc)
            self._stop.wait(self.settings.interval_seconds)

    def _publish(self, root: Path, commit: str, repo_root: Path | None = None) -> None:
        found, broken = map_objects(root, commit, repo_root)
        for obj in found.values():
            self.emit(SourceChanged(obj))
        for key in set(self._known) - set(found):
            known = self._known[key]
            file = known["metadata"]["annotations"][SOURCE_FILE_ANNOTATION]
            if file in broken:
                # Served on as Invalid, with the parser's error, until the file reads again.
                unreadable = {**known, "data": {PLACEMENT_KEY: broken[file]}}
                self.emit(SourceChanged(unreadable))
                found[key] = known
                continue
            self.emit(SourceDeleted(known))
        self._known = found
        log.info("git source at %s: %d maps", commit, len(found))
