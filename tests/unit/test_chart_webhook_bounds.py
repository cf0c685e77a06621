"""The chart's `webhook.bounds`: each server process's caps and timeouts, passed as flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuplace.commands.webhook import register, settings_from
from tests.chartkit import CHART, RELEASE, Scenario, helm, render
from tests.unit.test_chart import container
from webhook.settings import ServerSettings


def _args(tmp: Path, **bounds: object) -> list[str]:
    values = {"webhook": {"bounds": bounds}} if bounds else {}
    objects = render(Scenario("bounds", values), tmp)
    return list(container(objects, "webhook")["args"])


def test_the_defaults_are_the_servers_own(tmp_path: Path) -> None:
    args = _args(tmp_path)
    defaults = ServerSettings()
    assert f"--max-connections={defaults.max_connections}" in args
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
    ):
        values = tmp_path / "values.yaml"
        values.write_text(text)
        result = helm("template", RELEASE, str(CHART), "-f", str(values), check=False)
        assert result.returncode != 0, text
        assert "bounds" in result.stderr
