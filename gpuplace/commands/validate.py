"""`gpuplace validate PATH...`: check placement maps the way the controller will.

Reads the files named and every *.yaml / *.yml under the directories named (documents of other
kinds are skipped; a ConfigMap holding a map under data.placement.yaml, as `gpuplace render`
prints it, is read as that map), validates every PlacementMap, then checks the maps of each
cluster together (the nearest directory with a kustomization): a map declared twice, two exclusive
slots naming the same device on the same node. Kustomizations are checked to serve the maps the
way the controller reads them: generated ConfigMaps, or map files listed under `resources:` and
applied as PlacementMap custom resources. With `--policy FILE` (the cluster's PlacementPolicy) every map is also checked against the
grants of its namespace, as the webhook will at apply time; node selectors of grants need the
cluster's node labels, so a node that only a selector could grant is not reported here.
Exit status 0 when everything is valid (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuplace.commands._args import add_paths, documented_command
from gpuplace.commands._tree import read_paths
from placement.errors import Diagnostic, Location, PlacementError
from placement.grants import check_map, parse_policy, resolve
from placement.snapshot import Snapshot, load_snapshot


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers, "validate", "validate placement maps in files and directories", __doc__
    )
    add_paths(parser, "PATH", "map file or directory")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument(
        "--policy", metavar="FILE", help="PlacementPolicy whose grants every map must stay within"
    )
    parser.add_argument(
        "--grants-default",
        choices=("allow", "deny"),
        default="allow",
        help="what namespaces that no grant names may do, as the controller's --grants-default",
    )
    parser.add_argument(
        "--no-maps-ok",
        action="store_true",
        help="files without a map are fine (the pre-commit hook passes every staged YAML file)",
    )
    parser.set_defaults(handler=run)


def check(
    paths: list[str],
    policy: str | None = None,
    deny_by_default: bool = False,
    no_maps_ok: bool = False,
) -> tuple[Snapshot, list[Diagnostic]]:
    """The snapshot of everything under `paths`, and every diagnostic, sorted by place."""
    files, problems = read_paths(paths)
    snapshot = load_snapshot(files)
    diagnostics = problems + snapshot.diagnostics
    if policy is not None:
        diagnostics += _grant_diagnostics(snapshot, policy, deny_by_default)
    if not snapshot.maps and not snapshot.invalid and not problems and not no_maps_ok:
        diagnostics.append(
            Diagnostic(
                Location(", ".join(paths)),
                "no PlacementMap found",
                hint="maps are YAML documents with 'kind: PlacementMap'",
            )
        )
    diagnostics.sort(key=lambda d: (d.location.source, d.location.line, d.location.column))
    return snapshot, diagnostics


def _grant_diagnostics(snapshot: Snapshot, path: str, deny_by_default: bool) -> list[Diagnostic]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        return [Diagnostic(Location(path), f"cannot read the policy: {exc.strerror}")]
    try:
        policy = parse_policy(text, path)
    except PlacementError as exc:
        return list(exc.diagnostics)
    view = resolve(policy, deny_by_default, None)
    return [d for m in snapshot.maps.values() for d in check_map(view, m.map)]


def run(args: argparse.Namespace) -> int:
    snapshot, diagnostics = check(
        args.paths, args.policy, args.grants_default == "deny", args.no_maps_ok
    )
    errors = [d for d in diagnostics if d.severity == "error"]
    if args.format == "json":
        json.dump(_json_report(snapshot, diagnostics), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1 if errors else 0
    for diagnostic in diagnostics:
        print(diagnostic.format())
    slots = sum(len(m.map.slots) for m in snapshot.maps.values())
    checked = (
        f"{_count(len(snapshot.maps), 'valid map')} ({_count(slots, 'slot')}) in "
        f"{_count(len(snapshot.files), 'file')}"
    )
    if errors:
        sources = len({d.location.source for d in errors})
        print(f"Found {_count(len(errors), 'error')} in {_count(sources, 'file')} ({checked}).")
        return 1
    print(f"OK: {checked}.")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _json_report(snapshot: Snapshot, diagnostics: list[Diagnostic]) -> dict[str, Any]:
    errors = [d for d in diagnostics if d.severity == "error"]
    return {
        "valid": not errors,
        "files": len(snapshot.files),
        "maps": [
            {
                "scope": m.id.scope,
                "map": str(m.id.key),
                "source": m.source,
                "slots": len(m.map.slots),
                "sharing": m.map.sharing.value,
            }
            for m in sorted(snapshot.maps.values(), key=lambda m: m.id)
        ],
        "errors": [d.to_json() for d in errors],
        "warnings": [d.to_json() for d in diagnostics if d.severity != "error"],
    }
