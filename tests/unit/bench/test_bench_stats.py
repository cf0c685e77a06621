"""The benchmarks' pure helpers: percentiles, Prometheus histogram quantiles, /proc parsing."""

from __future__ import annotations

import math

import pytest

from bench import Measurement, above, below, log_to_stderr
from bench._stats import (
    bucket_delta,
    busy_seconds,
    counter_delta,
    counter_totals,
    cpu_seconds,
    histogram_buckets,
    histogram_count,
    histogram_quantile,
    meminfo_kib,
    percentile,
    share_at_most,
    status_kib,
)

INF = math.inf

EXPOSITION = """\
# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 90
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 99
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 100
apiserver_admission_webhook_admission_duration_seconds_sum{name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit"} 0.5
apiserver_admission_webhook_admission_duration_seconds_count{name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="true",type="admit",le="0.005"} 10
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="true",type="admit",le="0.025"} 10
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpuplace.io",operation="CREATE",rejected="true",type="admit",le="+Inf"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name="pods.gpuplace.io",operation="CREATE",rejected="true",type="admit"} 0.01
apiserver_admission_webhook_admission_duration_seconds_count{name="pods.gpuplace.io",operation="CREATE",rejected="true",type="admit"} 10
apiserver_admission_webhook_admission_duration_seconds_bucket{name="placementmaps.gpuplace.io",operation="UPDATE",rejected="false",type="validate",le="0.005"} 7
apiserver_admission_webhook_admission_duration_seconds_bucket{name="placementmaps.gpuplace.io",operation="UPDATE",rejected="false",type="validate",le="0.025"} 7
apiserver_admission_webhook_admission_duration_seconds_bucket{name="placementmaps.gpuplace.io",operation="UPDATE",rejected="false",type="validate",le="+Inf"} 7
apiserver_admission_webhook_admission_duration_seconds_sum{name="placementmaps.gpuplace.io",operation="UPDATE",rejected="false",type="validate"} 0.001
apiserver_admission_webhook_admission_duration_seconds_count{name="placementmaps.gpuplace.io",operation="UPDATE",rejected="false",type="validate"} 7
# HELP apiserver_admission_webhook_request_total [ALPHA] Admission webhook request total
# TYPE apiserver_admission_webhook_request_total counter
apiserver_admission_webhook_request_total{code="200",name="pods.gpuplace.io",operation="CREATE",rejected="false",type="admit"} 100
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 40
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="PATCH",version="v1"} 7
"""
METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == pytest.approx(2.5)
    assert percentile(values, 0.99) == pytest.approx(3.97)
    assert percentile([7.0], 0.99) == 7.0


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 1.5)


def test_histogram_buckets_sum_the_matching_series_only() -> None:
    buckets = histogram_buckets(EXPOSITION, METRIC, {"name": "pods.gpuplace.io"})
    assert buckets == {0.005: 100.0, 0.025: 109.0, INF: 110.0}
    admitted = histogram_buckets(
        EXPOSITION, METRIC, {"name": "pods.gpuplace.io", "rejected": "false"}
    )
    assert admitted == {0.005: 90.0, 0.025: 99.0, INF: 100.0}
    assert histogram_buckets(EXPOSITION, METRIC, {"name": "nobody"}) == {}
    assert histogram_buckets(EXPOSITION, "no_such_metric") == {}


def test_bucket_delta_is_what_happened_between_scrapes() -> None:
    before = {0.005: 10.0, 0.025: 12.0, INF: 12.0}
    after = {0.005: 100.0, 0.025: 109.0, INF: 110.0}
    assert bucket_delta(before, after) == {0.005: 90.0, 0.025: 97.0, INF: 98.0}
    # A series that appeared after the first scrape counts from zero.
    assert bucket_delta({}, after) == after


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.005: 90.0, 0.025: 99.0, INF: 100.0}
    assert histogram_count(buckets) == 100.0
    # rank 50 of the 90 in [0, 5 ms]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.005 * 50 / 90)
    # rank 95: 5 of the 9 in (5 ms, 25 ms]
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.005 + 0.020 * 5 / 9)
    # rank 99 is the last observation of the 25 ms bucket
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.025)
    # rank 99.5 falls into +Inf: the highest finite bound, as Prometheus answers
    assert histogram_quantile(0.995, buckets) == pytest.approx(0.025)


def test_histogram_quantile_skips_empty_buckets_and_handles_nothing() -> None:
    buckets = {0.001: 0.0, 0.005: 0.0, 0.01: 10.0, INF: 10.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.0075)
    assert histogram_quantile(0.0, buckets) == 0.0
    assert histogram_quantile(0.5, {0.005: 0.0, INF: 0.0}) is None
    assert histogram_quantile(0.5, {}) is None


def test_share_at_most_reads_a_bucket_exactly() -> None:
    buckets = {0.005: 90.0, 0.025: 99.0, INF: 100.0}
    assert share_at_most(0.005, buckets) == pytest.approx(0.9)
    assert share_at_most(0.005, {0.005: 0.0, INF: 0.0}) is None
    with pytest.raises(ValueError, match="not a bucket bound"):
        share_at_most(0.01, buckets)


def test_cpu_seconds_reads_utime_and_stime_after_a_command_with_spaces() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    stat = "4242 (python -m x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123 0 0"
    assert cpu_seconds(stat, 100) == pytest.approx(3.0)


def test_status_and_meminfo_fields_in_kib() -> None:
    status = "Name:\tpython\nVmPeak:\t  500000 kB\nVmHWM:\t   98304 kB\nVmRSS:\t   90000 kB\n"
    assert status_kib(status, "VmHWM") == 98304
    assert meminfo_kib("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 24576000
    with pytest.raises(ValueError, match="VmSwap"):
        status_kib(status, "VmSwap")


def test_below_and_above_check_the_median_against_the_bound() -> None:
    fast = below("b", "p99", [0.4, 0.9, 1.5], "s", 1.0)
    assert (fast.value, fast.target, fast.ok) == (0.9, "< 1 s", True)
    assert below("b", "p99", [1.0, 1.0, 3.0], "s", 1.0).ok is False
    ratio = above("b", "ratio", [1.5, 2.5, 3.0], "x", 2.0)
    assert (ratio.value, ratio.target, ratio.ok) == (2.5, ">= 2 x", True)
    assert above("b", "ratio", [1.0, 1.9, 4.0], "x", 2.0).ok is False
    assert above("b", "ratio", [2.0], "x", 2.0).ok is True
    plain = below("b", "rate", [3.0, 1.0, 2.0], "pods/s", detail=True)
    assert plain == Measurement("b", "rate", 2.0, "pods/s", "", None, (3.0, 1.0, 2.0), True)


def test_counter_totals_sum_by_the_named_labels() -> None:
    totals = counter_totals(
        EXPOSITION, "apiserver_request_total", ("verb", "resource", "subresource")
    )
    assert totals == {("POST", "pods", "binding"): 42.0, ("PATCH", "configmaps", ""): 7.0}
    assert counter_totals(EXPOSITION, "apiserver_request_total", ("code",)) == {
        ("201",): 40.0,
        ("409",): 2.0,
        ("200",): 7.0,
    }
    # a histogram's _sum, by one label
    assert counter_totals(
        EXPOSITION, "apiserver_admission_webhook_admission_duration_seconds_sum", ("rejected",)
    ) == {("false",): pytest.approx(0.501), ("true",): pytest.approx(0.01)}


def test_counter_delta_keeps_what_moved() -> None:
    before = {("POST", "pods"): 10.0, ("GET", "nodes"): 5.0}
    after = {("POST", "pods"): 25.0, ("GET", "nodes"): 5.0, ("PATCH", "pods"): 3.0}
    assert counter_delta(before, after) == {("POST", "pods"): 15.0, ("PATCH", "pods"): 3.0}


def test_busy_seconds_leave_out_idle_and_iowait() -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  100 5 50 1000 20 3 2 0 40 0\ncpu0 50 2 25 500 10 1 1 0 20 0\nintr 1 2 3\n"
    assert busy_seconds(stat, 100) == pytest.approx((100 + 5 + 50 + 3 + 2 + 0) / 100)
    with pytest.raises(ValueError, match="cpu line"):
        busy_seconds("intr 1 2\n", 100)


def test_a_benchmarks_log_says_the_seconds_since_its_first_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([100.0, 100.0, 163.4])
    monkeypatch.setattr("bench.time.monotonic", lambda: next(clock))
    log = log_to_stderr("placement")
    log("control plane up")
    log("ceiling search: done")
    assert capsys.readouterr().err.splitlines() == [
        "[placement +0 s] control plane up",
        "[placement +63 s] ceiling search: done",
    ]
