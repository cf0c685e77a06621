"""The apiserver's own timing of each webhook call, from its OpenTelemetry spans.

The apiserver's webhook metric has buckets at 5, 25 and 100 ms: a p99 read from it is an
interpolation across a 20-ms bucket. Its traces time every call: the bench sends its pod creates
with a sampled W3C `traceparent` (the cluster's `trace_endpoint` makes the apiserver trust it from
an admin and sample nothing else), the apiserver exports the spans over OTLP/gRPC to `SpanSink`,
and the span "Call mutating webhook" of each create is the call as the apiserver timed it: from
sending the AdmissionReview to the patch applied (the histogram also counts building the review).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

#: The apiserver's span around one mutating webhook call (k8s.io/apiserver, mutating dispatcher).
WEBHOOK_SPAN = "Call mutating webhook"


def trace_id(name: str) -> bytes:
    """The trace of the create of the object `name` (16 bytes, never all zero)."""
    return hashlib.sha256(f"gpuplace-bench/{name}".encode()).digest()[:16]


def traceparent(name: str) -> str:
    """A sampled W3C traceparent for the create of `name`: the apiserver traces that request."""
    span = hashlib.sha256(f"gpuplace-bench-span/{name}".encode()).digest()[:8]
    return f"00-{trace_id(name).hex()}-{span.hex()}-01"


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    trace_id: bytes
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, str], ...]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def attribute(self, key: str) -> str | None:
        return next((v for k, v in self.attributes if k == key), None)


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    """The spans of one OTLP export, with their string attributes."""
    found: list[Span] = []
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(_span(span))
    return found


def _span(span: trace_pb2.Span) -> Span:
    attributes = tuple(
        (a.key, a.value.string_value) for a in span.attributes if a.value.HasField("string_value")
    )
    return Span(
        span.name,
        bytes(span.trace_id),
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        attributes,
    )


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver on loopback that keeps every span it is sent.

    Contract: gRPC's threads call `Export`; any thread may call `take`; `_lock` guards `_spans`.
    """

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> str:
        """Starts listening; returns the endpoint (`127.0.0.1:port`) for the apiserver."""
        server = grpc.server(ThreadPoolExecutor(2, thread_name_prefix="otlp"))
        # The generated registration function has no annotations (the messages have stubs).
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self, server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()

    def Export(  # noqa: N802 - the gRPC method's name
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        spans = spans_of(request)
        with self._lock:
            self._spans.extend(spans)
            self._lock.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def names(self) -> set[str]:
        """The names of the spans held now."""
        with self._lock:
            return {s.name for s in self._spans}

    def take(self, name: str, traces: Iterable[bytes], timeout: float) -> list[Span]:
        """The spans called `name` of these traces, once there is one for every trace or
        `timeout` seconds have passed (the apiserver exports in batches, every few seconds);
        every span of these traces is removed from the sink, those of other traces stay."""
        wanted = set(traces)
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = {s.trace_id for s in self._spans if s.name == name} & wanted
                left = deadline - time.monotonic()
                if found == wanted or left <= 0:
                    break
                self._lock.wait(left)
            taken = [s for s in self._spans if s.name == name and s.trace_id in wanted]
            self._spans = [s for s in self._spans if s.trace_id not in wanted]
        return taken
