"""`gpuplace plan BASE [HEAD]`: what a pull request on a map repository does, cluster by cluster.

Each directory with a kustomization is one cluster, as the ApplicationSet makes one Application
of each (`--clusters 'clusters/*'` keeps the directories its generator matches). For each, the
maps at BASE and at HEAD (default: the working tree) are compared slot by slot, and HEAD is
checked offline: every map validated, within the grants of the PlacementPolicy committed in the
directory, and every declared device against the directory's inventory snapshot, `inventory.json`
(written by `gpuplace gpus -o json` against that cluster), when one is committed.

With a kubeconfig (--kubeconfig, --context [CLUSTER=]CONTEXT) the live cluster is asked too, with
get and list only (the chart's ClusterRole gpuplace-plan): the running pods the change would
move or leave without a slot, and the slots it adds or moves that would wait on a busy, missing
or unhealthy GPU. A context without CLUSTER= serves the only cluster planned. Several clusters
are each read against the kubeconfig context of the cluster directory's name (a fleet names
them alike, docs/fleet.md) unless --context CLUSTER=CONTEXT says otherwise, all at once.

Formats: text (default), json, markdown (the pull request's comment, marked with
<!-- gpuplace-plan --> so a bot edits it in place), sarif (2.1.0, each error at its file, line and
column). `--out FORMAT=FILE` writes another format as well, so one run feeds a comment and a
code-scanning upload.

Exit status: 0 when nothing changes, 1 on errors (a map the cluster would refuse, a device the
inventory lacks, a revision or cluster that cannot be read), 2 when something changes and
--detailed-exitcode is given (0 without it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import git
from kubernetes.config import ConfigException

from gpuplace import fleet, occupancy, planreport
from gpuplace.commands._args import documented_command
from gpuplace.commands.diff import (
    RevisionError,
    files_at,
    files_on_disk,
    open_repo,
    running_pods,
)
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from kubeio.paths import NODES
from placement.annotations import LEGACY_NODE_LABEL
from placement.diff import drifting_pods
from placement.inventorycheck import INVENTORY_SNAPSHOT, waiting_slots
from placement.nodes import unique_aliases
from placement.review import (
    ClusterPlan,
    RepoPlan,
    Revision,
    cluster_directories,
    plan_cluster,
    split,
    with_live,
)
from placement.types import NodeName

FORMATS = ("text", "json", "markdown", "sarif")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers, "plan", "plan a change to a map repository, cluster by cluster", __doc__
    )
    parser.add_argument("base", metavar="BASE", help="the base revision, e.g. origin/main")
    parser.add_argument(
        "head", metavar="HEAD", nargs="?", help="the new revision (default: the working tree)"
    )
    parser.add_argument("--repo", default=".", help="repository directory (default .)")
    parser.add_argument(
        "--clusters",
        action="append",
        default=[],
        metavar="GLOB",
        help="only cluster directories matching this glob, e.g. 'clusters/*' (repeatable)",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="default text")
    parser.add_argument(
        "--out",
        action="append",
        default=[],
        metavar="FORMAT=FILE",
        help="also write FORMAT to FILE (repeatable), e.g. sarif=plan.sarif",
    )
    parser.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 2 when the change does something (0: nothing, 1: errors)",
    )
    parser.add_argument(
        "--grants-default",
        choices=("allow", "deny"),
        default="allow",
        help="what namespaces no grant names may do, as the controller's --grants-default",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="ask the live cluster(s) too")
    parser.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="[CLUSTER=]CONTEXT",
        help="kubeconfig context of a cluster directory's cluster (repeatable)",
    )
    parser.set_defaults(handler=run)


def parse_outputs(values: Sequence[str]) -> list[tuple[str, Path]]:
    out = []
    for value in values:
        form, eq, path = value.partition("=")
        if not eq or form not in FORMATS or not path:
            raise ValueError(f"--out {value!r}: expected FORMAT=FILE, FORMAT one of {FORMATS}")
        out.append((form, Path(path)))
    return out


def contexts_for(
    clusters: Sequence[ClusterPlan],
    kubeconfig: str | None,
    given: Sequence[str],
    available: Sequence[str] = (),
) -> dict[str, str | None]:
    """Cluster directory -> kubeconfig context (None: the kubeconfig's current one) of the
    clusters to read live; none without --kubeconfig or --context. In order: a context named
    with CLUSTER=; else the kubeconfig's context (`available`) of the cluster's own name, as the
    fleet names them (docs/fleet.md); else one bare context, or the current one, for the only
    cluster left. Once some cluster has its context, the others are planned offline only."""
    if kubeconfig is None and not given:
        return {}
    named: dict[str, str | None] = {}
    bare: list[str] = []
    by_name = {c.name: c.directory for c in clusters} | {c.directory: c.directory for c in clusters}
    for value in given:
        cluster, eq, context = value.rpartition("=")
        if not eq:
            bare.append(context)
        elif cluster in by_name:
            named[by_name[cluster]] = context
        else:
            raise ValueError(f"--context {value}: no cluster directory {cluster!r}")
    if len(bare) > 1:
        raise ValueError("more than one --context without CLUSTER=")
    contexts = set(available)
    matched = {
        c.directory: c.name
        for c in clusters
        if c.directory not in named and c.name in contexts and c.name not in bare
    }
    rest = [
        c.directory for c in clusters if c.directory not in named and c.directory not in matched
    ]
    if rest and (bare or not (named or matched)):
        if len(rest) > 1:
            raise ValueError(
                f"{len(rest)} clusters to read live ({', '.join(rest)}): name each one's "
                "context as --context CLUSTER=CONTEXT, or name a kubeconfig context after each"
            )
        named[rest[0]] = bare[0] if bare else None
    return named | dict(matched)


def read_live(cluster: ClusterPlan, kubeconfig: str | None, context: str | None) -> ClusterPlan:
    """`cluster` with its running pods that would drift and its slots that would wait, from one
    LIST of the placed pods, of the inventories and of the binder's pods."""
    try:
        kube = Kube.connect(ClientSettings(kubeconfig=kubeconfig, context=context))
        aliases = node_aliases(kube)
        drifting = drifting_pods(cluster.plan, running_pods(kube), aliases)
        waiting = waiting_slots(cluster.plan, occupancy.read_cells(kube), aliases)
    except (ConfigException, APIError, OSError, ValueError) as exc:
        return with_live(cluster, error=str(exc) or type(exc).__name__)
    return with_live(cluster, drifting, waiting)


def node_aliases(kube: Kube) -> dict[str, str]:
    """Logical name -> node, for slots that name their node by its logical name (one LIST)."""
    labels = {
        NodeName(n["metadata"]["name"]): n["metadata"].get("labels") or {}
        for n in kube.get(NODES.collection())["items"]
    }
    return dict(unique_aliases(labels, LEGACY_NODE_LABEL))


def inventory_at(repo: git.Repo, rev: str | None, path: str) -> str | None:
    """The text of `path` at `rev` (None: the working tree), None when it does not exist."""
    if rev is None:
        top = Path(repo.working_tree_dir or ".")
        file = top / path
        return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else None
    try:
        blob = repo.commit(rev).tree / path
    except KeyError:
        return None
    if not isinstance(blob, git.Blob):
        return None
    data: bytes = blob.data_stream.read()
    return data.decode("utf-8", errors="replace")


def build(args: argparse.Namespace) -> RepoPlan:
    base = Revision(args.base)
    head = Revision(args.head)
    try:
        with open_repo(args.repo) as repo:
            old, sha = files_at(repo, args.base, "")
            base = Revision(args.base, sha)
            if args.head is None:
                new = files_on_disk(repo, "")
            else:
                new, sha = files_at(repo, args.head, "")
                head = Revision(args.head, sha)
            directories = cluster_directories([*old, *new], args.clusters)
            if not directories and not args.clusters:
                directories = [""]  # maps without kustomizations: one cluster, the repository
            olds, news = split(old, directories), split(new, directories)
            deny = args.grants_default == "deny"
            clusters = [
                plan_cluster(
                    d,
                    olds[d],
                    news[d],
                    inventory_at(repo, args.head, _join(d, INVENTORY_SNAPSHOT)),
                    deny,
                )
                for d in directories
            ]
    except RevisionError as exc:
        return RepoPlan(base, head, (), (str(exc),))
    return RepoPlan(base, head, tuple(clusters))


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def live(result: RepoPlan, args: argparse.Namespace) -> RepoPlan:
    available = fleet.kubeconfig_contexts(args.kubeconfig) if len(result.clusters) > 1 else []
    contexts = contexts_for(result.clusters, args.kubeconfig, args.context, available)
    if not contexts:
        return result

    def read(cluster: ClusterPlan) -> ClusterPlan:
        if cluster.directory not in contexts:
            return cluster
        return read_live(cluster, args.kubeconfig, contexts[cluster.directory])

    # Each cluster its own apiserver: read them at once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(contexts))) as pool:
        clusters = tuple(pool.map(read, result.clusters))
    return RepoPlan(result.base, result.head, clusters, result.errors)


def version() -> str:
    try:
        return metadata.version("gpuplace")
    except metadata.PackageNotFoundError:
        return "unknown"


def run(args: argparse.Namespace) -> int:
    try:
        outputs = parse_outputs(args.out)
        result = live(build(args), args)
    except ValueError as exc:
        print(f"gpuplace plan: error: {exc}", file=sys.stderr)
        return 1
    for form, path in outputs:
        path.write_text(planreport.render(result, form, version()), encoding="utf-8")
    text = planreport.render(result, args.format, version())
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return result.exit_code(args.detailed_exitcode)
