"""`python -m bench.bindscale [--pods N] [--latency-ms 3] [--servers S] [--in-flight W]`:
Bindings a second from the leader's request loop, and the leader's CPU a pod.

The binder's one bind path (controller/bindsend.py `Dispatcher`: `bind_workers` Bindings in flight
from one request loop, kubeio/loop.py) against a stub apiserver of fixed latency and ample capacity:
`--servers` processes that share one port (SO_REUSEPORT), each an asyncio HTTPS server that
answers every request with 201 after `--latency-ms`, whatever it holds in flight. Every pod is
signed by the leader as the binder signs it; the decision itself is not part of the figure
(bench/placement.py measures the whole binder against a real apiserver). Reported: pods bound a
second and the leader process's CPU per pod. The stub shares the machine's cores with the leader:
on two cores its processes, not the loop, are soon the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.synchronize import Event
from pathlib import Path

from kubernetes import client as k8s_client

from bench import Measurement, below, print_tables
from controller.bindsend import binding_body
from kubeio import pki
from kubeio.client import ClientSettings, Kube, Response
from kubeio.errors import APIError
from kubeio.loop import RequestLoop, answer_error
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.requests import prepare
from placement.annotations import BindingDecision
from placement.binding import Placement
from placement.devices import GpuId
from placement.keyring import RingKey
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

NAME = "bindscale"
_CTX = multiprocessing.get_context("spawn")
_RESPONSE = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass(frozen=True, slots=True)
class Scale:
    pods: int = 6000
    latency_ms: float = 3.0
    servers: int = 2
    in_flight: int = 128  # bind_workers: Bindings in flight in all


DEFAULT = Scale()
SMALL = Scale(pods=1500)


# -- the stub apiserver ---------------------------------------------------------------------------
async def _connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            await asyncio.sleep(latency)
            writer.write(_RESPONSE)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


def _stub(port: int, cert: str, key: str, latency: float, ready: Event) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)

    async def main() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.start_server(
            lambda r, w: _connection(r, w, latency), sock=sock, ssl=tls, backlog=1024
        )
        ready.set()
        await server.serve_forever()

    asyncio.run(main())


class Stub:
    """The stub apiserver's processes, and a client connection to them."""

    def __init__(self, servers: int, latency: float, workdir: Path) -> None:
        ca = pki.self_signed_ca("bindscale-ca", timedelta(days=1))
        leaf = pki.issue(
            ca,
            "bindscale",
            usage=pki.SERVER_AUTH,
            validity=timedelta(days=1),
            ip_addresses=["127.0.0.1"],
        )
        (workdir / "ca.crt").write_bytes(ca.cert_pem)
        leaf.write(workdir / "tls.crt", workdir / "tls.key")
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        self._procs = []
        for _ in range(servers):
            ready = _CTX.Event()
            proc = _CTX.Process(
                target=_stub,
                args=(
                    self.port,
                    str(workdir / "tls.crt"),
                    str(workdir / "tls.key"),
                    latency,
                    ready,
                ),
                daemon=True,
            )
            proc.start()
            if not ready.wait(60):
                raise RuntimeError("the stub apiserver did not start")
            self._procs.append(proc)
        probe.close()
        self.ca_file = str(workdir / "ca.crt")

    def client(self, in_flight: int) -> Kube:
        configuration = k8s_client.Configuration()
        configuration.host = f"https://127.0.0.1:{self.port}"
        configuration.ssl_ca_cert = self.ca_file
        return Kube(configuration, ClientSettings(qps_pool=max(64, in_flight * 2)))

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.join()


# -- the bind path --------------------------------------------------------------------------------
def _pods(count: int, run: int) -> list[tuple[Pod, Placement]]:
    out = []
    for i in range(count):
        name = f"web-{run}-{i}"
        pod = Pod.of({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}})
        decision = BindingDecision(
            MapKey("ml", "llm"),
            i,
            NodeName(f"gpu-{i % 200}"),
            (GpuUuid(f"GPU-{i:08d}-0"), GpuUuid(f"GPU-{i:08d}-1")),
            "0,1",
            1,
        )
        gpus = tuple(GpuId(uuid) for uuid in decision.devices)
        slot = SlotKey(MapKey("ml", "llm"), i)
        out.append((pod, Placement(slot, decision, Sharing.EXCLUSIVE, gpus)))
    return out


class _Count:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.lock = threading.Lock()
        self.all = threading.Event()

    def one(self, error: APIError | None) -> None:
        with self.lock:
            self.done += 1
            self.failed += error is not None
            if self.done >= self.total:
                self.all.set()


def measure(stub: Stub, scale: Scale, run: int) -> tuple[float, float]:
    """(pods a second, the leader's CPU seconds a pod) for one drain of `scale.pods` Bindings
    from one request loop, after a warm-up that opens its connections."""
    signer = RingKey(b"k" * 32, "2026-01-01T00:00:00Z")
    kube = stub.client(scale.in_flight)
    loop = RequestLoop(kube, scale.in_flight, name="bind-loop")

    def answered(count: _Count) -> Callable[[Response | APIError], None]:
        def one(answer: Response | APIError) -> None:
            count.one(answer_error(answer))

        return one

    def send(pods: list[tuple[Pod, Placement]], count: _Count) -> None:
        for pod, placement in pods:
            body = binding_body(pod, placement, signer)
            request = prepare("POST", PODS.item(pod.name, pod.namespace, "binding"), body=body)
            loop.submit(request, answered(count), lambda: True)

    try:
        warm = _Count(scale.in_flight * 2)
        send(_pods(warm.total, -run - 1), warm)
        if not warm.all.wait(120):
            raise RuntimeError("warm-up Bindings did not complete")
        pods = _pods(scale.pods, run)
        count = _Count(len(pods))
        cpu, started = time.process_time(), time.perf_counter()
        send(pods, count)
        if not count.all.wait(600):
            raise RuntimeError(f"{count.done} of {count.total} Bindings completed")
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        if count.failed or warm.failed:
            raise RuntimeError(f"{count.failed + warm.failed} Bindings failed")
    finally:
        loop.close()
        kube.close()
    return len(pods) / elapsed, cpu / len(pods)


def bench(scale: Scale, repeats: int, log: Callable[[str], None]) -> list[Measurement]:
    rates: list[float] = []
    cpus: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bindscale-") as tmp:
        stub = Stub(scale.servers, scale.latency_ms / 1000, Path(tmp))
        try:
            for run in range(repeats):
                rate, cpu = measure(stub, scale, run)
                rates.append(rate)
                cpus.append(cpu * 1e6)
                log(f"request loop: {rate:,.0f} pods/s, leader CPU a pod {cpu * 1e6:.0f} us")
        finally:
            stub.close()
    return [
        below(NAME, "request loop", rates, "pods/s"),
        below(NAME, "leader CPU per pod", cpus, "us", detail=True),
    ]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """For `python -m bench`: one repeat (`python -m bench.bindscale --repeats N` for more)."""
    return bench(SMALL if small else DEFAULT, min(repeats, 1), _stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bindscale", description=__doc__)
    parser.add_argument("--pods", type=int, default=DEFAULT.pods)
    parser.add_argument("--latency-ms", type=float, default=DEFAULT.latency_ms)
    parser.add_argument("--servers", type=int, default=DEFAULT.servers, help="stub processes")
    parser.add_argument("--in-flight", type=int, default=DEFAULT.in_flight)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    if args.pods < 1 or args.servers < 1 or args.in_flight < 1:
        parser.error("--pods, --servers and --in-flight must be at least 1")
    scale = Scale(args.pods, args.latency_ms, args.servers, args.in_flight)
    print_tables(bench(scale, args.repeats, _stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
