"""The Binding ceiling's pure parts: how the pods are split between the client's processes, the
search over processes x threads, one client process's POSTs, and the rows the bench reports."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import cast

import pytest

from bench._backlog import Backlogs
from bench._ceiling import Posted, Shape, around, post_all, process_counts, search, split
from bench._kube import MACHINE, OTHERS, CpuSampler, Observed, concurrently
from bench._proc import BenchError
from bench._report import TARGET_VS_CEILING, _details, _throughput, ceiling_rows, rates, vs
from bench._runs import (
    AFTER_CREATE_P50,
    AFTER_CREATE_P99,
    BINDING_CPU,
    CLIENT,
    CREATE_P99,
    SEEN_P99,
    Results,
    RunResult,
    Usage,
    burst_result,
    drain_result,
    window_cpu,
)
from bench._stats import percentile
from bench._steps import CEILING_CONCURRENCY, drain_contenders, run_contenders
from bench._workload import NAMESPACE, REFERENCE_KEY, Scale, binding, gpu_uuid
from kubeio.client import Response
from kubeio.requests import Request
from placement.annotations import decode_binding, signed_binding, verify_binding
from placement.keyring import RingKey
from placement.types import MapKey

SCALE = Scale(nodes=20, pods=100)


# --------------------------------------------------------------------------- splitting the pods


def test_every_item_goes_to_exactly_one_process_in_its_order() -> None:
    items = list(range(10))
    assert split(items, 3) == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert split(items, 1) == [items]
    assert split([1, 2], 4) == [[1], [2]]  # no process without work
    assert split([], 4) == [[]]


def test_each_thread_of_each_process_works_through_the_whole_order() -> None:
    """Process p's thread t gets items p + P * (t + T * k), as `concurrently` deals its share: with
    one process that is today's dealing, with more every thread still starts near the front."""
    items, processes, threads = list(range(48)), 3, 4
    owner: dict[int, tuple[int, str]] = {}
    for p, share in enumerate(split(items, processes)):

        def note(item: int, p: int = p) -> None:
            owner[item] = (p, threading.current_thread().name)

        concurrently(share, note, threads)
    assert sorted(owner) == items
    for item, (p, _) in owner.items():
        assert item % processes == p
    first = {owner[i] for i in range(processes * threads)}
    assert len(first) == processes * threads  # the first P x T items: one to every thread


# --------------------------------------------------------------------------- the search


def test_process_counts_double_up_to_the_cpus_and_the_cap() -> None:
    assert process_counts(1) == [1]
    assert process_counts(2) == [1, 2]
    assert process_counts(6) == [1, 2, 4]
    assert process_counts(16) == [1, 2, 4, 8]
    assert process_counts(64, cap=32) == [1, 2, 4, 8, 16, 32]
    assert process_counts(0) == [1]


@pytest.mark.parametrize(
    ("best", "processes", "threads"),
    [
        (Shape(1, 128), 2, [32, 64, 128]),
        (Shape(1, 32), 8, [2, 4, 8]),
        (Shape(1, 256), 2, [64, 128, 256]),
        (Shape(2, 128), 4, [32, 64, 128]),
        (Shape(1, 2), 4, [1, 2]),  # at least one thread a process
        (Shape(1, 256), 1, [128, 256]),  # never more threads than the one-process search tried
    ],
)
def test_around_keeps_the_bests_bindings_in_flight_and_tries_half_and_twice(
    best: Shape, processes: int, threads: list[int]
) -> None:
    assert around(best, processes, most_threads=256) == [Shape(processes, t) for t in threads]


def fake_rate(
    per_process: float, apiserver: float, extra_process_cost: float = 0.0
) -> Callable[[Shape], float]:
    """A client limited to `per_process` pods/s a process (64 threads needed to reach it), an
    apiserver limited to `apiserver`; each process beyond the first costs the machine a share."""

    def rate(shape: Shape) -> float:
        client = shape.processes * per_process * min(1.0, shape.threads / 64)
        return min(client, apiserver) * (1 - extra_process_cost * (shape.processes - 1))

    return rate


def test_the_search_adds_processes_while_they_help_and_keeps_the_one_process_search() -> None:
    found: dict[Shape, float] = {}
    lines: list[str] = []
    best = search(fake_rate(500, 1800), CEILING_CONCURRENCY, found, lines.append, cpus=16)
    assert [s for s in found if s.processes == 1] == [Shape(1, t) for t in CEILING_CONCURRENCY]
    assert best.processes == 4 and found[best] == 1800
    # 8 processes beat nothing that 4 did: the apiserver is the limit, the search stops there.
    assert max(s.processes for s in found) == 8
    assert len(found) == 4 + 3 * 3
    assert lines[0] == "ceiling search: 1 process x 32 threads: 250 pods/s"
    assert len(lines) == len(found)


def test_the_search_stops_at_the_first_process_count_that_does_not_help() -> None:
    found: dict[Shape, float] = {}
    # A client that is not the limit on a small machine: a second process only costs CPU.
    best = search(fake_rate(900, 600, 0.2), CEILING_CONCURRENCY, found, lambda _: None, cpus=16)
    assert best.processes == 1
    assert {s.processes for s in found} == {1, 2}
    assert len(found) == 4 + 3


def test_on_two_cores_the_search_tries_at_most_two_processes() -> None:
    found: dict[Shape, float] = {}
    search(fake_rate(300, 5000), CEILING_CONCURRENCY, found, lambda _: None, cpus=2)
    assert {s.processes for s in found} == {1, 2}
    assert len(found) <= 4 + 3


def test_a_shape_describes_itself_and_sorts_by_processes_then_threads() -> None:
    assert Shape(1, 64).describe() == "1 process x 64 threads"
    assert Shape(4, 32).describe() == "4 processes x 32 threads"
    assert Shape(4, 32).in_flight == 128
    assert sorted([Shape(2, 16), Shape(1, 256), Shape(2, 8)]) == [
        Shape(1, 256),
        Shape(2, 8),
        Shape(2, 16),
    ]


# --------------------------------------------------------------------------- one process's POSTs


class FakeKube:
    """Answers every Binding with `status`, recording what was sent."""

    def __init__(self, status: int = 201) -> None:
        self.status = status
        self.targets: list[str] = []
        self._lock = threading.Lock()

    def send(self, request: Request) -> Response:
        with self._lock:
            self.targets.append(request.target)
        if self.status == 201:
            return Response(201, b"")
        return Response(self.status, b'{"kind":"Status","message":"pod is already assigned"}')


def test_a_client_process_posts_every_binding_once_to_its_pods_binding() -> None:
    bindings = [binding(SCALE, pod, 7) for pod in range(20)]
    kube = FakeKube()
    times = post_all(kube, bindings, threads=4)  # type: ignore[arg-type]
    assert len(times) == 20 and all(sent <= done for sent, done in times)
    expected = {f"/api/v1/namespaces/bench/pods/{b['metadata']['name']}/binding" for b in bindings}
    assert sorted(kube.targets) == sorted(expected)


def test_a_refused_binding_fails_the_client_process_with_the_apiservers_message() -> None:
    with pytest.raises(BenchError, match="HTTP 409: pod is already assigned"):
        post_all(FakeKube(409), [binding(SCALE, 0, 1)], threads=1)  # type: ignore[arg-type]


def test_posted_times_give_the_clients_rate_and_latencies() -> None:
    posted = Posted(((10.0, 10.5), (10.0, 11.0), (10.5, 12.0)), cpu=0.3)
    assert posted.rate == 3 / 2.0
    assert posted.latencies == [0.5, 1.0, 1.5]
    assert posted.p(0.5) == 1.0


# --------------------------------------------------------------------------- the rows


def test_the_client_processes_cpu_is_the_bench_clients() -> None:
    usage = Usage({CLIENT: 0.1, MACHINE: 5.0, OTHERS: 2.0}, {}, 10.0)
    usage.charge(CLIENT, 1.5)
    assert usage.cpu == {CLIENT: 1.6, MACHINE: 5.0, OTHERS: 0.5}


def test_a_drain_reports_the_control_planes_cpu_per_pod_between_its_first_and_last_bind() -> None:
    """The samplers ran through the whole block (start-up included); the figure is the stretch
    from the first bind to the last, per pod after the first, like the binder's own."""
    sampler = CpuSampler(os.getpid()).stop()
    # 1 CPU second a second until t=10, then 3 a second: 4 s of CPU between t=9 and t=11
    sampler.samples = [(0.0, 0.0), (10.0, 10.0), (20.0, 40.0)]
    usage = Usage({MACHINE: 50.0, OTHERS: 50.0}, {}, 20.0, {"kube-apiserver": sampler})
    seen = Observed(
        added={}, bound={"a": 9.0, "b": 10.0, "c": 11.0}, listed=0, events=0, restarts=0, cpu=0.0
    )
    result = drain_result(seen, started=5.0, usage=usage)
    assert result.extra[window_cpu("kube-apiserver")] == pytest.approx(4.0 / 2)
    assert result.rate == pytest.approx(2 / 2.0)


def test_a_bursts_latency_is_split_at_each_creates_answer() -> None:
    """create sent -> answered is the create's own (the webhook and the apiserver's write);
    answered -> bound is what the binding takes after it."""
    usage = Usage({MACHINE: 5.0, OTHERS: 5.0}, {}, 2.0)
    sent = {f"p{i}": float(i) for i in range(100)}
    answered = {name: t + (0.5 if name == "p7" else 0.1) for name, t in sent.items()}
    bound = {name: t + (2.0 if name == "p3" else 0.3) for name, t in answered.items()}
    added = {name: t + 0.05 for name, t in answered.items()}
    seen = Observed(added=added, bound=bound, listed=0, events=0, restarts=0, cpu=0.0)
    result = burst_result(sent, seen, usage, answered)
    assert result.extra[CREATE_P99] == pytest.approx(0.1 + 0.4 * 0.01)  # one 0.5 s create of 100
    assert result.extra[AFTER_CREATE_P50] == pytest.approx(0.3)
    assert result.extra[AFTER_CREATE_P99] == pytest.approx(0.3 + 1.7 * 0.01)
    assert result.p99 == pytest.approx(percentile([b - sent[n] for n, b in bound.items()], 0.99))
    assert result.extra[SEEN_P99] == pytest.approx(0.25 + 1.7 * 0.01)
    assert result.line().endswith(
        "(the create p99 0.104 s; answered -> bound p99 0.317 s, first seen -> bound 0.267 s)"
    )
    without = burst_result(sent, seen, usage)
    assert CREATE_P99 not in without.extra and "the create" not in without.line()


def ceiling_run(rate: float, shape: Shape, client_cpu: float = 0.05) -> RunResult:
    return RunResult(
        rate=rate,
        seconds=1.0,
        p50=0.01,
        p99=0.05,
        pods=100,
        cpu={CLIENT: client_cpu},
        extra={"processes": float(shape.processes), "threads per process": float(shape.threads)},
    )


def run(rate: float, **extra: float) -> RunResult:
    return RunResult(rate=rate, seconds=1.0, p50=0.1, p99=0.5, pods=100, extra=extra)


def results() -> Results:
    best = Shape(2, 64)
    return Results(
        gpuplace_burst=[run(300, creates_per_s=400), run(340, creates_per_s=420)],
        gpuplace_burst_unhooked=[run(300, creates_per_s=500), run(300, creates_per_s=500)],
        gpuplace_drain=[
            run(540, **{BINDING_CPU: 0.0005, "start_to_first_bound_s": 1.5}),
            run(560, **{BINDING_CPU: 0.0005, "start_to_first_bound_s": 1.7}),
        ],
        scheduler_burst=[run(100), run(100)],
        scheduler_drain=[run(280, **{BINDING_CPU: 0.003}), run(280, **{BINDING_CPU: 0.003})],
        ceiling=[ceiling_run(600, best), ceiling_run(700, best)],
        ceiling_search={Shape(1, 32): 500, Shape(1, 64): 550, best: 650, Shape(2, 128): 600},
    )


def test_the_ceiling_row_names_the_best_shape_and_the_ratios_have_their_rates_beside() -> None:
    rows = ceiling_rows("b", results())
    by = {m.metric: m for m in rows}
    ceiling = by["Binding ceiling: pods/s (best of 4: 2 processes x 64 threads)"]
    assert ceiling.value == 650 and ceiling.samples == (600, 700)
    drain = by["gpuplace drain / ceiling"]
    assert drain.samples == (540 / 600, 560 / 700)
    assert drain.target == f">= {TARGET_VS_CEILING:g} x"
    assert by["gpuplace drain / ceiling: gpuplace drain"].value == 550
    assert by["gpuplace drain / ceiling: ceiling"].value == 650
    assert by["gpuplace burst / ceiling: gpuplace burst"].value == 320
    assert by["ceiling: client CPU per bound pod"].value == 0.5  # 0.05 s over 100 pods, in ms


def test_every_ratio_of_the_table_has_absolute_rates_beside_it() -> None:
    rows = _throughput("b", results())
    # The reference webhook's ratios (here "not run") have their rows of their own.
    ratios = [i for i, m in enumerate(rows) if m.unit == "x" and "reference" not in m.metric]
    assert len(ratios) == 5
    for i in ratios:
        after, before = rows[i + 1 : i + 3], rows[i - 2 : i]
        beside = after if all(m.metric.startswith(rows[i].metric) for m in after) else before
        assert [m.unit for m in beside] in (["pods/s", "pods/s"], ["/s", "/s"]), rows[i].metric
    by = {m.metric: m for m in rows}
    assert by["gpuplace / kube-scheduler, drain: kube-scheduler"].value == 280
    assert by["gpuplace / kube-scheduler, burst: gpuplace"].value == 320


def test_the_details_list_every_point_of_the_search() -> None:
    rows = [m for m in _details("b", results()) if m.metric.startswith("ceiling search")]
    assert [(m.metric, m.value) for m in rows] == [
        ("ceiling search: 1 process x 32 threads", 500),
        ("ceiling search: 1 process x 64 threads", 550),
        ("ceiling search: 2 processes x 64 threads", 650),
        ("ceiling search: 2 processes x 128 threads", 600),
    ]
    assert all(m.detail and m.unit == "pods/s" for m in rows)


def test_the_details_have_the_bursts_without_the_webhook_and_through_the_reference_too() -> None:
    r = results()
    r.reference_burst = [run(290, creates_per_s=450), run(310, creates_per_s=470)]
    rows = {m.metric: m for m in _details("b", r)}
    assert rows["gpuplace burst without the webhook: creates_per_s"].value == 500
    assert rows["gpuplace burst through the reference webhook: creates_per_s"].value == 460


def test_vs_checks_a_target_only_when_given() -> None:
    a, b = [run(200)], [run(100)]
    assert vs("b", "a / b", ("a", a), ("b", b))[0].ok is None
    assert vs("b", "a / b", ("a", a), ("b", b), 2.0)[0].ok is True
    assert [m.metric for m in vs("b", "a / b", ("a", a), ("b", b))] == [
        "a / b",
        "a / b: a",
        "a / b: b",
    ]


class RecordingBench:
    """Each contender's run, recorded in the order the repeat asks for them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _run(self, name: str) -> RunResult:
        self.calls.append(name)
        return run(100 + len(self.calls))

    def gpuplace_drain(self) -> RunResult:
        return self._run("gpuplace drain")

    def ceiling(self, shape: Shape) -> RunResult:
        return self._run(f"ceiling {shape.describe()}")


def test_the_ceiling_binds_right_after_gpuplaces_drain_at_the_searchs_best_shape() -> None:
    bench, r, logged = RecordingBench(), Results(), list[str]()
    contenders = drain_contenders(cast(Backlogs, bench), r, Shape(8, 128))
    run_contenders(contenders, RunResult.line, logged.append)
    assert bench.calls == ["gpuplace drain", "ceiling 8 processes x 128 threads"]
    assert rates(r.gpuplace_drain) == [101] and rates(r.ceiling) == [102]
    assert logged[1].startswith("  ceiling (8 processes x 128 threads): ")


def test_the_ceilings_binding_is_the_one_gpuplace_sends_for_that_slot() -> None:
    # The same annotations (decision and signature) as the binder's Binding: both bind the same
    # objects with the same bytes.
    annotations = binding(SCALE, 3, 1, uid="u-3")["metadata"]["annotations"]
    decision = decode_binding(NAMESPACE, annotations)
    assert decision is not None
    assert decision.map == MapKey(NAMESPACE, SCALE.map_index(3)[0])
    assert decision.node == SCALE.node(3)
    assert decision.devices == (gpu_uuid(3 % SCALE.nodes, SCALE.device(3)),)
    assert verify_binding(REFERENCE_KEY.secret, "u-3", NAMESPACE, annotations)
    signer = RingKey(b"another key, as the controller's", "2026-01-01T00:00:00Z")
    assert set(annotations) == set(
        signed_binding(signer.secret, signer.id, "u-3", NAMESPACE, decision)
    )
