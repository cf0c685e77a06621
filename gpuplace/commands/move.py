"""`gpuplace move`: re-place the slots off a node (maintenance) or off named GPUs (a failed GPU
without a spare), as an edit of the maps to review.

Targets are chosen as the controller chooses a `count` entry's GPUs: free (no slot, running pod
or ResourceClaim holds them), healthy, granted to the map's namespace, of the same product and
memory as the GPUs the slot leaves, NVLink peers kept together. A slot moved off named GPUs stays
on its node where it has room. The node that fits best takes a slot that leaves its node (the
fewest fitting free GPUs). Nothing is half-moved: a slot gets all its GPUs or stays, and a gang
moves whole or not at all; the slots that found no room are listed with the reason, and the
command then exits 1.

Only the moved entries' `node`, `devices` (and `fallback`, whose spares belong to the old node)
change in the files; comments and layout stay byte for byte (docs/authoring.md). A `count` entry
keeps its count on its new node (the controller picks there by the same rule). With --commit the
change is a commit on a new branch; either way the plan is printed as `gpuplace plan` prints it:
the pods it moves are exactly those of the moved slots.
"""

from __future__ import annotations

import argparse
import sys

from gpuplace.commands._args import documented_command
from gpuplace.commands._authoring import (
    AuthoringError,
    add_repo_flags,
    connect,
    finish,
    held_outside,
    open_workspace,
    read_cluster,
)
from placement.authoring import apply_slot_edits
from placement.moves import MoveRequest, held_gpus, plan_moves
from placement.types import NodeName


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers, "move", "re-place the slots off a node or off named GPUs", __doc__
    )
    add_repo_flags(parser)
    parser.add_argument("--node", metavar="NODE", help="move every slot off this node")
    parser.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="UUID",
        help="move the slots off this GPU (repeatable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.node and not args.gpu:
        print("gpuplace move: error: name --node or --gpu", file=sys.stderr)
        return 1
    try:
        ws = open_workspace(args.repo, args.dir)
        kube = connect(args)
        cluster = read_cluster(kube)
        held = held_gpus(cluster.model, held_outside(kube))
    except AuthoringError as exc:
        print(f"gpuplace move: error: {exc}", file=sys.stderr)
        return 1
    node = cluster.aliases().get(args.node, args.node) if args.node else None
    request = MoveRequest(NodeName(node) if node else None, frozenset(args.gpu))
    result = plan_moves(
        request,
        ws.maps(),
        cluster.model,
        cluster.inventories,
        held,
        logical=cluster.logical(),
        aliases=cluster.aliases(),
        cliques=cluster.cliques(),
    )
    written = apply_slot_edits(ws.files, result.edits)
    for edit in result.edits:
        print(f"moved: {edit.describe()}", file=sys.stderr)
    for skip in result.unplaced:
        print(f"NOT moved: {skip.describe()}", file=sys.stderr)
    for skip in (*result.left, *written.unwritten):
        print(f"left as it is: {skip.describe()}", file=sys.stderr)
    if not result.edits and not result.unplaced:
        print(f"No slot of the repository is on {request.describe()}.", file=sys.stderr)
    subject = f"gpuplace move: {len(result.edits)} slot(s) off {request.describe()}"
    body = [e.describe() for e in result.edits]
    if result.unplaced:
        body += ["", "Found no room (left where they are):"]
        body += [s.describe() for s in result.unplaced]
    code, _ = finish(args, ws, written.files, subject, body)
    return code or (1 if result.unplaced or result.left or written.unwritten else 0)
