"""`gpuplace render DIR...`: print the source ConfigMaps of the maps, for `kubectl apply -f -`.

One ConfigMap a map file: named and namespaced like the map, labelled
`gpuplace.io/placement-map: "true"`, holding the file's text under `placement.yaml` (so the
controller's errors point at the lines of the file in git). This is what the kustomizations in
examples/gitops generate for ArgoCD. Nothing is printed unless every map is valid: exit status 1
with the errors on stderr.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuplace.commands._args import add_paths, documented_command
from gpuplace.commands._tree import read_paths
from placement.annotations import (
    PLACEMENT_KEY,
    PLACEMENT_MAP_LABEL,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
)
from placement.errors import Diagnostic, Location
from placement.snapshot import Snapshot, SourceMap, load_snapshot


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers,
        "render",
        "print source ConfigMaps for the maps under DIR (kubectl apply -f -)",
        __doc__,
    )
    add_paths(parser, "DIR", "map directory or file")
    parser.add_argument(
        "--revision",
        default="",
        help="git revision to stamp on the ConfigMaps (gpuplace.io/revision), e.g. $(git rev-parse HEAD)",
    )
    parser.set_defaults(handler=run)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the map reads as it does in git."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def configmap(entry: SourceMap, text: str, file: str = "", revision: str = "") -> dict[str, Any]:
    """The source ConfigMap; `file` and `revision` are its provenance (what the kustomizations
    of examples/gitops and the ApplicationSet stamp)."""
    annotations = {}
    if revision:
        annotations[REVISION_ANNOTATION] = revision
    if file:
        annotations[SOURCE_FILE_ANNOTATION] = file
    metadata: dict[str, Any] = {
        "name": entry.map.key.name,
        "namespace": entry.map.key.namespace,
        "labels": {PLACEMENT_MAP_LABEL: "true"},
    }
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {PLACEMENT_KEY: text},
    }


def relative_file(source: str, bases: Sequence[str]) -> str:
    """A map file's path relative to the directory it was rendered from, as a kustomization
    next to that directory names it."""
    for base in bases:
        rel = posixpath.relpath(source, base)
        if not rel.startswith(".."):
            return rel
    return source


def render(
    snapshot: Snapshot, bases: Sequence[str] = (), revision: str = ""
) -> str | list[Diagnostic]:
    """The YAML stream, or why there is none."""
    problems = list(snapshot.errors)
    entries = sorted(snapshot.maps.values(), key=lambda m: (m.map.key, m.source))
    for source in sorted({m.source for m in entries}):
        held = snapshot.maps_in(source)
        if len(held) > 1:
            problems.append(
                Diagnostic(
                    Location(source, 1, 1),
                    f"file holds {len(held)} maps; a source ConfigMap holds one file with one map",
                    hint="put each map in its own file",
                )
            )
    scopes = sorted({m.id.scope or "." for m in entries})
    if len(scopes) > 1:
        problems.append(
            Diagnostic(
                Location(scopes[1]),
                f"maps of more than one cluster directory ({', '.join(scopes)})",
                hint="render one cluster at a time, e.g. gpuplace render clusters/dev",
            )
        )
    if problems:
        return problems
    documents = []
    for entry in entries:
        body = yaml.dump(
            configmap(
                entry,
                snapshot.files[entry.source],
                relative_file(entry.source, bases),
                revision,
            ),
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=True,
        )
        documents.append(f"# Source: {entry.source}\n{body}")
    return "---\n".join(documents)


def run(args: argparse.Namespace) -> int:
    files, problems = read_paths(args.paths)
    snapshot = load_snapshot(files)
    bases = [Path(p).as_posix() for p in args.paths if Path(p).is_dir()]
    result = problems or render(snapshot, bases, args.revision)
    if isinstance(result, list):
        for diagnostic in result:
            print(diagnostic.format(), file=sys.stderr)
        errors = "1 error" if len(result) == 1 else f"{len(result)} errors"
        print(f"Nothing rendered: {errors}.", file=sys.stderr)
        return 1
    if not result:
        print("No PlacementMap found.", file=sys.stderr)
        return 1
    sys.stdout.write(result)
    return 0
