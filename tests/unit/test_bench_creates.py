"""The bench's row of creates/s through the webhook against the same burst without it."""

from __future__ import annotations

from bench.placement import TARGET_CREATES_RATIO, RunResult, creates_rows


def burst(creates: float) -> RunResult:
    return RunResult(rate=100.0, seconds=1.0, extra={"creates_per_s": creates})


def test_the_ratio_is_taken_per_repeat_and_checked_against_its_target() -> None:
    rows = creates_rows("b", [burst(600), burst(900)], [burst(1000), burst(1000)])
    by = {m.metric: m for m in rows}
    ratio = by["creates/s through the webhook / without it"]
    assert ratio.value == 0.75  # the median of 0.6 and 0.9
    assert ratio.ok is False and ratio.target == f">= {TARGET_CREATES_RATIO:g} x"
    assert by["burst creates/s without it (webhook unregistered)"].value == 1000
    assert creates_rows("b", [burst(900)], [burst(1000)])[-1].ok is True
