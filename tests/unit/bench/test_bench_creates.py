"""The bench's rows of the webhook's part: creates/s through the webhook against the same burst
without it, and the webhook's p99 at a steady rate against the same creates' etcd write p99."""

from __future__ import annotations

from bench._report import (
    TARGET_CREATES_RATIO,
    TARGET_WEBHOOK_VS_ETCD_P99,
    _traced,
    creates_rows,
    reference_rows,
)
from bench._runs import APISERVER, CREATE_P99, REFERENCE_CPU, WEBHOOK, Admission, Results, RunResult
from bench._workload import TARGET_STEADY_RATE


def burst(creates: float) -> RunResult:
    return RunResult(rate=100.0, seconds=1.0, extra={"creates_per_s": creates})


def test_the_ratio_is_taken_per_repeat_and_checked_against_its_target() -> None:
    rows = creates_rows("b", [burst(600), burst(900)], [burst(1000), burst(1000)])
    by = {m.metric: m for m in rows}
    ratio = by["creates/s through the webhook / without it"]
    assert ratio.value == 0.75  # the median of 0.6 and 0.9
    assert ratio.ok is False and ratio.target == f">= {TARGET_CREATES_RATIO:g} x"
    assert by["burst creates/s without it (webhook unregistered)"].value == 1000
    ratio_of = {m.metric: m for m in creates_rows("b", [burst(900)], [burst(1000)])}
    assert ratio_of["creates/s through the webhook / without it"].ok is True


def test_the_webhooks_cpu_is_counted_per_create_of_the_burst() -> None:
    through = RunResult(1.0, 1.0, pods=500, cpu={WEBHOOK: 0.25}, extra={"creates_per_s": 900.0})
    rows = creates_rows("b", [through], [burst(1000)])
    cpu = {m.metric: m for m in rows}["burst: webhook CPU per create"]
    assert cpu.value == 0.5 and cpu.unit == "ms"


def test_the_apiservers_cpu_is_counted_per_create_in_each_burst() -> None:
    def run(apiserver: float) -> RunResult:
        extra = {"creates_per_s": 1.0, REFERENCE_CPU: 0.1}
        return RunResult(1.0, 1.0, pods=500, cpu={APISERVER: apiserver}, extra=extra)

    rows = {m.metric: m for m in creates_rows("b", [run(2.0)], [run(1.5)], [run(1.75)])}
    assert rows["burst: kube-apiserver CPU per create through the webhook"].value == 4.0
    assert rows["burst: kube-apiserver CPU per create without it"].value == 3.0
    assert rows["burst: kube-apiserver CPU per create through the reference webhook"].value == 3.5


def test_each_bursts_create_p99_is_set_beside_the_others() -> None:
    def run(create_p99: float) -> RunResult:
        extra = {"creates_per_s": 1.0, REFERENCE_CPU: 0.1, CREATE_P99: create_p99}
        return RunResult(1.0, 1.0, pods=500, extra=extra)

    rows = {m.metric: m for m in creates_rows("b", [run(0.5)], [run(0.3)], [run(0.45)])}
    assert rows["burst: create p99 through the webhook"].value == 0.5
    assert rows["burst: create p99 without it"].value == 0.3
    assert rows["burst: create p99 through the reference webhook"].value == 0.45
    assert rows["burst: create p99 without it"].unit == "s"


def steady(webhook_ms: float, etcd_ms: float) -> Admission:
    calls = tuple([webhook_ms / 1000] * 100)
    return Admission({}, {}, traced=calls, creates=100, etcd=tuple([etcd_ms / 1000] * 100))


def test_the_webhooks_p99_is_held_to_a_multiple_of_the_etcd_write_p99() -> None:
    rows = _traced("b", "at 50 creates/s", [steady(6.0, 2.0)], TARGET_WEBHOOK_VS_ETCD_P99)
    by = {m.metric: m for m in rows}
    over = by["webhook p99 / the same creates' etcd write p99 (apiserver's traces) at 50 creates/s"]
    assert over.value == 3.0 and over.ok is False
    assert over.target == f"< {TARGET_WEBHOOK_VS_ETCD_P99:g} x"
    assert by["webhook p99 (apiserver's traces) at 50 creates/s"].value == 6.0
    assert by["the same creates' etcd write p99 (apiserver's traces) at 50 creates/s"].value == 2.0
    ok = _traced("b", "at 50 creates/s", [steady(3.0, 2.0)], TARGET_WEBHOOK_VS_ETCD_P99)[0]
    assert ok.ok is True
    assert len(_traced("b", "one at a time", [steady(3.0, 2.0)])) == len(rows) - 1


def test_the_reference_webhooks_p99_at_the_target_rate_is_set_beside_gpuplaces() -> None:
    """What any webhook call costs on the machine: the same steady creates through the reference
    webhook, its p99 against its etcd writes' (no target) and gpuplace's over it, per repeat."""
    results = Results(
        admission_steady={TARGET_STEADY_RATE: [steady(6.0, 2.0), steady(3.0, 1.0)]},
        reference_steady=[steady(4.0, 2.0), steady(2.0, 1.0)],
    )
    by = {m.metric: m for m in reference_rows("b", results)}
    when = f"at {TARGET_STEADY_RATE} creates/s through the reference webhook"
    assert by[f"webhook p99 (apiserver's traces) {when}"].value == 3.0  # median of 4 and 2
    over_etcd = by[f"webhook p99 / the same creates' etcd write p99 (apiserver's traces) {when}"]
    assert over_etcd.value == 2.0 and over_etcd.target == ""
    ours = f"webhook p99 at {TARGET_STEADY_RATE} creates/s (apiserver's traces), gpuplace's / the reference's"
    assert by[ours].value == 1.5  # 6/4 and 3/2
    assert reference_rows("b", Results()) == []
