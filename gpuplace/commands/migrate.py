"""`gpuplace migrate DIR`: serve the maps of a kustomize directory as PlacementMap custom resources.

DIR is a directory whose kustomization generates the maps' source ConfigMaps with
configMapGenerator (the form of examples/gitops/clusters/dev). The kustomization is rewritten so
that it applies the map files themselves: they are listed under `resources:`, their generator
entries are removed (other generator entries are kept), `buildMetadata: [originAnnotations]` is
added (the controller reads each map's file from it, for `gpuplace explain`), and the
generatorOptions and patches that only concerned the map ConfigMaps are dropped. The map files
are left untouched; comments of the kustomization other than its leading ones are not kept.

Sync the result after the CRD placementmaps.gpuplace.io is installed. While both forms of a map
exist with the same content, the custom resource serves it and the ConfigMap's status says it is
superseded: ArgoCD prunes the ConfigMaps with the next sync (delete them by hand otherwise).

Every map under DIR must validate first (`gpuplace validate DIR`). Exit status 0 when the
directory was converted (or had nothing to convert), 1 when it cannot be, with the reasons.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuplace.commands._args import documented_command
from gpuplace.commands._tree import read_paths
from placement.errors import Diagnostic, Location, PlacementError
from placement.kustomize import KUSTOMIZATION_NAMES
from placement.migration import Migration, kustomization_text, plan_migration
from placement.snapshot import load_snapshot, map_files


class MigrationRefusedError(Exception):
    """DIR cannot be converted; `diagnostics` say why and where."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__(f"{len(diagnostics)} problem(s)")
        self.diagnostics = diagnostics


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers,
        "migrate",
        "turn a kustomization's generated map ConfigMaps into PlacementMap resources",
        __doc__,
    )
    parser.add_argument("directory", metavar="DIR", help="directory with a kustomization.yaml")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the new kustomization and what changes; write nothing",
    )
    parser.set_defaults(handler=run)


def find_kustomization(directory: Path) -> Path:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return directory / name
    shown = directory.as_posix()
    message = "no such directory" if not directory.is_dir() else "no kustomization.yaml here"
    raise MigrationRefusedError([Diagnostic(Location(shown), message)])


def plan(directory: Path) -> tuple[Path, str, Migration]:
    """The kustomization of `directory`, its text, and its migration; raises MigrationRefusedError."""
    path = find_kustomization(directory)
    files, problems = read_paths([directory.as_posix()])
    snapshot = load_snapshot(files)
    errors = problems + snapshot.errors
    if errors:
        raise MigrationRefusedError(errors)
    shown = path.as_posix()
    text = files.get(shown)
    if text is None:  # `Kustomization` without a YAML suffix is not among the files read
        text = path.read_text(encoding="utf-8")
    try:
        migration = plan_migration(shown, text, map_files(snapshot.maps.values()), files)
    except PlacementError as exc:
        raise MigrationRefusedError(list(exc.diagnostics)) from None
    if not migration.changed and not any(m.source for m in snapshot.maps.values()):
        raise MigrationRefusedError(
            [
                Diagnostic(
                    Location(directory.as_posix()),
                    "no PlacementMap found",
                    hint="maps are YAML documents with 'kind: PlacementMap'",
                )
            ]
        )
    return path, text, migration


def summary(migration: Migration, path: Path, written: bool) -> list[str]:
    if not migration.changed:
        return [f"{path.as_posix()}: no generated map ConfigMap; nothing to convert."]
    verb = "Converted" if written else "Would convert"
    lines = [f"{verb} {path.as_posix()}: {len(migration.moved)} map(s) as PlacementMap resources"]
    lines += [f"  + resources: {m.file} (PlacementMap {m.key})" for m in migration.moved]
    lines += [f"  - {what}" for what in migration.dropped]
    lines += [f"  note: {note}" for note in migration.notes]
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        path, text, migration = plan(Path(args.directory))
    except MigrationRefusedError as exc:
        for diagnostic in exc.diagnostics:
            print(diagnostic.format(), file=sys.stderr)
        print(f"Not converted: {args.directory} cannot be migrated as it is.", file=sys.stderr)
        return 1
    new_text = kustomization_text(migration, text) if migration.changed else text
    if args.dry_run:
        sys.stdout.write(new_text)
    elif migration.changed:
        path.write_text(new_text, encoding="utf-8")
    for line in summary(migration, path, written=not args.dry_run):
        print(line, file=sys.stderr)
    return 0
