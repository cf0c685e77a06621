"""`gpuplace render DIR...`: print the source ConfigMaps of the maps, for `kubectl apply -f -`.

One ConfigMap a map file: named and namespaced like the map, labelled
`gpuplace.io/placement-map: "true"`, holding the file's text under `placement.yaml` (so the
controller's errors point at the lines of the file in git). This is what the kustomizations in
examples/gitops generate for ArgoCD. Nothing is printed unless every map is valid: exit status 1
with the errors on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from gpuplace.commands._tree import read_paths
from placement.annotations import PLACEMENT_KEY, PLACEMENT_MAP_LABEL
from placement.errors import Diagnostic, Location
from placement.snapshot import Snapshot, SourceMap, load_snapshot


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "render",
        help="print source ConfigMaps for the maps under DIR (kubectl apply -f -)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="DIR", help="map directory or file")
    parser.set_defaults(handler=run)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the map reads as it does in git."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def configmap(entry: SourceMap, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": entry.map.key.name,
            "namespace": entry.map.key.namespace,
            "labels": {PLACEMENT_MAP_LABEL: "true"},
        },
        "data": {PLACEMENT_KEY: text},
    }


def render(snapshot: Snapshot) -> str | list[Diagnostic]:
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
            configmap(entry, snapshot.files[entry.source]),
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
    result = problems or render(snapshot)
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
