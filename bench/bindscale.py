"""`python -m bench.bindscale [--pods N] [--processes 1,2,4] [--latency-ms 3] [--servers S]`:
Bindings a second, from the leader's request loop, from the threads it replaced, and from worker
processes.

The binder's bind path (controller/binder.py `_send` with `bind_processes` 0, `_hand_over` and
controller/bindprocs.py with 1 or more; for reference the former `bind_processes` 0 path, a thread
per Binding in flight) against a stub apiserver of fixed latency and ample
capacity: `--servers` processes that share one port (SO_REUSEPORT), each an asyncio HTTPS server
that answers every request with 201 after `--latency-ms`, whatever it holds in flight. Every pod
is signed by the leader as the binder signs it; the decision itself is not part of the figure
(bench/placement.py measures the whole binder against a real apiserver). Reported: pods bound a
second by each path, the one-process design against the threads it replaced (target at least
1.6x: the simpler way past what one process bound), the ratio of 2 processes to 1, and the leader
process's CPU per pod (its threads included, not the workers').

The stub, the leader and the workers share the machine's cores: on two cores the processes cannot
run side by side, and once the workers cost little the stub's own processes are the limit, so the
ratio of 2 processes to 1 says more on a machine with a core for each of them.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
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

from bench import Measurement, above, below, print_tables
from controller.binder import binding_body
from controller.bindprocs import BindJob, BindProcesses, KubeConnection, open_client
from controller.workers import Workers
from kubeio import pki
from kubeio.client import ClientSettings, Response
from kubeio.errors import APIError
from kubeio.loop import RequestLoop, answer_error
from kubeio.paths import PODS
from kubeio.pod import Pod
from kubeio.requests import prepare
from placement.annotations import BindingDecision, signed_binding
from placement.binding import Placement
from placement.devices import GpuId
from placement.keyring import RingKey
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

NAME = "bindscale"
#: The reference path in `measure`: one process, a thread per Binding in flight.
THREADS = -1
#: What the one-process design must bind against the threads it replaced.
TARGET = 1.6
_CTX = multiprocessing.get_context("spawn")
_RESPONSE = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass(frozen=True, slots=True)
class Scale:
    pods: int = 6000
    processes: tuple[int, ...] = (1, 2)
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
        self.connection = KubeConnection(
            ClientSettings(), f"https://127.0.0.1:{self.port}", ca_file=str(workdir / "ca.crt")
        )

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.join()


# -- the two bind paths ---------------------------------------------------------------------------
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


Sender = Callable[[list[tuple[Pod, Placement]], _Count], None]
Path_ = tuple[Sender, Callable[[], None], list[int]]  # send, close, the worker processes' ids


def _cpu_seconds(pids: list[int]) -> float:
    """User and system CPU of the processes so far (Linux: /proc/<pid>/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _threads(connection: KubeConnection, scale: Scale, signer: RingKey) -> Path_:
    """For reference, the binder's former path with `bind_processes` 0: `bind_workers` threads,
    each sending its Binding with `Kube.send` and waiting for the answer."""
    kube = open_client(connection, scale.in_flight)
    workers = Workers(scale.in_flight, "bind")

    def bind(pod: Pod, placement: Placement, count: _Count) -> None:
        path = PODS.item(pod.name, pod.namespace, "binding")
        try:
            kube.create(path, binding_body(pod, placement, signer), guard=lambda: True)
        except APIError as exc:
            count.one(exc)
            return
        count.one(None)

    def send(pods: list[tuple[Pod, Placement]], count: _Count) -> None:
        for pod, placement in pods:
            workers.submit(bind, pod, placement, count)

    def close() -> None:
        workers.shutdown()
        kube.close()

    return send, close, []


def _loop(connection: KubeConnection, scale: Scale, signer: RingKey) -> Path_:
    """`bind_processes` 0: the binder's `_send`, `bind_workers` Bindings in flight from one
    request loop of this process (kubeio/loop.py)."""
    kube = open_client(connection, scale.in_flight)
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

    def close() -> None:
        loop.close()
        kube.close()

    return send, close, []


def _processes(connection: KubeConnection, scale: Scale, processes: int, signer: RingKey) -> Path_:
    """`bind_processes` N: the binder's `_hand_over` (signed here) to N worker processes."""
    pool = BindProcesses(connection, processes, max(1, -(-scale.in_flight // processes)))

    def send(pods: list[tuple[Pod, Placement]], count: _Count) -> None:
        for pod, placement in pods:
            annotations = signed_binding(
                signer.secret, signer.id, pod.uid, pod.namespace, placement.decision
            )
            job = BindJob(
                math.inf, pod.name, pod.namespace, pod.uid, placement.decision.node, annotations
            )
            pool.submit(job, count.one)

    return send, pool.close, [pid for pid in pool.pids() if pid is not None]


def measure(stub: Stub, scale: Scale, processes: int, run: int) -> tuple[float, float, float]:
    """(pods a second, leader and worker processes' CPU seconds a pod) for one drain of
    `scale.pods` Bindings, after a warm-up that opens the connections (and starts the processes)."""
    signer = RingKey(b"k" * 32, "2026-01-01T00:00:00Z")
    if processes == THREADS:
        send, close, pids = _threads(stub.connection, scale, signer)
    elif processes == 0:
        send, close, pids = _loop(stub.connection, scale, signer)
    else:
        send, close, pids = _processes(stub.connection, scale, processes, signer)
    try:
        warm = _Count(scale.in_flight * 2)
        send(_pods(warm.total, -run - 1), warm)
        if not warm.all.wait(120):
            raise RuntimeError("warm-up Bindings did not complete")
        pods = _pods(scale.pods, run)
        count = _Count(len(pods))
        cpu, started = time.process_time(), time.perf_counter()
        workers = _cpu_seconds(pids)
        send(pods, count)
        if not count.all.wait(600):
            raise RuntimeError(f"{count.done} of {count.total} Bindings completed")
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        workers = _cpu_seconds(pids) - workers
        if count.failed or warm.failed:
            raise RuntimeError(f"{count.failed + warm.failed} Bindings failed")
    finally:
        close()
    return len(pods) / elapsed, cpu / len(pods), workers / len(pods)


def bench(scale: Scale, repeats: int, log: Callable[[str], None]) -> list[Measurement]:
    rates: dict[int, list[float]] = {}
    cpus: dict[int, list[float]] = {}
    worker_cpus: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bindscale-") as tmp:
        stub = Stub(scale.servers, scale.latency_ms / 1000, Path(tmp))
        try:
            for run in range(repeats):
                for procs in (THREADS, 0, *scale.processes):
                    rate, cpu, workers = measure(stub, scale, procs, run * 100 + procs)
                    rates.setdefault(procs, []).append(rate)
                    cpus.setdefault(procs, []).append(cpu * 1e6)
                    worker_cpus.setdefault(procs, []).append(workers * 1e6)
                    log(
                        f"{_label(procs)}: {rate:,.0f} pods/s, CPU a pod: leader "
                        f"{cpu * 1e6:.0f} us, worker processes {workers * 1e6:.0f} us"
                    )
        finally:
            stub.close()
    paths = (THREADS, 0, *scale.processes)
    figures = [below(NAME, _label(p), rates[p], "pods/s") for p in paths]
    # The one-process design against the threads it replaced: the simpler way past one
    # process's limit, where it gets there (TARGET); the processes' scaling beside it.
    ratios = [loop / threads for threads, loop in zip(rates[THREADS], rates[0], strict=True)]
    figures.append(above(NAME, "one process: request loop / threads", ratios, "x", TARGET))
    if 1 in rates and 2 in rates:
        ratios = [two / one for one, two in zip(rates[1], rates[2], strict=True)]
        figures.append(below(NAME, "bind processes 2 / 1", ratios, "x"))
    figures += [
        below(NAME, f"leader CPU per pod, {_label(p)}", cpus[p], "us", detail=True) for p in paths
    ]
    figures += [
        below(
            NAME, f"worker processes' CPU per pod, {_label(p)}", worker_cpus[p], "us", detail=True
        )
        for p in scale.processes
    ]
    return figures


def _label(processes: int) -> str:
    if processes == THREADS:
        return "bind processes 0, threads (the former path)"
    return "bind processes 0 (request loop)" if processes == 0 else f"bind processes {processes}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """For `python -m bench`: one repeat (`python -m bench.bindscale --repeats N` for more)."""
    return bench(SMALL if small else DEFAULT, min(repeats, 1), _stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bindscale", description=__doc__)
    parser.add_argument("--pods", type=int, default=DEFAULT.pods)
    parser.add_argument(
        "--processes", default=",".join(map(str, DEFAULT.processes)), help="e.g. 1,2,4"
    )
    parser.add_argument("--latency-ms", type=float, default=DEFAULT.latency_ms)
    parser.add_argument("--servers", type=int, default=DEFAULT.servers, help="stub processes")
    parser.add_argument("--in-flight", type=int, default=DEFAULT.in_flight)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        processes = tuple(int(p) for p in args.processes.split(",") if p.strip())
    except ValueError:
        parser.error(f"--processes: a comma-separated list of counts, not {args.processes!r}")
    if any(p < 1 for p in processes) or args.pods < 1 or args.servers < 1 or args.in_flight < 1:
        parser.error("--pods, --servers, --in-flight and each of --processes must be at least 1")
    scale = Scale(args.pods, processes, args.latency_ms, args.servers, args.in_flight)
    print_tables(bench(scale, args.repeats, _stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
