"""The chart's `webhook.bounds`: each replica's caps (shared out between its processes) and
timeouts, passed as flags."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from gpuplace.commands.webhook import register, settings_from
from tests.chartkit import CHART, RELEASE, Scenario, helm, render
from tests.unit.chart.test_chart import container
from webhook.settings import ServerSettings


def _args(tmp: Path, **bounds: object) -> list[str]:
    values = {"webhook": {"bounds": bounds}} if bounds else {}
    objects = render(Scenario("bounds", values), tmp)
    return list(container(objects, "webhook")["args"])


def test_the_defaults_are_the_servers_own(tmp_path: Path) -> None:
    args = _args(tmp_path)
    defaults = ServerSettings()
    assert f"--max-connections={defaults.max_connections}" in args
    assert f"--max-connections-per-client={defaults.max_connections_per_client}" in args
    assert f"--max-buffered-bytes={defaults.max_buffered_bytes}" in args
    assert f"--validation-threads={defaults.validation_threads}" in args
    assert f"--validation-queue-per-namespace={defaults.validation_queue_per_namespace}" in args
    assert f"--validation-queue={defaults.validation_queue}" in args
    assert "--request-timeout-seconds=30" in args
    assert "--write-timeout-seconds=10" in args


def test_values_become_flags_the_command_reads(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        maxConnections=64,
        maxConnectionsPerClient=24,
        maxBufferedBytes=64 * 131072 + 3 * 1048576,
        validationThreads=3,
        validationQueuePerNamespace=2,
        validationQueue=8,
        timeoutSeconds={"handshake": 5, "head": 4, "request": 20, "idle": 60, "write": 2.5},
    )
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    parsed = parser.parse_args([*args, "--bootstrap-tls"])
    server = settings_from(parsed).server
    assert (server.max_connections, server.max_buffered_bytes) == (64, 64 * 131072 + 3 * 1048576)
    assert server.max_connections_per_client == 24
    assert (server.validation_threads, server.validation_queue_per_namespace) == (3, 2)
    assert server.validation_queue == 8
    assert (server.handshake_timeout_seconds, server.head_timeout_seconds) == (5.0, 4.0)
    assert (server.request_timeout_seconds, server.idle_timeout_seconds) == (20.0, 60.0)
    assert server.write_timeout_seconds == 2.5


def test_unknown_or_impossible_bounds_are_refused_by_the_schema(tmp_path: Path) -> None:
    for text in (
        "webhook:\n  bounds:\n    maxSockets: 10\n",
        "webhook:\n  bounds:\n    maxBufferedBytes: 1000\n",
        "webhook:\n  bounds:\n    timeoutSeconds: {write: 0}\n",
        "webhook:\n  bounds:\n    maxConnectionsPerClient: -1\n",
    ):
        values = tmp_path / "values.yaml"
        values.write_text(text)
        result = helm("template", RELEASE, str(CHART), "-f", str(values), check=False)
        assert result.returncode != 0, text
        assert "bounds" in result.stderr


def test_bounds_too_small_for_the_processes_are_refused_before_install(tmp_path: Path) -> None:
    """What the command would refuse at start (a crash loop) the chart refuses at render, asking
    for the least that the command asks for too, and accepts."""
    processes = ("--set", "webhook.processes=4")
    few = helm(
        "template", RELEASE, str(CHART), *processes,
        "--set", "webhook.bounds.maxConnections=3", check=False,
    )  # fmt: skip
    assert few.returncode != 0
    assert "maxConnections 3 leaves none to some of the 4 webhook.processes" in few.stderr
    small = helm(
        "template", RELEASE, str(CHART), *processes,
        "--set", "webhook.bounds.maxBufferedBytes=70000000", check=False,
    )  # fmt: skip
    assert small.returncode != 0
    least = int(small.stderr.split("give at least ")[1].split()[0])
    values = {"webhook": {"processes": 4, "bounds": {"maxBufferedBytes": least}}}
    args = list(container(render(Scenario("least", values), tmp_path), "webhook")["args"])
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    server = settings_from(parser.parse_args([*args, "--bootstrap-tls"])).server
    assert (server.processes, server.max_buffered_bytes) == (4, least)
    with pytest.raises(ValueError, match=f"give at least {least}"):
        replace(server, max_buffered_bytes=70000000)


def test_a_client_cap_above_the_ports_is_refused_before_install() -> None:
    result = helm(
        "template", RELEASE, str(CHART), "--set", "webhook.bounds.maxConnections=64",
        "--set", "webhook.bounds.maxConnectionsPerClient=65", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "maxConnectionsPerClient 65 exceeds webhook.bounds.maxConnections 64" in result.stderr
