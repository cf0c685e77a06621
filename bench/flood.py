"""`python -m bench.flood [--bodies N] [--idle N] [--hold S] [--port P --ca FILE --pid PID]`: floods
a webhook on 127.0.0.1 and prints what it held and how pod admissions fared meanwhile.

Without `--port` it starts the webhook's own server (the product's app and `https_server`, default
bounds, a static model, a CA made for the run) in a process of its own. The flood, loopback only
and bounded in time:
1. `--bodies` connections (300) each send the head of a POST with a body of the server's largest
   size (3 MiB) and all of it but one byte, then wait;
2. `--idle` connections (3,000) complete a TLS handshake and send nothing;
3. both are held `--hold` seconds (10), then closed.
Throughout, a client sends one pod's AdmissionReview to /mutate every 0.2 s on a new connection
(as the apiserver opens connections under load). The table: the server's RSS before, at its peak
during and after the flood; the refusals it counted (`gpuplace_webhook_refused_total`); the
admissions answered and their latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import ssl
import tempfile
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event
from pathlib import Path

from bench._kube import admission_review
from bench._stats import percentile
from placement.annotations import MAP_LABEL
from placement.devices import DeclaredDevices
from placement.model import CompiledMap, CompiledSlot, Model
from placement.types import GpuUuid, MapKey, NodeName
from webhook.app import create_app
from webhook.certs import generate_ca, issue_serving
from webhook.modelcache import StaticModel
from webhook.server import https_server
from webhook.settings import ServerSettings, WebhookSettings
from webhook.tls import ServingTLS

HOST = "127.0.0.1"
MiB = 1024 * 1024
NAMESPACE, MAP = "bench", "llm"


def model() -> Model:
    """One map with one slot: the pods the admissions send are placed."""
    key = MapKey(NAMESPACE, MAP)
    slot = CompiledSlot(
        index=0,
        node=NodeName("gpu-node-00"),
        devices=(GpuUuid("GPU-00000000-0000-0000-0000-000000000000"),),
        device_indices=(0,),
        declared=DeclaredDevices((0,)),
    )
    return Model(1, {key: CompiledMap(key, {0: slot}, generation=1)})


def review_body() -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": NAMESPACE, "labels": {MAP_LABEL: MAP}},
        "spec": {"containers": [{"name": "main", "image": "registry.local/app:1"}]},
    }
    return json.dumps(admission_review("Pod", "pods", pod, uid="flood-0")).encode()


@dataclass
class Admissions:
    """Pod admissions sent during the flood: latencies of those answered, errors of the rest."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _serve(port_out: multiprocessing.Queue[int], ca_file: str, stop: Event) -> None:
    """The webhook's server with its default bounds, in this (spawned) process."""
    ca = generate_ca("flood-ca", timedelta(days=1))
    Path(ca_file).write_bytes(ca.cert_pem)
    settings = WebhookSettings(server=ServerSettings(host=HOST, port=0, shutdown_delay_seconds=0))
    app = create_app(settings, StaticModel(model()))
    tls = ServingTLS(issue_serving(ca, ["localhost"], [HOST], timedelta(days=1)))
    server = https_server(app, tls, settings.server).start()
    port_out.put(server.port)
    stop.wait()
    server.stop()
    tls.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def admit(port: int, context: ssl.SSLContext, body: bytes, into: Admissions) -> None:
    started = time.perf_counter()
    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=10)
    try:
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            into.errors.append(f"status {response.status}")
            return
        into.latencies.append(time.perf_counter() - started)
    except (OSError, http.client.HTTPException) as exc:
        into.errors.append(type(exc).__name__)
    finally:
        conn.close()


def admissions(
    port: int, context: ssl.SSLContext, stop: threading.Event
) -> tuple[Admissions, threading.Thread]:
    """Sends an admission every 0.2 s on a new connection until `stop`, from a thread."""
    into = Admissions()
    body = review_body()

    def run() -> None:
        while not stop.wait(0.2):
            admit(port, context, body, into)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return into, thread


async def open_body(
    port: int, context: ssl.SSLContext, size: int, host: str = HOST
) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context), timeout=10
        )
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % size
        )
        chunk = b"x" * 65536
        left = size - 1
        while left > 0:
            writer.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
            await asyncio.wait_for(writer.drain(), timeout=5)
        return writer
    except (OSError, TimeoutError, ssl.SSLError):
        return None


async def open_idle(
    port: int, context: ssl.SSLContext, host: str = HOST
) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context), timeout=10
        )
        return writer
    except (OSError, TimeoutError, ssl.SSLError):
        return None


Opening = Coroutine[None, None, asyncio.StreamWriter | None]


async def in_batches(make: Sequence[Opening], batch: int) -> list[asyncio.StreamWriter | None]:
    """Opens `batch` connections at a time (a handshake each), all of them in the end."""
    opened: list[asyncio.StreamWriter | None] = []
    for start in range(0, len(make), batch):
        opened += await asyncio.gather(*make[start : start + batch])
    return opened


def refusals(port: int, context: ssl.SSLContext, host: str = HOST) -> dict[str, float]:
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    counted: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuplace_webhook_refused_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counted[reason] = float(line.rsplit(" ", 1)[1])
    return counted


async def flood(args: argparse.Namespace, port: int, context: ssl.SSLContext, pid: int) -> None:
    peak = [rss_mib(pid)]
    before = peak[0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stop = threading.Event()
    admitted, admitting = admissions(port, context, stop)
    started = time.monotonic()
    bodies = await in_batches(
        [open_body(port, context, args.body_bytes) for _ in range(args.bodies)], 100
    )
    idle = await in_batches([open_idle(port, context) for _ in range(args.idle)], 500)
    opened = time.monotonic() - started
    await asyncio.sleep(args.hold)
    for writer in [*bodies, *idle]:
        if writer is not None:
            writer.transport.abort()
    stop.set()
    admitting.join(20)
    await asyncio.sleep(3)
    done.set()
    after = rss_mib(pid)
    counted = refusals(port, context)
    lat = sorted(admitted.latencies)
    rows = [
        ("bodies held open (of sent)", f"{sum(w is not None for w in bodies)} of {args.bodies}"),
        ("idle connections opened (of sent)", f"{sum(w is not None for w in idle)} of {args.idle}"),
        ("seconds to open the flood", f"{opened:.1f}"),
        ("RSS before, MiB", f"{before:.0f}"),
        ("RSS peak during, MiB", f"{peak[0]:.0f}"),
        ("RSS 3 s after, MiB", f"{after:.0f}"),
        *((f"refused: {k}", f"{v:.0f}") for k, v in sorted(counted.items()) if v),
        ("admissions answered / failed", f"{len(lat)} / {len(admitted.errors)}"),
        ("admission latency p50 / p99 / max, ms", _latencies(lat)),
    ]
    if admitted.errors:
        rows.append(("admission failures", ", ".join(sorted(set(admitted.errors)))))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _latencies(lat: list[float]) -> str:
    if not lat:
        return "-"
    ms = [x * 1000 for x in lat]
    return f"{percentile(ms, 0.5):.1f} / {percentile(ms, 0.99):.1f} / {max(ms):.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    parser.add_argument("--bodies", type=int, default=300)
    parser.add_argument("--body-bytes", type=int, default=3 * MiB)
    parser.add_argument("--idle", type=int, default=3000)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--port", type=int, help="a webhook already running on 127.0.0.1")
    parser.add_argument("--ca", help="with --port: the CA its certificate is issued by")
    parser.add_argument("--pid", type=int, help="with --port: its process, for the RSS")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.port:
            port, ca_file, pid = args.port, args.ca, args.pid
        else:
            ctx = multiprocessing.get_context("spawn")
            ca_file = str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "ca.pem")
            ports: multiprocessing.Queue[int] = ctx.Queue()
            stop = ctx.Event()
            proc = ctx.Process(target=_serve, args=(ports, ca_file, stop), daemon=True)
            proc.start()
            stack.callback(proc.join, 20)
            stack.callback(stop.set)
            port, pid = ports.get(timeout=60), proc.pid
        context = ssl.create_default_context(cafile=ca_file)
        asyncio.run(flood(args, port, context, pid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
