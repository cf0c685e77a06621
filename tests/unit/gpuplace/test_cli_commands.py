"""The command line: the product's subcommands, and those the development environment (dev/,
installed into the checkout's .venv) adds through the `gpuplace.commands` entry points."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from gpuplace import cli

PRODUCT = [
    "agent",
    "completion",
    "controller",
    "crds",
    "diff",
    "explain",
    "freeze",
    "gpus",
    "import",
    "key",
    "migrate",
    "move",
    "plan",
    "preflight",
    "render",
    "status",
]


def commands(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_the_checkout_has_the_development_subcommands_in_order() -> None:
    names = commands(cli.build_parser())
    assert names == sorted(names)
    assert {"cluster", "demo", *PRODUCT, "validate", "webhook"} == set(names)


def test_the_shipped_command_line_lacks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    names = commands(cli.build_parser())
    assert "cluster" not in names and "demo" not in names
    assert set(PRODUCT) <= set(names)


def test_an_entry_point_never_replaces_a_product_command(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    class Shadow(EntryPoint):
        def load(self) -> object:
            loaded.append(self.name)
            raise AssertionError("a product command was shadowed")

    shadow = Shadow("status", "elsewhere.status", cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [shadow])
    assert "status" in commands(cli.build_parser())
    assert loaded == []


@pytest.mark.parametrize("name", [*PRODUCT, "cluster", "demo", "validate", "webhook"])
def test_a_subcommand_about_to_run_is_registered_alone_under_its_modules_name(name: str) -> None:
    parser = cli.build_parser(name)
    expected = sorted(commands(cli.build_parser())) if name == "completion" else [name]
    assert commands(parser) == expected


def test_the_subcommand_about_to_run_is_the_first_word_that_is_not_a_flag() -> None:
    assert cli.command_of(["validate", "--strict", "maps/"]) == "validate"
    assert cli.command_of(["--help"]) is None
    assert cli.command_of([]) is None
    # An unknown word: every subcommand is registered, so argparse names the choices.
    parser = cli.build_parser(cli.command_of(["nosuch", "--flag"]))
    assert set(PRODUCT) <= set(commands(parser))


def _imported_by(argv: list[str]) -> set[str]:
    """The heavy libraries a fresh interpreter holds after parsing `gpuplace <argv>`."""
    script = (
        "import sys; from gpuplace.cli import build_parser, command_of\n"
        f"build_parser(command_of({argv!r})).parse_args({argv!r})\n"
        "heavy = ('flask', 'kubernetes', 'git', 'pynvml', 'gpuplace_dev')\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_each_process_imports_only_what_its_own_subcommand_needs() -> None:
    assert _imported_by(["validate", "maps/"]) == set()
    assert _imported_by(["webhook"]) == {"flask", "kubernetes"}
    assert _imported_by(["agent", "--once"]) == {"kubernetes", "pynvml"}
    assert "flask" not in _imported_by(["controller"])
