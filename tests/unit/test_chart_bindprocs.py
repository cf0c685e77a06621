"""The chart's `controller.bindProcesses`: passed to the controller when set, bounded by the schema."""

from __future__ import annotations

from pathlib import Path

from tests.chartkit import CHART, RELEASE, Scenario, helm, render
from tests.unit.test_chart import container


def _args(tmp: Path, **controller: object) -> list[str]:
    objects = render(Scenario("bindprocs", {"controller": controller} if controller else {}), tmp)
    return list(container(objects, "controller")["args"])


def test_threads_by_default_and_processes_when_set(tmp_path: Path) -> None:
    assert not [a for a in _args(tmp_path) if a.startswith("--bind-processes")]
    assert "--bind-processes=4" in _args(tmp_path, bindProcesses=4)


def test_a_count_out_of_range_is_refused_by_the_schema(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("controller:\n  bindProcesses: 65\n")
    result = helm("template", RELEASE, str(CHART), "-f", str(values), check=False)
    assert result.returncode != 0
    assert "bindProcesses" in result.stderr
