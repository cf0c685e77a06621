"""bench/bindscale.py on a small drain: the request loop binds every pod, and the table has its
rows."""

from __future__ import annotations

import pytest

from bench import bindscale


def test_a_small_drain_reports_the_loops_rate_and_cpu() -> None:
    lines: list[str] = []
    scale = bindscale.Scale(pods=200, latency_ms=1.0, servers=1, in_flight=8)
    figures = {m.metric: m for m in bindscale.bench(scale, 1, lines.append)}
    rate = figures["request loop"]
    assert rate.value > 0 and rate.unit == "pods/s" and rate.ok is None  # reported, no target
    assert figures["leader CPU per pod"].detail
    assert len(lines) == 1


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bindscale.main(["--pods", "x"])
    assert "--pods" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bindscale.main(["--in-flight", "0"])
    assert "at least 1" in capsys.readouterr().err
