"""`gpuplace`: one command line with a subcommand per module in `gpuplace.commands`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import gpuplace.commands


class CommandModule(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuplace", description="GitOps-driven, declarative GPU placement for Kubernetes."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(gpuplace.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = cast(CommandModule, importlib.import_module(f"gpuplace.commands.{info.name}"))
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = cast(Handler, args.handler)
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
