"""`gpuplace gpus` (also `gpuplace status --gpus`): who holds which GPU on which node.

A node x GPU grid: for each GPU the map and index of the pod holding it, or free; degraded
(unhealthy, with the agent's reason), drifted, renumbered or unverifiable holders are marked, and
GPUs several pods share show each. Below the grid, one line per GPU that is not free, with the
pods holding it and why when it is not simply held. Read from
the nodes' inventories (the agents) and the bound pods' binding annotations, with one LIST each.

Several clusters: `--context a --context b` (or `--all-contexts`) reads each cluster at once and
draws one grid with a CLUSTER column (`-o json`: every GPU with its `cluster`, and per cluster
whether it was read); a cluster that does not answer is a row marked UNREACHABLE, with the
reason below the grid, and the others are shown as usual.
"""

from __future__ import annotations

import argparse
import sys

from gpuplace import fleet, occupancy
from gpuplace.commands._args import documented_command
from gpuplace.commands._env import EnvFlags, add_fleet_flags, connect, on_clusters
from kubeio.client import Kube
from placement.occupancy import GpuCell

OUTPUTS = ("text", "json", "yaml")


def add_grid_flags(parser: argparse.ArgumentParser) -> None:
    """The grid's filters and output format (also on `gpuplace status`)."""
    parser.add_argument(
        "--node", action="append", default=[], metavar="NODE", help="only this node (repeatable)"
    )
    parser.add_argument(
        "--map", help="only nodes where this map (NAME or NAMESPACE/NAME) holds GPUs"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", help="only nodes where pods of this namespace hold GPUs"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="pods of every namespace (the default)"
    )
    parser.add_argument(
        "--scheduler-name",
        action="append",
        dest="schedulers",
        help="binder schedulerName(s) whose pods to read (default gpuplace, gpu-scheduler)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = documented_command(subparsers, "gpus", "show which pod holds which GPU (a grid)", __doc__)
    add_fleet_flags(EnvFlags(p))
    add_grid_flags(p)
    p.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="default text")
    p.set_defaults(handler=run)


def filters_of(args: argparse.Namespace) -> occupancy.Filters:
    return occupancy.Filters(
        nodes=frozenset(args.node),
        namespace=None if args.all_namespaces else args.namespace,
        map=args.map,
    )


def cells_of(kube: Kube, args: argparse.Namespace) -> list[GpuCell]:
    schedulers = tuple(args.schedulers or occupancy.DEFAULT_SCHEDULERS)
    return occupancy.read_cells(kube, filters_of(args), schedulers)


def show(kube: Kube, args: argparse.Namespace, output: str) -> str:
    colour = occupancy.use_colour(sys.stdout.isatty())
    return occupancy.render(cells_of(kube, args), output, filters_of(args), colour)


def show_fleet(args: argparse.Namespace, contexts: list[str], output: str) -> str:
    """The grid of every cluster in `contexts`, read concurrently."""
    readings = fleet.read_all(
        args.kubeconfig, contexts, lambda kube: cells_of(kube, args), args.request_timeout
    )
    colour = occupancy.use_colour(sys.stdout.isatty())
    return occupancy.render_fleet(readings, output, filters_of(args), colour)


def run(args: argparse.Namespace) -> int:
    def one() -> int:
        print(show(connect(args), args, args.output))
        return 0

    def many(contexts: list[str]) -> int:
        print(show_fleet(args, contexts, args.output))
        return 0

    return on_clusters(args, "gpus", one, many)
