"""`gpuplace diff REV1 [REV2]`: what a change to the maps does, slot by slot (the review plan).

Reads every *.yaml / *.yml of the git repository at REV1 and at REV2 (or only under --path): maps
as PlacementMap documents, or as the ConfigMaps `gpuplace render` prints (either form of one map
compares equal). It prints the maps added, removed and changed, with each slot added, removed or
moved (other node, devices or count), and the maps that turn invalid with their errors (the
controller keeps serving their last valid version). Without REV2 the files on disk are compared, including uncommitted and
untracked ones (files ignored by git excepted), as `git diff REV1` does; so a CI job on a pull
request runs `gpuplace diff origin/main`.

With --kubeconfig it also names the running pods the change makes drift: pods bound to a slot
that REV2 moves or removes, or to a map it removes (see `rollout` in docs/placementmap.md for what
happens to them).

Exit status: 0 when REV2 is valid, 1 when it has errors (the plan is printed either way),
2 when a revision or the repository cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import git

from gpuplace.commands._env import env_str
from gpuplace.commands._tree import walk_yaml
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from kubeio.paths import PODS
from kubeio.pod import Pod
from placement.annotations import DEVICES_ANNOTATION, INDEX_ANNOTATION, MAP_LABEL
from placement.diff import DriftingPod, RunningPod, drifting_pods, format_plan, plan
from placement.podmeta import map_name_of
from placement.snapshot import is_yaml_path, load_snapshot

#: Paths a `git check-ignore` call: keeps its command line short in a repository of many maps.
_IGNORED_BATCH = 500


class RevisionError(Exception):
    """A revision, path or repository that cannot be read; the message says which."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="show what changes between two git revisions of the maps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("rev1", metavar="REV1", help="the base revision, e.g. origin/main")
    parser.add_argument(
        "rev2", metavar="REV2", nargs="?", help="the new revision (default: the working tree)"
    )
    parser.add_argument("--repo", default=".", help="repository directory (default .)")
    parser.add_argument(
        "--path", default="", metavar="SUBDIR", help="only maps under this repository directory"
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        nargs="?",
        const=env_str("KUBECONFIG", "") or "",
        metavar="FILE",
        help="also name the running pods of that cluster the change makes drift",
    )
    parser.set_defaults(handler=run)


def running_pods(kube: Kube) -> list[RunningPod]:
    """Pods bound through a map, from one LIST of the pods that carry the map label."""
    out: list[RunningPod] = []
    for obj in kube.get(PODS.collection(), labelSelector=MAP_LABEL)["items"]:
        pod = Pod.of(obj)
        index = pod.annotations.get(INDEX_ANNOTATION, "")
        map_name = map_name_of(pod)
        if not pod.bound or not index.isdecimal() or map_name is None:
            continue
        devices = tuple(d for d in pod.annotations.get(DEVICES_ANNOTATION, "").split(",") if d)
        out.append(
            RunningPod(pod.namespace, pod.name, map_name, int(index), pod.node_name, devices)
        )
    return out


def open_repo(directory: str) -> git.Repo:
    try:
        return git.Repo(directory, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise RevisionError(f"{directory} is not in a git repository") from exc


def files_at(repo: git.Repo, rev: str, subdir: str) -> tuple[dict[str, str], str]:
    """Repository-relative path -> text of the YAML files at `rev`, and the commit's short id."""
    try:
        commit = repo.commit(rev)
    except (git.BadName, git.BadObject, ValueError, git.GitCommandError) as exc:
        raise RevisionError(f"unknown revision {rev!r}") from exc
    tree = commit.tree
    if subdir:
        try:
            tree = tree / subdir
        except KeyError:
            return {}, commit.hexsha[:12]
    files: dict[str, str] = {}
    for item in tree.traverse():
        if not isinstance(item, git.Blob):
            continue
        path = PurePosixPath(item.path)
        # Hidden directories (.github, ...) are skipped on disk too: compare like with like.
        if is_yaml_path(path.name) and not any(p.startswith(".") for p in path.parent.parts):
            data = item.data_stream.read()
            # A file that is not UTF-8 is still compared: its maps read as invalid.
            files[path.as_posix()] = data.decode("utf-8", errors="replace")
    return files, commit.hexsha[:12]


def files_on_disk(repo: git.Repo, subdir: str) -> dict[str, str]:
    """The working tree's YAML files, keyed like `files_at` keys them."""
    if repo.working_tree_dir is None:
        raise RevisionError("the repository is bare: name REV2")
    top = Path(repo.working_tree_dir)
    root = top / subdir if subdir else top
    paths = [p.relative_to(top).as_posix() for p in walk_yaml(root)] if root.is_dir() else []
    ignored: set[str] = set()
    for start in range(0, len(paths), _IGNORED_BATCH):
        ignored.update(repo.ignored(*paths[start : start + _IGNORED_BATCH]))
    files: dict[str, str] = {}
    for rel in paths:
        if rel in ignored:
            continue
        try:
            files[rel] = (top / rel).read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise RevisionError(f"cannot read {rel}: {exc.strerror or exc}") from exc
    return files


def run(args: argparse.Namespace) -> int:
    subdir = PurePosixPath(args.path).as_posix().strip("/") if args.path else ""
    if subdir == ".":
        subdir = ""
    try:
        # Closing the repository stops the git processes gitpython keeps for reading objects.
        with open_repo(args.repo) as repo:
            old_files, old_sha = files_at(repo, args.rev1, subdir)
            if args.rev2 is None:
                new_files, new_label = files_on_disk(repo, subdir), "working tree"
                new_ref: dict[str, Any] = {"rev": None, "commit": None}
            else:
                new_files, new_sha = files_at(repo, args.rev2, subdir)
                new_label = f"{args.rev2} ({new_sha})"
                new_ref = {"rev": args.rev2, "commit": new_sha}
    except RevisionError as exc:
        print(f"gpuplace diff: error: {exc}", file=sys.stderr)
        return 2
    result = plan(load_snapshot(old_files), load_snapshot(new_files))
    drifting: list[DriftingPod] | None = None
    if args.kubeconfig is not None:
        try:
            kube = Kube.connect(ClientSettings(kubeconfig=args.kubeconfig or None))
            drifting = drifting_pods(result, running_pods(kube))
        except APIError as exc:
            print(f"gpuplace diff: error: cannot list the cluster's pods: {exc}", file=sys.stderr)
            return 2
    old_label = f"{args.rev1} ({old_sha})"
    if subdir:
        old_label, new_label = f"{old_label} {subdir}/", f"{new_label} {subdir}/"
    if args.format == "json":
        report: dict[str, Any] = {
            "from": {"rev": args.rev1, "commit": old_sha},
            "to": new_ref,
            "path": subdir,
        }
        report.update(result.to_json())
        if drifting is not None:
            report["drifting"] = [d.to_json() for d in drifting]
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_plan(result, old_label, new_label))
        if drifting is not None:
            print(f"\nRunning pods this change makes drift: {len(drifting) or 'none'}")
            for drift in drifting:
                print(f"  {drift.describe()}")
    return 0 if result.valid else 1
