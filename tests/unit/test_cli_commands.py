"""The command line: the product's subcommands, and those the development environment (dev/,
installed into the checkout's .venv) adds through the `gpuplace.commands` entry points."""

from __future__ import annotations

import argparse
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
    "gpus",
    "key",
    "migrate",
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
