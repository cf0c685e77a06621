"""The DRA benchmark's pure parts: the claims kube-scheduler gets, the write counts, the check
that every contender placed the same devices, and the rows it reports."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench import Budget
from bench._dra_workload import (
    CLAIM_ENTRY,
    CLAIM_METADATA,
    FINALIZER_VERBS,
    PLACEMENT_RESOURCES,
    DraResults,
    DraRun,
    allocation_errors,
    cel_claim,
    cel_only_pod,
    cel_pod,
    device_class,
    placement_rate,
    slot_device,
    uuid_selector,
    with_placement_rate,
    writes_per_pod,
)
from bench._podwatch import Seen
from bench._runs import RunResult
from bench._workload import Scale, gpu_uuid, inventory, node_name
from bench.dra import WIDE, contend_ratio, measurements
from placement.dra import REQUEST_NAME, DraSettings, allocation_status, slice_devices, slice_for
from placement.types import NodeName

SCALE = Scale(nodes=3, pods=200, gpus=100)


def test_uuid_selector_names_the_attribute_in_the_drivers_domain() -> None:
    settings = DraSettings()
    assert uuid_selector("GPU-1", settings) == 'device.attributes["gpu.nvidia.com"].uuid == "GPU-1"'
    qualified = DraSettings(driver="gpu.example.com", attribute="example.com/serial")
    assert uuid_selector("S1", qualified) == 'device.attributes["example.com"].serial == "S1"'


def test_cel_claim_requests_one_device_of_the_class_selected_by_the_slots_uuid() -> None:
    pod = 104  # node 104 % 3 = 2, device 104 // 3 = 34
    claim = cel_claim(SCALE, pod, run=7)
    request = claim["spec"]["devices"]["requests"][0]
    assert claim["metadata"]["name"] == "r7-bench-001-4"
    assert request["name"] == REQUEST_NAME
    assert request["exactly"]["deviceClassName"] == DraSettings().device_class
    assert "allocationMode" not in request["exactly"]  # ExactCount, one device
    (selector,) = request["exactly"]["selectors"]
    assert gpu_uuid(2, 34) in selector["cel"]["expression"]
    assert device_class(DraSettings())["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}
    ]


def test_claim_pods_use_their_claim_in_the_container() -> None:
    for build in (cel_pod, cel_only_pod):
        pod = build(SCALE, 5, 1)
        name = pod["metadata"]["name"]
        assert pod["spec"]["resourceClaims"] == [{"name": CLAIM_ENTRY, "resourceClaimName": name}]
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["claims"] == [{"name": CLAIM_ENTRY}]
    affinity = cel_pod(SCALE, 5, 1)["spec"]["affinity"]["nodeAffinity"]
    term = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == [node_name(5 % 3)]
    assert "affinity" not in cel_only_pod(SCALE, 5, 1)["spec"]  # the claim's CEL alone pins it


def test_slot_device_is_the_device_the_nodes_slice_publishes_under_that_uuid() -> None:
    pod = 104
    device = slot_device(SCALE, pod)
    published = slice_devices([slice_for(inventory(2, SCALE.gpus), DraSettings())], DraSettings())
    (same,) = [d for d in published if d.uuid == gpu_uuid(2, 34)]
    assert device == same
    assert device.node == NodeName(node_name(2))


METRICS = """\
apiserver_request_total{{code="201",resource="pods",subresource="binding",verb="POST"}} {binding}
apiserver_request_total{{code="200",resource="resourceclaims",subresource="status",verb="PATCH"}} {status}
apiserver_request_total{{code="200",resource="resourceclaims",subresource="",verb="PUT"}} {final}
apiserver_request_total{{code="200",resource="pods",subresource="status",verb="PATCH"}} {kwok}
apiserver_request_total{{code="200",resource="resourceclaims",subresource="",verb="LIST"}} {reads}
"""


def test_writes_per_pod_count_write_verbs_of_the_named_resources_or_all() -> None:
    before = METRICS.format(binding=5, status=5, final=2, kwok=1, reads=3)
    after = METRICS.format(binding=15, status=15, final=12, kwok=21, reads=90)
    assert writes_per_pod(before, after, 10, PLACEMENT_RESOURCES) == 3.0
    assert writes_per_pod(before, after, 10) == 5.0  # kwok's pod status updates too, never reads
    assert writes_per_pod(before, after, 10, {("pods", "binding")}) == 1.0
    assert writes_per_pod(before, after, 10, CLAIM_METADATA, FINALIZER_VERBS) == 1.0


def _claim(pod: str, node: str, device: str, driver: str = "gpu.nvidia.com") -> dict[str, object]:
    return {
        "status": {
            "allocation": {
                "devices": {"results": [{"driver": driver, "pool": node, "device": device}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}],
        }
    }


def test_allocation_errors_name_pods_without_exactly_their_planned_device() -> None:
    a, b = slot_device(SCALE, 0), slot_device(SCALE, 1)
    expected = {"p0": a, "p1": b}
    good = [_claim("p0", a.pool, a.name), _claim("p1", b.pool, b.name), {"status": {}}]
    assert allocation_errors(good, expected) == []
    status = allocation_status([a], a.node, "p0", "uid", "gpu.nvidia.com")
    assert allocation_errors([{"status": status}, good[1]], expected) == []
    wrong = [_claim("p0", a.pool, "gpu-7"), _claim("p1", b.pool, b.name)]
    (error,) = allocation_errors(wrong, expected)
    assert error.startswith("p0: allocated [('gpu.nvidia.com', 'bench-node-0000', 'gpu-7')]")
    assert allocation_errors([good[0]], expected) == [
        f"p1: allocated [], planned [('gpu.nvidia.com', '{b.pool}', '{b.name}')]"
    ]
    twice = [good[0], good[0], good[1]]
    assert [e.split(":")[0] for e in allocation_errors(twice, expected)] == ["p0"]


def _run(rate: float, placement: float = 3.0, p99: float | None = None) -> DraRun:
    return DraRun(RunResult(rate=rate, seconds=1.0, p99=p99), placement, placement + 1, 1.0)


def test_measurements_check_the_targets_on_the_drains() -> None:
    results = DraResults(
        gpuplace_burst=[_run(100, 4, 0.5)],
        gpuplace_drain=[_run(500)],
        scheduler_burst=[_run(20, 4, 3.0)],
        scheduler_drain=[_run(100)],
        minimal=[
            replace(
                _run(600, 2, 0.1), result=RunResult(600, 1.0, 0.05, 0.1, extra={"concurrency": 32})
            )
        ],
        minimal_search={32: 600, 128: 400},
    )
    rows = {m.metric: m for m in measurements(SCALE, results)}
    vs_scheduler = rows["gpuplace / kube-scheduler, dra drain"]
    assert (vs_scheduler.value, vs_scheduler.ok) == (5.0, True)
    vs_minimal = rows["DRA drain / minimal claim+Binding client"]
    assert vs_minimal.value == pytest.approx(500 / 600)
    assert vs_minimal.ok is True
    assert rows["DRA drain / minimal claim+Binding client: DRA drain"].value == 500
    assert rows["DRA drain / minimal claim+Binding client: minimal client"].value == 600
    metrics = [m.metric for m in measurements(SCALE, results)]
    at = metrics.index("DRA drain / minimal claim+Binding client")
    assert metrics[at + 1 : at + 3] == [  # the rates beside the ratio
        "DRA drain / minimal claim+Binding client: DRA drain",
        "DRA drain / minimal claim+Binding client: minimal client",
    ]
    assert rows["gpuplace dra drain: finalizer writes per pod"].value == 1
    assert rows["gpuplace / kube-scheduler, dra burst"].value == 5.0
    assert rows["minimal claim status + Binding (32 threads): pods/s"].value == 600
    assert rows["gpuplace dra burst: create -> bound p99"].value == 0.5
    assert rows["kube-scheduler dra burst: writes per pod, claims + Bindings"].value == 4
    assert rows["minimal claim status + Binding: writes per pod, all"].value == 3
    slow = replace(results, gpuplace_drain=[_run(450)])
    rows = {m.metric: m for m in measurements(SCALE, slow)}
    assert rows["gpuplace / kube-scheduler, dra drain"].ok is False
    assert rows["DRA drain / minimal claim+Binding client"].ok is False


def test_placement_rate_times_from_the_first_allocation_to_the_last_binding() -> None:
    # A pipeline that allocates every claim first: its Bindings come late and close together.
    assert placement_rate([10.0, 10.5, 11.0], [12.0, 12.1, 14.0]) == 3 / 4.0
    assert placement_rate([1.0], [1.0]) == float("inf")
    result = with_placement_rate(RunResult(rate=15.0, seconds=0.2), [10.0], [12.0, 12.1, 14.0])
    assert result.rate == 0.75
    assert result.extra["pods/s, first -> last Binding"] == 15.0


def test_the_watcher_counts_claims_once_allocated_and_pods_once_bound() -> None:
    claims = Seen(claims=True)
    claims.observe({"metadata": {"name": "c"}, "status": {}}, 1.0)
    claims.observe({"metadata": {"name": "c"}, "spec": {"nodeName": "n"}}, 2.0)
    assert claims.bound == {}
    claims.observe({"metadata": {"name": "c"}, "status": {"allocation": {"devices": {}}}}, 3.0)
    claims.observe({"metadata": {"name": "c"}, "status": {"allocation": {"devices": {}}}}, 4.0)
    assert (claims.added, claims.bound) == ({"c": 1.0}, {"c": 3.0})
    pods = Seen()
    pods.observe({"metadata": {"name": "p"}, "status": {"allocation": {}}}, 1.0)
    pods.observe({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}, 2.0)
    assert pods.bound == {"p": 2.0}


def test_only_the_targets_contenders_run_at_1000_nodes() -> None:
    calls: list[str] = []

    class Bench:
        def minimal(self, concurrency: int) -> DraRun:
            calls.append(f"minimal {concurrency}")
            rate = 600.0 if concurrency == 32 else 400.0
            return replace(_run(rate), result=RunResult(rate, 1.0, extra={"concurrency": 32}))

        def gpuplace_dra_drain(self) -> DraRun:
            calls.append("drain")
            return _run(500)

    results = contend_ratio(Bench(), 1, lambda _: None, Budget(math.inf, print))  # type: ignore[arg-type]
    assert calls == ["minimal 32", "minimal 128", "drain", "minimal 32"]
    rows = {m.metric: m for m in measurements(WIDE, results)}
    assert rows["DRA drain / minimal claim+Binding client"].value == pytest.approx(500 / 600)
    assert {m.benchmark for m in measurements(WIDE, results)} == {"dra 1,000 nodes x 8, 800 pods"}
