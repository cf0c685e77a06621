"""`python -m bench.httpcodec [--messages N]`: the CPU of HTTP/1.1 framing, per message, on the two
paths where gpuplace speaks HTTP most: the request loop reading the apiserver's answer to a Binding
(kubeio/loop.py) and the server reading an AdmissionReview and framing its answer
(kubeio/serverconn.py, kubeio/http11.py).

Rows: `gpuplace`, the functions the product calls (`kubeio.http11`); `h11` and `httptools`, each
library used as its documentation shows, on the same bytes (h11 also frames what it sends: its
connection will not read the next message otherwise). One thread, no sockets: the figure is the
codec's, not the kernel's. Reported: microseconds a message (the best of `--repeats` runs of
`--messages` messages each).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import h11
import httptools

from bench import Measurement, below, print_tables
from kubeio.http11 import ResponseReader, encode, parse_head

NAME = "httpcodec"
MESSAGES = 20_000

_STATUS = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}\n'
#: What kube-apiserver 1.35 answers to a pod's Binding (its headers as sent, the Status body).
BINDING_ANSWER = (
    b"HTTP/1.1 201 Created\r\n"
    b"Audit-Id: 1f0d3c52-8a59-4f0e-9d64-0c6d1c3a8e11\r\n"
    b"Cache-Control: no-cache, private\r\n"
    b"Content-Type: application/json\r\n"
    b"X-Kubernetes-Pf-Flowschema-Uid: 6f2c1f7e-8c43-4a5d-9a3b-3c1b2c7d1e55\r\n"
    b"X-Kubernetes-Pf-Prioritylevel-Uid: 0c9e8e4a-2b7d-4c1f-8e2a-7a9d4d3b2f10\r\n"
    b"Date: Sat, 28 Nov 2026 10:00:00 GMT\r\n"
    b"Content-Length: " + str(len(_STATUS)).encode() + b"\r\n\r\n" + _STATUS
)
#: A pod's AdmissionReview as kube-apiserver posts it to /mutate (the body's size is a typical
#: pod's), and the answer's headers.
_REVIEW = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":' + (
    b'{"uid":"0","object":{"pad":"' + b"x" * 3000 + b'"}}}'
)
ADMISSION = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\n"
    b"Host: gpuplace-webhook.gpuplace-system.svc:443\r\n"
    b"User-Agent: kube-apiserver-admission\r\n"
    b"Content-Length: " + str(len(_REVIEW)).encode() + b"\r\n"
    b"Accept: application/json, */*\r\n"
    b"Content-Type: application/json\r\n"
    b"Accept-Encoding: gzip\r\n\r\n" + _REVIEW
)
_ANSWER_HEADERS = [("Content-Type", "application/json")]
_ANSWER_BODY = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{}}'


def _gpuplace_client(n: int) -> None:
    reader = ResponseReader()  # one a connection, kept alive
    for _ in range(n):
        reader.expect()
        if not reader.feed(BINDING_ANSWER) or reader.status != 201:
            raise AssertionError("gpuplace: no answer")


def _gpuplace_server(n: int) -> None:
    for _ in range(n):
        buf = bytearray(ADMISSION)
        head = parse_head(buf, 1 << 22)
        assert head is not None
        body = bytes(buf[head.size : head.size + head.length])
        if len(body) != len(_REVIEW):
            raise AssertionError("gpuplace: short body")
        encode("200 OK", _ANSWER_HEADERS, _ANSWER_BODY, close=not head.keep_alive)


class _Collect:
    """httptools' callbacks: the head's parts and the body."""

    __slots__ = ("body", "done", "headers", "url")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.url = b""
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


def _httptools_client(n: int) -> None:
    for _ in range(n):
        got = _Collect()
        parser = httptools.HttpResponseParser(got)
        parser.feed_data(BINDING_ANSWER)
        if not got.done or parser.get_status_code() != 201:
            raise AssertionError("httptools: no answer")


def _httptools_server(n: int) -> None:
    for _ in range(n):
        got = _Collect()
        parser = httptools.HttpRequestParser(got)
        parser.feed_data(ADMISSION)
        if not got.done or len(got.body) != len(_REVIEW):
            raise AssertionError("httptools: no request")
        encode("200 OK", _ANSWER_HEADERS, _ANSWER_BODY, close=not parser.should_keep_alive())


def _h11_client(n: int) -> None:
    request = h11.Request(
        method="POST", target="/b", headers=[("Host", "k"), ("Content-Length", "0")]
    )
    for _ in range(n):
        conn = h11.Connection(h11.CLIENT)
        conn.send(request)
        conn.send(h11.EndOfMessage())
        conn.receive_data(BINDING_ANSWER)
        event = conn.next_event()
        body = bytearray()
        while not isinstance(event, h11.EndOfMessage):
            if isinstance(event, h11.Data):
                body += event.data
            elif event is h11.NEED_DATA:
                raise AssertionError("h11: no answer")
            event = conn.next_event()


def _h11_server(n: int) -> None:
    answer = h11.Response(
        status_code=200,
        headers=[*_ANSWER_HEADERS, ("Content-Length", str(len(_ANSWER_BODY)))],
    )
    for _ in range(n):
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        conn.receive_data(ADMISSION)
        body = bytearray()
        event = conn.next_event()
        while not isinstance(event, h11.EndOfMessage):
            if isinstance(event, h11.Data):
                body += event.data
            elif event is h11.NEED_DATA:
                raise AssertionError("h11: no request")
            event = conn.next_event()
        conn.send(answer)
        conn.send(h11.Data(data=_ANSWER_BODY))
        conn.send(h11.EndOfMessage())


CODECS: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {
    "gpuplace": (_gpuplace_client, _gpuplace_server),
    "h11": (_h11_client, _h11_server),
    "httptools": (_httptools_client, _httptools_server),
}


def _per_message_us(work: Callable[[int], None], messages: int, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        work(messages)
        samples.append((time.process_time() - start) / messages * 1e6)
    return samples


def run(repeats: int, small: bool = False, messages: int = MESSAGES) -> list[Measurement]:
    messages = messages // 10 if small else messages
    out = []
    for name, (client, server) in CODECS.items():
        for path, work in (("Binding answer read", client), ("admission read+framed", server)):
            samples = _per_message_us(work, messages, max(repeats, 1))
            out.append(below(NAME, f"{name}: {path}", [min(samples)], "µs"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.httpcodec", description=__doc__)
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print_tables(run(args.repeats, messages=args.messages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
