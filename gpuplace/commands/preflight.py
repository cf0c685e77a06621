"""`gpuplace preflight MAP_FILE`: print an Argo Workflow that checks a map's GPUs on their nodes.

One step per placement entry runs `gpuplace agent --once --print` on the entry's node and fails
when a declared device is missing, unhealthy or does not match `require`. The Workflow carries the
ArgoCD PreSync hook annotations: commit it next to the map and ArgoCD syncs the map only after
every entry passed.

    gpuplace preflight clusters/prod/llm-serving.yaml > clusters/prod/llm-serving.preflight.yaml
    gpuplace preflight llm-serving.yaml | argo submit -
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import PackageNotFoundError, version

import yaml

from gpuplace.commands._args import documented_command
from gpuplace.commands._env import env_str, from_flags
from placement.annotations import LEGACY_NODE_LABEL
from placement.errors import format_all
from placement.maps import PlacementMap
from placement.validate import load_maps

PROG = "gpuplace preflight"
IMAGE_REPOSITORY = "ghcr.io/gpuplace/gpuplace"
#: The SDK that builds the Workflow; an optional dependency, as no component needs it.
SDK_MODULE = "argo_workflows"
MISSING_SDK = (
    "the argo-workflows Python SDK is not installed; it builds the Workflow. "
    "Install it with: pip install 'gpuplace[workflows]'"
)


def default_image() -> str:
    """The image of this very version, so the check runs the code that printed it."""
    try:
        tag = version("gpuplace")
    except PackageNotFoundError:
        tag = "latest"
    return f"{IMAGE_REPOSITORY}:{tag}"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = documented_command(
        subparsers,
        "preflight",
        "print an Argo Workflow that checks a map's declared GPUs on their nodes",
        __doc__,
    )
    p.add_argument("map_file", metavar="MAP_FILE", help="PlacementMap YAML file ('-' for stdin)")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument(
        "--select",
        metavar="NAME",
        help="the map to check when MAP_FILE holds several",
    )
    p.add_argument(
        "--image",
        default=env_str("GPUPLACE_PREFLIGHT_IMAGE", None) or default_image(),
        help="gpuplace image the steps run (default: this version's image)",
    )
    p.add_argument("--name", help="Workflow name (default gpuplace-preflight-<map>)")
    p.add_argument("--namespace", help="Workflow namespace (default: the map's namespace)")
    p.add_argument("--service-account", help="service account of the step pods")
    p.add_argument(
        "--runtime-class",
        help="RuntimeClass that exposes the GPUs, e.g. nvidia (default: the node's default)",
    )
    p.add_argument(
        "--node-alias-label",
        default=LEGACY_NODE_LABEL,
        help=f"node label that resolves logical node names (default {LEGACY_NODE_LABEL})",
    )
    p.add_argument(
        "--toleration",
        dest="tolerations",
        action="append",
        metavar="TAINT_KEY",
        help="taint key the steps tolerate (repeatable; default nvidia.com/gpu)",
    )
    p.add_argument(
        "--timeout", type=int, default=600, metavar="SECONDS", help="Workflow deadline (600)"
    )
    p.add_argument(
        "--parallelism", type=int, default=20, help="entries checked at once (default 20)"
    )
    p.add_argument(
        "--nvml-host-path",
        metavar="PATH",
        help="host directory (or file) holding libnvidia-ml.so.1, mounted read-only into each "
        "step, for nodes without the NVIDIA container runtime (as the chart's agent.nvml)",
    )
    p.add_argument(
        "--nvml-host-path-type",
        choices=("Directory", "File"),
        default="Directory",
        help="what --nvml-host-path is (default Directory)",
    )
    p.add_argument(
        "--env",
        dest="env",
        action="append",
        metavar="NAME=VALUE",
        help="extra environment variable of each step (repeatable)",
    )
    p.add_argument(
        "--no-argocd-hook",
        dest="argocd_hook",
        action="store_false",
        help="leave out the ArgoCD PreSync hook annotations (for `argo submit`)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        return _fail(f"--timeout must be a positive number of seconds, got {args.timeout}", 2)
    if args.parallelism <= 0:
        return _fail(f"--parallelism must be positive, got {args.parallelism}", 2)
    try:
        # Imported here, not at the top, so that the CLI and every component run without the SDK.
        from gpuplace.preflight import (  # noqa: PLC0415
            DEFAULT_TOLERATIONS,
            PreflightSettings,
            workflow_manifest,
        )
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != SDK_MODULE:
            raise
        return _fail(MISSING_SDK)
    env = _env_pairs(args.env or [])
    if env is None:
        return 2
    pmap = _read_map(args.map_file, args.select)
    if pmap is None:
        return 1
    settings = from_flags(
        PreflightSettings,
        args,
        alias_label=args.node_alias_label,
        tolerations=tuple(args.tolerations or DEFAULT_TOLERATIONS),
        timeout_seconds=args.timeout,
        env=env,
    )
    manifest = workflow_manifest(pmap, settings)
    if args.output == "json":
        print(json.dumps(manifest, indent=2))
    else:
        sys.stdout.write(yaml.safe_dump(manifest, sort_keys=False, width=100))
    return 0


def _read_map(path: str, select: str | None) -> PlacementMap | None:
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{source}: error: cannot read the file: {exc}", file=sys.stderr)
        return None
    result = load_maps(text, source)
    if result.diagnostics:
        print(format_all(result.diagnostics), file=sys.stderr)
        return None
    maps = [m for m in result.maps if select is None or m.key.name == select]
    if len(maps) == 1:
        return maps[0]
    if not maps and select is not None:
        found = ", ".join(m.key.name for m in result.maps) or "none"
        print(
            f"{source}: error: no PlacementMap named {select!r} (found: {found})", file=sys.stderr
        )
    elif not maps:
        print(f"{source}: error: no PlacementMap in this file", file=sys.stderr)
    else:
        names = ", ".join(m.key.name for m in maps)
        print(
            f"{source}: error: {len(maps)} PlacementMaps in this file ({names}) "
            "(pick one with --select NAME)",
            file=sys.stderr,
        )
    return None


def _env_pairs(values: list[str]) -> tuple[tuple[str, str], ...] | None:
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            _fail(f"--env takes NAME=VALUE, got {value!r}", 2)
            return None
        pairs.append((name, rest))
    return tuple(pairs)


def _fail(message: str, status: int = 1) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status
