"""The webhook's `processes` setting: flag, environment, chart value and schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuplace.cli import build_parser, main
from gpuplace.commands.webhook import settings_from
from tests.chartkit import CHART, NAMESPACE, SCENARIOS, helm, render
from webhook.settings import WebhookSettings


def parse(*argv: str) -> WebhookSettings:
    return settings_from(build_parser().parse_args(["webhook", *argv]))


def test_one_process_by_default() -> None:
    assert parse().server.processes == 1


def test_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse("--processes", "4").server.processes == 4
    monkeypatch.setenv("GPUPLACE_WEBHOOK_PROCESSES", "3")
    assert parse().server.processes == 3
    assert parse("--processes", "2").server.processes == 2


def test_fewer_than_one_process_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["webhook", "--self-signed", "--processes", "0"])
    assert code == 2
    assert "processes must be at least 1, not 0" in capsys.readouterr().err


def test_a_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLACE_WEBHOOK_PROCESSES", "two")
    with pytest.raises(SystemExit, match="GPUPLACE_WEBHOOK_PROCESSES='two' is not a int"):
        parse()


def _webhook_args(objects: list[dict[str, Any]]) -> list[str]:
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        if obj["kind"] == "Deployment" and labels["app.kubernetes.io/component"] == "webhook":
            return list(obj["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError("no webhook Deployment rendered")


def test_chart_passes_processes_to_the_command(tmp_path: Path) -> None:
    default = _webhook_args(render(SCENARIOS[0], tmp_path))
    assert "--processes=1" in default
    args = _webhook_args(render(SCENARIOS[0], tmp_path, "--set", "webhook.processes=4"))
    assert "--processes=4" in args
    assert parse(*args[1:]).server.processes == 4


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_schema_refuses_bad_process_counts(value: str) -> None:
    result = helm(
        "template", "gpuplace", str(CHART), "--namespace", NAMESPACE,
        "--set", f"webhook.processes={value}", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "/webhook/processes" in result.stderr
