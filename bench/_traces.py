"""The apiserver's own timing of each webhook call, from its OpenTelemetry spans.

The apiserver's webhook metric has buckets at 5, 25 and 100 ms: a p99 read from it is an
interpolation across a 20-ms bucket. Its traces time every call: the bench sends its pod creates
with a sampled W3C `traceparent` (the cluster's `trace_endpoint` makes the apiserver trust it from
an admin and sample nothing else), the apiserver exports the spans over OTLP/gRPC to
`python -m bench._traces FILE` (a process of its own: gRPC's threads do not survive the bench's
forks), which appends them to FILE as JSON lines; `SpanSink` reads them there, and the span "Call mutating webhook" of each create is the call as the apiserver timed it: from
sending the AdmissionReview to the patch applied (the histogram also counts building the review).
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from bench._proc import start_ready

#: The apiserver's span around one mutating webhook call (k8s.io/apiserver, mutating dispatcher).
WEBHOOK_SPAN = "Call mutating webhook"
#: The apiserver's span around the same create's write to etcd (k8s.io/apiserver, etcd3 store):
#: no gpuplace code runs in it, so its tail is the machine's, beside the webhook call's.
ETCD_SPAN = "Create etcd3"


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

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "trace": self.trace_id.hex(),
                "start": self.start_ns,
                "end": self.end_ns,
                "attributes": dict(self.attributes),
            }
        )

    @classmethod
    def from_json(cls, line: str) -> Span:
        data: dict[str, Any] = json.loads(line)
        attributes = tuple((str(k), str(v)) for k, v in data["attributes"].items())
        return cls(
            data["name"], bytes.fromhex(data["trace"]), data["start"], data["end"], attributes
        )


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


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The OTLP/gRPC trace service of the receiving process: each export's spans are appended to
    `out`, one JSON object a line, flushed before the export is acknowledged."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def Export(  # noqa: N802 - the gRPC method's name
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        lines = "".join(f"{span.to_json()}\n" for span in spans_of(request))
        with self._lock:
            self._out.write(lines)
            self._out.flush()
        return trace_service_pb2.ExportTraceServiceResponse()


def serve(out: IO[str]) -> grpc.Server:
    """Starts the receiver on a free loopback port (`server.port` is not kept: see `main`)."""
    server = grpc.server(ThreadPoolExecutor(2, thread_name_prefix="otlp"))
    # The generated registration function has no annotations (the messages have stubs).
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        Receiver(out), server
    )
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench._traces FILE`: prints ``ready``, then the endpoint, and appends the
    spans it is sent to FILE until SIGTERM."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m bench._traces FILE", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    with Path(args[0]).open("a", encoding="utf-8") as out:
        server = serve(out)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        print(f"ready\n127.0.0.1:{port}", flush=True)
        stop.wait()
        server.stop(grace=1).wait()
    return 0


class SpanSink:
    """The receiving process (`python -m bench._traces`) and what it has written so far.

    Contract: any thread may call `take` and `names`; `_lock` guards the spans read from the file
    and the read offset.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = directory / "spans.jsonl"
        self._file.touch()
        self._offset = 0
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        """Starts the receiving process; returns its endpoint (`127.0.0.1:port`)."""

        self._proc = start_ready([sys.executable, "-m", "bench._traces", str(self._file)], "spans")
        assert self._proc.stdout is not None
        return self._proc.stdout.readline().strip()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None

    def _read(self) -> None:
        with self._file.open(encoding="utf-8") as f:
            f.seek(self._offset)
            data = f.read()
        whole, _, _partial = data.rpartition("\n")  # a line still being written waits
        if whole:
            self._offset += len(whole.encode()) + 1
            self._spans += [Span.from_json(line) for line in whole.split("\n")]

    def names(self) -> set[str]:
        """The names of the spans received and not taken."""
        with self._lock:
            self._read()
            return {s.name for s in self._spans}

    def take(
        self, names: Collection[str], traces: Iterable[bytes], timeout: float
    ) -> dict[str, list[Span]]:
        """The spans of each of `names` of these traces, once every trace has all of them or
        `timeout` seconds have passed (the apiserver exports in batches, every few seconds);
        every span of these traces is removed, those of other traces stay."""
        wanted = set(traces)
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._read()
                complete = all(
                    {s.trace_id for s in self._spans if s.name == name} >= wanted for name in names
                )
                if complete or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
            taken = {
                name: [s for s in self._spans if s.name == name and s.trace_id in wanted]
                for name in names
            }
            self._spans = [s for s in self._spans if s.trace_id not in wanted]
        return taken


if __name__ == "__main__":
    sys.exit(main())
