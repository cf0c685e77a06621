"""`from_flags`: a settings dataclass filled from the parsed flags of the same name, the others
named by the command."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from gpuplace.commands._env import from_flags


@dataclass(frozen=True)
class Settings:
    lease_seconds: float = 15.0
    system_namespace: str = "gpuplace-system"
    names: tuple[str, ...] = ()
    resync_seconds: float = 300.0
    derived: int = field(default=0, init=False)


def test_a_field_takes_the_flag_of_its_name_and_keeps_its_default_without_one() -> None:
    args = argparse.Namespace(lease_seconds=3.0, namespace="ns", handler=print)
    assert from_flags(Settings, args) == Settings(lease_seconds=3.0)


def test_a_named_field_wins_over_the_flag_of_its_name() -> None:
    args = argparse.Namespace(lease_seconds=3.0, namespace="ns", names=["a", "b"])
    settings = from_flags(Settings, args, system_namespace=args.namespace, names=("a", "b"))
    assert settings == Settings(lease_seconds=3.0, system_namespace="ns", names=("a", "b"))


def test_a_name_that_is_no_field_is_an_error() -> None:
    with pytest.raises(TypeError, match="namespace"):
        from_flags(Settings, argparse.Namespace(), namespace="ns")
