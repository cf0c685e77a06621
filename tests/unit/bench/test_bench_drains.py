"""`python -m bench.drains`: its settings, and the medians and ratios it prints."""

from __future__ import annotations

import pytest

from bench._ceiling import Shape
from bench._runs import APISERVER, BINDING_CPU, ETCD, KWOK, LEADER_CPU, RunResult, window_cpu
from bench._workload import Scale
from bench.drains import Rounds, Setting, line, main, measurements, parse_shape, phases


def test_settings_and_shapes_are_read_as_written_and_refused_with_the_text() -> None:
    assert Setting.parse("512") == Setting(512)
    assert Setting.parse("256").environment() == {"GPUPLACE_BIND_WORKERS": "256"}
    assert parse_shape("8x128") == Shape(8, 128)
    for bad in ("0/256", "a", "0", "-8"):
        with pytest.raises(ValueError, match=bad):
            Setting.parse(bad)
    for bad in ("8", "8x", "0x128"):
        with pytest.raises(ValueError, match=bad):
            parse_shape(bad)


def test_a_wrong_setting_on_the_command_line_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--settings", "256,0/4"])
    assert ended.value.code == 2
    assert "'0/4': a setting is W" in capsys.readouterr().err
    for wrong in (["--age", "-5"], ["--age", "1000", "--ceilings", ""]):
        with pytest.raises(SystemExit) as ended:
            main(wrong)
        assert ended.value.code == 2
        assert "--age takes a number of pods and at least one ceiling shape" in (
            capsys.readouterr().err
        )


def drain(rate: float, binder_ms: float, own_ms: float | None = None) -> RunResult:
    extra = {
        BINDING_CPU: binder_ms / 1000,
        LEADER_CPU: (binder_ms if own_ms is None else own_ms) / 1000,
        window_cpu(APISERVER): 0.003,
        window_cpu(ETCD): 0.001,
        window_cpu(KWOK): 0.0005,
        "start_to_first_bound_s": 2.0,
    }
    return RunResult(rate=rate, seconds=1.0, pods=100, extra=extra)


def ceiling(rate: float) -> RunResult:
    return RunResult(rate=rate, seconds=1.0, pods=100, extra={window_cpu(APISERVER): 0.004})


def test_each_drain_is_held_against_the_best_ceilings_median() -> None:
    rounds = Rounds([Setting(256), Setting(512)], [Shape(8, 128), Shape(1, 256)])
    rounds.runs["drain 256"] += [drain(900, 0.2), drain(1000, 0.3), drain(1100, 0.25)]
    rounds.runs["drain 512"] += [drain(800, 0.4, own_ms=0.15)]
    rounds.runs["ceiling 8x128"] += [ceiling(1000), ceiling(1200), ceiling(5000)]  # median 1200
    rounds.runs["ceiling 1x256"] += [ceiling(1100)]
    rows = {m.metric: m for m in measurements(Scale(nodes=100, pods=500), [rounds])}
    assert rows["drain 256: pods/s"].value == 1000
    assert rows["drain 256 / ceiling 8x128"].value == pytest.approx(1000 / 1200)
    assert rows["drain 512 / ceiling 8x128"].value == pytest.approx(800 / 1200)
    assert rows["drain 256: binder CPU per pod, first -> last bind"].value == pytest.approx(0.25)
    # the leader's own process beside the whole binder's (a child's CPU would count apart)
    assert rows["drain 512: binder CPU per pod, first -> last bind"].value == pytest.approx(0.4)
    own = "drain 512: binder's own process CPU per pod, first -> last bind"
    assert rows[own].value == pytest.approx(0.15)
    assert rows["ceiling 8x128: kube-apiserver CPU per pod, first -> last bind"].value == 4.0
    # what etcd and kwok spent a pod: details, beside the apiserver's headline figure
    etcd = rows["drain 256: etcd CPU per pod, first -> last bind"]
    assert etcd.value == pytest.approx(1.0) and etcd.detail
    assert rows["drain 256: kwok CPU per pod, first -> last bind"].value == pytest.approx(0.5)
    assert "ceiling 8x128: etcd CPU per pod, first -> last bind" not in rows  # it has none
    assert "ceiling 1x256 / ceiling 8x128" not in rows
    assert rows["drain 256: start -> first bind"].detail


def test_contenders_that_never_ran_are_left_out() -> None:
    rounds = Rounds([Setting(256)], [Shape(1, 256)])
    rounds.runs["drain 256"].append(drain(900, 0.2))
    metrics = {m.metric for m in measurements(Scale(nodes=100, pods=500), [rounds])}
    assert "drain 256: pods/s" in metrics
    assert not any(m.startswith("ceiling") for m in metrics)
    assert not any(" / ceiling" in m for m in metrics)


def test_an_aged_cluster_is_a_phase_of_its_own_held_against_its_own_ceiling() -> None:
    assert [r.phase for r in phases([Setting(256)], [Shape(1, 256)], 0)] == [""]
    fresh, aged = phases([Setting(256)], [Shape(8, 128)], 60000)
    assert (fresh.phase, aged.phase) == ("fresh cluster", "after 60,000 more pods")
    fresh.runs["drain 256"] += [drain(1000, 0.2)]
    fresh.runs["ceiling 8x128"] += [ceiling(1000)]
    aged.runs["drain 256"] += [drain(600, 0.2)]
    aged.runs["ceiling 8x128"] += [ceiling(800)]
    rows = {
        (m.benchmark, m.metric): m.value
        for m in measurements(Scale(nodes=100, pods=500), [fresh, aged])
    }
    label = "drains 100 nodes x 8, 500 pods"
    assert rows[(f"{label}, fresh cluster", "drain 256 / ceiling 8x128")] == 1.0
    assert rows[(f"{label}, after 60,000 more pods", "drain 256 / ceiling 8x128")] == 0.75
    assert rows[(f"{label}, after 60,000 more pods", "ceiling 8x128: pods/s")] == 800


def test_a_runs_log_line_says_what_the_binder_the_apiserver_and_etcd_spent_a_pod() -> None:
    said = line(drain(900, 0.2, own_ms=0.15))
    assert said.startswith("900 pods/s, binder CPU/pod 0.200 ms, its own process 0.150 ms, ")
    assert "apiserver CPU/pod 3.000 ms, etcd 1.000 ms, start->first 2.00 s" in said
    assert "etcd" not in line(RunResult(rate=5, seconds=1.0, pods=5, extra={}))
