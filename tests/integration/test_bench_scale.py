"""The scale tier of the benchmark, small: the agents' heartbeats as `make bench-scale` renews
them, a leader failover, and the webhook calls timed by the apiserver's traces, on a cluster of
its own (the bench starts gpuplace's processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._admissions import TRACE_WAIT
from bench._kube import call
from bench._stats import histogram_count
from bench._traces import WEBHOOK_SPAN, trace_id, traceparent
from bench._workload import NAMESPACE, Scale, gpuplace_pod, node_name
from bench.scale import ScaleBench
from kubeio.paths import LEASES, PODS
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE

SCALE = Scale(nodes=13, pods=100, gpus=8)


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[ScaleBench]:
    b = ScaleBench(SCALE, tmp_path, lambda _message: None, interval=0.5)
    b.setup()
    yield b
    b.stop()


@pytest.mark.slow
def test_every_agent_lease_is_renewed_by_the_agents_code_and_a_standby_takes_over(
    bench: ScaleBench,
) -> None:
    cluster = bench.cluster
    bench.start_heartbeats()
    seconds, rate = bench.failover()
    beats = bench.stop_heartbeats()

    # Every node's Lease was written by the heartbeat process as an agent writes it.
    status, leases = cluster.request("GET", LEASES.collection(INVENTORY_NAMESPACE))
    assert status == 200
    by_name = {lease["metadata"]["name"]: lease["spec"] for lease in leases["items"]}
    for n in range(SCALE.nodes):
        spec = by_name[node_name(n)]
        assert spec["holderIdentity"] == f"agent-{node_name(n)}"
        assert spec["leaseDurationSeconds"] == 2  # 3 intervals of 0.5 s, as agents declare
    assert beats.failures == 0
    assert beats.renewals >= SCALE.nodes  # at least one round after `ready`

    # The leader was killed; the standby holds the controller's Lease and bound the backlog.
    assert bench.controller is not None and bench.controller.name == "controller-1"
    status, lease = cluster.request("GET", LEASES.item("gpuplace-controller", MODEL_NAMESPACE))
    assert status == 200, lease
    assert lease["spec"]["holderIdentity"] == "standby-1"
    assert seconds > 0 and rate > 0
    status, pods = cluster.request("GET", PODS.collection(NAMESPACE))
    assert status == 200 and pods["items"] == []  # the run cleared its pods


@pytest.mark.slow
def test_the_apiserver_traces_time_every_webhook_call_of_the_bench_creates(
    bench: ScaleBench,
) -> None:
    admission = bench.admission_at(20, 30)
    assert admission.creates == 30
    # One span per create, the same calls the apiserver's histogram counted.
    assert len(admission.traced) == 30
    assert histogram_count(admission.apiserver) == 30
    assert all(0 < seconds < 10 for seconds in admission.traced)
    # And each create's own write to etcd, the machine's reference beside the webhook call.
    assert len(admission.etcd) == 30
    assert all(0 < seconds < 10 for seconds in admission.etcd)
    # Only the bench's creates carry a sampled traceparent: the controller's Bindings and kwok's
    # status updates, which went on meanwhile, are not traced. The apiserver exports its spans in
    # batches, in the order they ended: once the span of a traced create sent after them all has
    # arrived, any span of theirs would have too.
    barrier = gpuplace_pod(SCALE, 0, 0)
    barrier["metadata"]["name"] = "trace-barrier"
    call(
        bench.cluster,
        "POST",
        f"{PODS.collection(NAMESPACE)}?dryRun=All",
        barrier,
        wanted={201},
        headers={"traceparent": traceparent("trace-barrier")},
    )
    arrived = bench.spans.take((WEBHOOK_SPAN,), [trace_id("trace-barrier")], TRACE_WAIT)
    assert len(arrived[WEBHOOK_SPAN]) == 1
    assert not [n for n in bench.spans.names() if n.endswith(("/binding", "/status"))]


def test_the_same_steady_creates_go_through_the_reference_webhook_and_back(
    bench: ScaleBench,
) -> None:
    """The reference webhook answers every create of the block (traced like gpuplace's calls,
    which the webhook's own histogram does not count), then gpuplace's webhook serves again."""
    served = histogram_count(bench._webhook_buckets())
    admission = bench.reference_admission_at(20, 30)
    assert admission.creates == 30 and len(admission.traced) == 30
    assert histogram_count(admission.apiserver) == 30
    assert histogram_count(admission.webhook) == 0  # gpuplace's webhook saw none of them
    assert bench._pod_webhook_called()
    assert histogram_count(bench._webhook_buckets()) > served  # gpuplace's, once more
