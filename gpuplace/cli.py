"""`gpuplace`: one command line with a subcommand per module in `gpuplace.commands`, and one per
entry point of the group `gpuplace.commands` (the development environment, dev/, adds `cluster` and
`demo` that way; the shipped command line lacks them)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from functools import partial
from importlib import metadata
from importlib.metadata import entry_points
from typing import Protocol, cast

import gpuplace.commands


class CommandModule(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


Handler = Callable[[argparse.Namespace], int]

#: Entry point group of subcommand modules other distributions add.
ENTRY_POINT_GROUP = "gpuplace.commands"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. `command`: the subcommand about to run; when it names one, only its
    module is imported (a controller, webhook or agent process, or a `gpuplace validate` in a
    pipeline, does not load every other command's libraries: the Kubernetes client's
    configuration, Flask, GitPython, the development environment), unless that module reads the
    whole command line (`WHOLE_COMMAND_LINE`, as `completion` does)."""
    parser = argparse.ArgumentParser(
        prog="gpuplace", description="GitOps-driven, declarative GPU placement for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"gpuplace {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules: dict[str, Callable[[], object]] = {
        info.name: partial(importlib.import_module, f"gpuplace.commands.{info.name}")
        for info in pkgutil.iter_modules(gpuplace.commands.__path__)
        if not info.name.startswith("_")
    }
    for point in entry_points(group=ENTRY_POINT_GROUP):
        modules.setdefault(point.name, point.load)
    names = sorted(modules)
    if command in modules and not getattr(modules[command](), "WHOLE_COMMAND_LINE", False):
        names = [command]
    for name in names:
        cast(CommandModule, modules[name]()).register(subparsers)
    # The whole command line, for the commands that describe it (`gpuplace completion`).
    parser.set_defaults(root_parser=parser)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` runs: its first word that is not a flag (the root's flags, --help
    and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def version() -> str:
    """The installed distribution's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("gpuplace")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_of(words)).parse_args(words)
    handler = cast(Handler, args.handler)
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
