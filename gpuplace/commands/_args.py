"""Parser helpers shared by the subcommands (the development environment's, dev/, use them too)."""

from __future__ import annotations

import argparse


def documented_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    doc: str | None,
) -> argparse.ArgumentParser:
    """The subcommand `name`; its --help prints `doc` (the module's docstring) as written."""
    return subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_paths(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    """One or more map files or directories, as `args.paths`."""
    parser.add_argument("paths", nargs="+", metavar=metavar, help=help)
