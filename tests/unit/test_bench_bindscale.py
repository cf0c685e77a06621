"""bench/bindscale.py on a small drain: every path binds every pod, and the table has its rows."""

from __future__ import annotations

import pytest

from bench import bindscale


def test_a_small_drain_reports_each_path_and_the_ratio() -> None:
    lines: list[str] = []
    scale = bindscale.Scale(pods=200, processes=(1, 2), latency_ms=1.0, servers=1, in_flight=8)
    figures = {m.metric: m for m in bindscale.bench(scale, 1, lines.append)}
    labels = (
        "bind processes 0, threads (the former path)",
        "bind processes 0 (request loop)",
        "bind processes 1",
        "bind processes 2",
    )
    for label in labels:
        assert figures[label].value > 0 and figures[label].unit == "pods/s"
    ratio = figures["one process: request loop / threads"]
    assert ratio.target == ">= 1.6 x" and ratio.ok is not None
    assert figures["bind processes 2 / 1"].ok is None  # reported, no target
    assert figures["worker processes' CPU per pod, bind processes 2"].detail
    assert len(lines) == 4


def test_a_bad_process_list_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bindscale.main(["--processes", "1,x"])
    assert "--processes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bindscale.main(["--processes", "0"])
    assert "at least 1" in capsys.readouterr().err
