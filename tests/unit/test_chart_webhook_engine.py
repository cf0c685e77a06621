"""The chart's `webhook.serverEngine`: the loop by default, cheroot when asked, nothing else."""

from __future__ import annotations

from pathlib import Path

from tests.chartkit import CHART, RELEASE, Scenario, helm, render
from tests.unit.test_chart import container


def _args(tmp: Path, **webhook: object) -> list[str]:
    objects = render(Scenario("engine", {"webhook": webhook} if webhook else {}), tmp)
    return list(container(objects, "webhook")["args"])


def test_the_loop_by_default_and_cheroot_when_set(tmp_path: Path) -> None:
    assert "--server-engine=loop" in _args(tmp_path)
    assert "--server-engine=cheroot" in _args(tmp_path, serverEngine="cheroot")


def test_an_unknown_engine_is_refused_by_the_schema(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("webhook:\n  serverEngine: uvicorn\n")
    result = helm("template", RELEASE, str(CHART), "-f", str(values), check=False)
    assert result.returncode != 0
    assert "serverEngine" in result.stderr
