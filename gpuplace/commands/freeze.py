"""`gpuplace freeze`: the GPUs the controller chose, written into the maps that left the choice
to it, so that the repository says what the cluster does.

Each `count` entry whose pick the served model holds becomes `devices:` with those GPUs' UUIDs
(its `require` stays); each entry served from a spare (a declared GPU missing, unhealthy or
tainted) names the spare as its device and keeps the other spares. Nothing else in the files
changes: comments, key order and layout stay byte for byte (docs/authoring.md). Entries the
cluster does not serve, or serves from another version of the map, are listed and left alone.

With --commit the change is a commit on a new branch; either way the plan of the change against
the live cluster is printed as `gpuplace plan` prints it (it should move no pod).
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
    open_workspace,
    read_cluster,
)
from placement.authoring import apply_slot_edits, freeze_edits
from placement.maps import PlacementMap
from placement.types import MapKey


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers,
        "freeze",
        "write the controller's count picks and spares in use into the maps",
        __doc__,
    )
    add_repo_flags(parser)
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="only this map (repeatable; default: every map of --dir)",
    )
    parser.set_defaults(handler=run)


def selected(maps: list[PlacementMap], wanted: list[str]) -> list[PlacementMap]:
    if not wanted:
        return maps
    keys = {MapKey.parse(w) for w in wanted}
    return [m for m in maps if m.key in keys]


def run(args: argparse.Namespace) -> int:
    try:
        ws = open_workspace(args.repo, args.dir)
        cluster = read_cluster(connect(args))
        maps = selected(ws.maps(), args.map)
    except (AuthoringError, ValueError) as exc:
        print(f"gpuplace freeze: error: {exc}", file=sys.stderr)
        return 1
    edits, skipped = freeze_edits(maps, cluster.model, cluster.inventories)
    written = apply_slot_edits(ws.files, edits)
    for edit in edits:
        print(f"frozen: {edit.describe()}", file=sys.stderr)
    for skip in (*skipped, *written.unwritten):
        print(f"left as it is: {skip.describe()}", file=sys.stderr)
    if not written.files:
        print("Nothing to freeze.", file=sys.stderr)
    subject = f"gpuplace freeze: {len(edits)} slot(s) name the GPUs the controller chose"
    body = [e.describe() for e in edits]
    body += [
        "",
        "So the repository says what the cluster does: picks and spares in use become devices.",
    ]
    code, _ = finish(args, ws, written.files, subject, body)
    return code or (1 if written.unwritten else 0)
