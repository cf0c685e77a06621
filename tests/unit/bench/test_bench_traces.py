"""The bench's OTLP receiver (its own process) over real gRPC on loopback, and the traceparents
the bench sends."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from bench._traces import ETCD_SPAN, WEBHOOK_SPAN, SpanSink, trace_id, traceparent


def export(endpoint: str, *spans: trace_pb2.Span) -> None:
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=list(spans))])
        ]
    )
    with grpc.insecure_channel(endpoint) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Export(request, timeout=10)


def span(name: str, pod: str, start_ns: int, end_ns: int) -> trace_pb2.Span:
    webhook = common_pb2.KeyValue(
        key="webhook", value=common_pb2.AnyValue(string_value="pods.gpuplace.io")
    )
    return trace_pb2.Span(
        name=name,
        trace_id=trace_id(pod),
        span_id=b"\x01" * 8,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns,
        attributes=[webhook],
    )


@pytest.fixture
def receiving(tmp_path: Path) -> Iterator[tuple[SpanSink, str]]:
    """A started receiver (its own process) and the endpoint to export to."""
    sink = SpanSink(tmp_path)
    endpoint = sink.start()
    try:
        yield sink, endpoint
    finally:
        sink.stop()


def test_a_traceparent_is_sampled_w3c_and_names_the_objects_trace() -> None:
    parent = traceparent("web-3")
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", parent)
    assert parent.split("-")[1] == trace_id("web-3").hex()
    assert trace_id("web-3") != trace_id("web-4")


def test_take_returns_the_named_spans_of_the_traces_once_all_arrived(
    receiving: tuple[SpanSink, str],
) -> None:
    sink, endpoint = receiving
    export(endpoint, span(WEBHOOK_SPAN, "a", 1_000_000, 4_000_000))
    # The second trace's span arrives in a later export, while `take` waits for it.
    late = threading.Timer(
        0.3,
        export,
        (
            endpoint,
            span(WEBHOOK_SPAN, "b", 0, 9_000_000),
            span("POST /api/v1/namespaces/{:namespace}/pods", "b", 0, 20_000_000),
            span(WEBHOOK_SPAN, "other", 0, 1),
        ),
    )
    late.start()
    taken = sink.take([WEBHOOK_SPAN], [trace_id("a"), trace_id("b")], timeout=10)[WEBHOOK_SPAN]
    late.join()
    assert sorted(s.seconds for s in taken) == [0.003, 0.009]
    assert {s.attribute("webhook") for s in taken} == {"pods.gpuplace.io"}
    assert sink.names() == {WEBHOOK_SPAN}  # only the other trace's span stays
    assert sink.take([WEBHOOK_SPAN], [trace_id("b")], timeout=0) == {WEBHOOK_SPAN: []}


def test_take_gives_what_arrived_when_a_trace_never_does(receiving: tuple[SpanSink, str]) -> None:
    sink, endpoint = receiving
    export(endpoint, span(WEBHOOK_SPAN, "a", 0, 2_000_000))
    taken = sink.take([WEBHOOK_SPAN], [trace_id("a"), trace_id("lost")], timeout=0.2)
    assert [s.seconds for s in taken[WEBHOOK_SPAN]] == [0.002]


def test_take_waits_until_every_trace_has_every_named_span(
    receiving: tuple[SpanSink, str],
) -> None:
    sink, endpoint = receiving
    # The webhook call is exported first; the same create's etcd write only in a later batch.
    export(endpoint, span(WEBHOOK_SPAN, "a", 0, 2_000_000))
    late = threading.Timer(0.5, export, (endpoint, span(ETCD_SPAN, "a", 3_000_000, 8_000_000)))
    late.start()
    taken = sink.take([WEBHOOK_SPAN, ETCD_SPAN], [trace_id("a")], timeout=10)
    late.join()
    assert {name: [s.seconds for s in spans] for name, spans in taken.items()} == {
        WEBHOOK_SPAN: [0.002],
        ETCD_SPAN: [0.005],
    }
    assert sink.names() == set()
