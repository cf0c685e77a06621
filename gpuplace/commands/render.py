"""`gpuplace render DIR...`: print the maps as the cluster takes them, for `kubectl apply -f -`.

`--as configmap` (the default): one source ConfigMap a map file, named and namespaced like the
map, labelled `gpuplace.io/placement-map: "true"`, holding the file's text under `placement.yaml`
(so the controller's errors point at the lines of the file in git). This is what the
configMapGenerator of examples/gitops/clusters/dev generates for ArgoCD.

`--as crd`: each map as the PlacementMap custom resource, the document as in git (comments
aside), with the provenance annotations in its metadata. This is what a kustomization that lists
the map files under `resources:` applies (examples/gitops/clusters/prod); the CRD
placementmaps.gpuplace.io must be installed.

Nothing is printed unless every map is valid: exit status 1 with the errors on stderr.
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
from placement.snapshot import FileForm, Snapshot, SourceMap, load_snapshot

#: The forms `--as` prints: the ConfigMap a generator makes, or the custom resource.
CONFIGMAP = "configmap"
CRD = "crd"
FORMS = (CONFIGMAP, CRD)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers,
        "render",
        "print the maps under DIR as ConfigMaps or PlacementMaps (kubectl apply -f -)",
        __doc__,
    )
    add_paths(parser, "DIR", "map directory or file")
    parser.add_argument(
        "--revision",
        default="",
        help="git revision to stamp on the maps (gpuplace.io/revision), e.g. $(git rev-parse HEAD)",
    )
    parser.add_argument(
        "--as",
        dest="form",
        choices=FORMS,
        default=CONFIGMAP,
        help="print source ConfigMaps (default) or PlacementMap custom resources",
    )
    parser.set_defaults(handler=run)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the map reads as it does in git."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


class _ResourceDumper(_Dumper):
    """Also writes lists of scalars on one line (`devices: [0, 1]`), as map files do."""


def _list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
    flat = all(isinstance(v, str | int | float | bool) and "\n" not in str(v) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)


_ResourceDumper.add_representer(list, _list)


def provenance(file: str, revision: str) -> dict[str, str]:
    """The provenance annotations (what the kustomizations of examples/gitops and the
    ApplicationSet stamp)."""
    annotations = {}
    if revision:
        annotations[REVISION_ANNOTATION] = revision
    if file:
        annotations[SOURCE_FILE_ANNOTATION] = file
    return annotations


def configmap(entry: SourceMap, text: str, file: str = "", revision: str = "") -> dict[str, Any]:
    """The source ConfigMap; `file` and `revision` are its provenance."""
    annotations = provenance(file, revision)
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


def custom_resource(entry: SourceMap, file: str = "", revision: str = "") -> dict[str, Any]:
    """The PlacementMap custom resource: the document as written, its metadata annotated with
    its provenance (the map's own annotations kept)."""
    document = dict(entry.document)
    metadata = dict(document.get("metadata") or {})
    annotations = {**(metadata.get("annotations") or {}), **provenance(file, revision)}
    if annotations:
        metadata["annotations"] = annotations
    document["metadata"] = metadata
    return document


def relative_file(source: str, bases: Sequence[str]) -> str:
    """A map file's path relative to the directory it was rendered from, as a kustomization
    next to that directory names it."""
    for base in bases:
        rel = posixpath.relpath(source, base)
        if not rel.startswith(".."):
            return rel
    return source


def render(
    snapshot: Snapshot, bases: Sequence[str] = (), revision: str = "", form: str = CONFIGMAP
) -> str | list[Diagnostic]:
    """The YAML stream, or why there is none."""
    problems = list(snapshot.errors)
    entries = sorted(snapshot.maps.values(), key=lambda m: (m.map.key, m.source))
    documents_in = {m.source for m in entries if m.form is FileForm.DOCUMENT}
    for source in sorted(documents_in if form == CONFIGMAP else ()):
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
        file = relative_file(entry.source, bases)
        if form == CRD:
            obj = custom_resource(entry, file, revision)
        else:
            obj = configmap(entry, entry.text, file, revision)
        body = yaml.dump(
            obj,
            Dumper=_ResourceDumper if form == CRD else _Dumper,
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
    result = problems or render(snapshot, bases, args.revision, args.form)
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
