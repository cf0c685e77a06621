"""What `gpuplace import`, `freeze` and `move` share: the cluster as they read it (get and list
only), the map repository they edit, and the end of each run: the files written, on `--commit` a
branch and a commit saying what and why, and the plan of the change as `gpuplace plan` prints it.
The choices themselves are pure (placement/authoring.py, placement/moves.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import git
from kubernetes.config import ConfigException

from gpuplace import occupancy, planreport
from gpuplace.commands import plan
from gpuplace.commands.diff import RevisionError, files_on_disk, open_repo
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError, APIForbiddenError, APINotFoundError
from kubeio.paths import CONFIGMAPS, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from placement.annotations import CLIQUE_LABEL, LEGACY_NODE_LABEL
from placement.dra import DraDevice, DraSettings, slice_devices
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.maps import PlacementMap
from placement.model import MODEL_LABEL, MODEL_NAMESPACE, Model, model_data, read_model
from placement.nodes import unique_aliases
from placement.podresources import POD_RESOURCES_KEY, PodResources
from placement.review import RepoPlan
from placement.snapshot import Snapshot, load_snapshot
from placement.types import NodeName


class AuthoringError(Exception):
    """A cluster or repository the command cannot work with; the message says which."""


@dataclass
class Cluster:
    """What the authoring commands read of a cluster, once."""

    model: Model
    inventories: dict[NodeName, NodeInventory]
    labels: Mapping[NodeName, Mapping[str, str]]
    pod_resources: dict[NodeName, PodResources] = field(default_factory=dict)
    alias_label: str = LEGACY_NODE_LABEL

    def logical(self) -> dict[NodeName, str]:
        """node -> its logical name, where exactly that node carries it."""
        return {node: name for name, node in self.aliases().items()}

    def aliases(self) -> dict[str, NodeName]:
        return unique_aliases(self.labels, self.alias_label)

    def cliques(self) -> dict[NodeName, str]:
        return {
            n: labels[CLIQUE_LABEL] for n, labels in self.labels.items() if CLIQUE_LABEL in labels
        }


def connect(args: argparse.Namespace) -> Kube:
    try:
        return Kube.connect(ClientSettings(kubeconfig=args.kubeconfig, context=args.context))
    except (ConfigException, OSError, ValueError) as exc:
        raise AuthoringError(f"cannot read the cluster: {exc}") from exc


def read_cluster(kube: Kube, alias_label: str = LEGACY_NODE_LABEL) -> Cluster:
    """The served model, the inventories (with the kubelets' pod resources the agents publish)
    and the nodes' labels: one LIST each."""
    try:
        stored = kube.get(
            CONFIGMAPS.collection(MODEL_NAMESPACE), labelSelector=f"{MODEL_LABEL}=true"
        )
        model = read_model(model_data(stored["items"]))
        inventories: dict[NodeName, NodeInventory] = {}
        resources: dict[NodeName, PodResources] = {}
        for cm in kube.get(CONFIGMAPS.collection(INVENTORY_NAMESPACE))["items"]:
            data = cm.get("data") or {}
            try:
                if INVENTORY_KEY in data:
                    inventory = NodeInventory.from_json(data[INVENTORY_KEY])
                    inventories[inventory.node] = inventory
                if POD_RESOURCES_KEY in data:
                    record = PodResources.from_json(data[POD_RESOURCES_KEY])
                    resources[record.node] = record
            except ValueError:
                continue  # `gpuplace gpus` and the controller report a malformed inventory
        labels = {
            NodeName(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
            for n in kube.get(NODES.collection())["items"]
        }
    except (APIError, OSError, ValueError) as exc:
        raise AuthoringError(f"cannot read the cluster: {exc}") from exc
    return Cluster(model, inventories, labels, resources, alias_label)


def held_outside(kube: Kube) -> list[tuple[NodeName, str]]:
    """(node, GPU UUID) of every GPU a running pod or a ResourceClaim holds now."""
    try:
        cells = occupancy.read_cells(kube)
    except (APIError, OSError) as exc:
        raise AuthoringError(f"cannot read who holds the GPUs: {exc}") from exc
    return [(c.node, c.uuid) for c in cells if c.holders or c.claims]


def dra_devices(kube: Kube, settings: DraSettings) -> dict[tuple[str, str, str], DraDevice]:
    """(driver, pool, device) -> the device, from the ResourceSlices; none without DRA."""
    try:
        slices = kube.get(RESOURCE_SLICES.collection())["items"]
    except (APINotFoundError, APIForbiddenError):
        return {}
    return {(settings.driver, d.pool, d.name): d for d in slice_devices(slices, settings)}


def claims(kube: Kube, namespace: str | None) -> dict[tuple[str, str], dict[str, object]]:
    try:
        items = kube.get(RESOURCE_CLAIMS.collection(namespace))["items"]
    except (APINotFoundError, APIForbiddenError):
        return {}
    return {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in items}


# -- the repository ---------------------------------------------------------------------------


@dataclass
class Workspace:
    repo: git.Repo
    top: Path
    directory: str  # the cluster directory, repository-relative ("" for the whole repository)
    files: dict[str, str]  # repository-relative path -> text of the working tree's YAML

    def snapshot(self) -> Snapshot:
        return load_snapshot(self.files)

    def maps(self) -> list[PlacementMap]:
        """The valid maps of the cluster directory."""
        return [entry.map for entry in self.snapshot().maps.values()]


def open_workspace(repo_dir: str, directory: str) -> Workspace:
    try:
        repo = open_repo(repo_dir)
    except RevisionError as exc:
        raise AuthoringError(str(exc)) from exc
    if repo.working_tree_dir is None:
        raise AuthoringError(f"{repo_dir}: a bare repository has no files to edit")
    top = Path(repo.working_tree_dir)
    directory = directory.strip("/")
    if directory and not (top / directory).is_dir():
        raise AuthoringError(f"{directory}: no such directory in {top}")
    try:
        files = files_on_disk(repo, directory)
    except RevisionError as exc:
        raise AuthoringError(str(exc)) from exc
    return Workspace(repo, top, "" if directory == "." else directory, files)


def add_repo_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=".", help="the map repository (default .)")
    parser.add_argument(
        "--dir",
        default="",
        metavar="DIR",
        help="the cluster directory of the repository (the one with its kustomization, e.g. "
        "clusters/prod; default: the whole repository)",
    )
    parser.add_argument(
        "--commit",
        action="store_true",
        help="make a branch and commit the change on it (default: only write the files)",
    )
    parser.add_argument("--branch", metavar="NAME", help="the branch --commit makes")
    parser.add_argument(
        "--reason", default="", metavar="TEXT", help="why, for the commit message (e.g. a ticket)"
    )
    parser.add_argument(
        "--format",
        choices=planreport_formats(),
        default="text",
        help="how the plan is printed (markdown: the pull request's comment)",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig of the cluster")
    parser.add_argument("--context", metavar="CONTEXT", help="its context (default: current)")


def planreport_formats() -> tuple[str, ...]:
    return ("text", "json", "markdown")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "change"


def finish(
    args: argparse.Namespace,
    ws: Workspace,
    changed: Mapping[str, str],
    subject: str,
    body: Sequence[str],
) -> tuple[int, RepoPlan | None]:
    """Writes `changed` (path -> text), commits it on a new branch with --commit, and prints
    the plan of the change against the live cluster. Returns (0, plan) or (1, None) when the
    repository refused."""
    base = ws.repo.head.commit.hexsha if ws.repo.head.is_valid() else None
    branch = None
    if args.commit and changed:
        branch = args.branch or f"gpuplace/{_slug(subject)}-{time.strftime('%Y%m%d%H%M%S')}"
        try:
            ws.repo.git.checkout("-b", branch)
        except git.GitCommandError as exc:
            print(f"error: cannot make branch {branch}: {exc.stderr.strip()}", file=sys.stderr)
            return 1, None
    for path, text in changed.items():
        target = ws.top / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    if branch is not None:
        ws.repo.index.add(sorted(changed))
        lines = [subject, "", *body]
        if args.reason:
            lines += ["", f"Why: {args.reason}"]
        ws.repo.index.commit("\n".join(lines) + "\n")
        print(f"Committed on branch {branch}: {subject}", file=sys.stderr)
    elif changed:
        print(
            f"Wrote {len(changed)} file(s); commit them for review (or run with --commit).",
            file=sys.stderr,
        )
    if base is None:
        return 0, None
    result = print_plan(args, ws, base, branch)
    return 0, result


def print_plan(args: argparse.Namespace, ws: Workspace, base: str, head: str | None) -> RepoPlan:
    """The plan of the change, as `gpuplace plan BASE [HEAD]` prints it."""
    context = None
    if args.context:
        context = [f"{ws.directory}={args.context}"] if ws.directory else [args.context]
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG") or None
    if kubeconfig is None and (Path.home() / ".kube" / "config").is_file():
        kubeconfig = str(Path.home() / ".kube" / "config")
    namespace = argparse.Namespace(
        base=base,
        head=head,
        repo=str(ws.top),
        clusters=[ws.directory] if ws.directory else [],
        format=args.format,
        out=[],
        detailed_exitcode=False,
        grants_default="allow",
        kubeconfig=kubeconfig,
        context=context or [],
    )
    result = plan.live(plan.build(namespace), namespace)
    text = planreport.render(result, args.format, plan.version())
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return result
