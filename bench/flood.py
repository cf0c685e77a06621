"""`python -m bench.flood [--server gpuplace|granian|gunicorn] [--bodies N] [--idle N] [--hold S]
[--port P --ca FILE --pid PID]`: floods a webhook on 127.0.0.1 and prints what it held and how pod
admissions fared meanwhile.

Without `--port` it starts the webhook's app with a static model and a CA made for the run, served
by `--server`: `gpuplace` (the default) the webhook's own server (`https_server`, default bounds)
in a process of its own; `granian` or `gunicorn` a candidate server (`bench._candidates`: its
command line, one worker process, the app factory `static_app`) with the same certificate, once it
answers /readyz. The flood, loopback only and bounded in time:
1. `--bodies` connections (300) each send the head of a POST with a body of the server's largest
   size (3 MiB) and all of it but one byte, then wait;
2. `--idle` connections (3,000) complete a TLS handshake and send nothing;
3. both are held `--hold` seconds (10), then closed.
Throughout, a client sends one pod's AdmissionReview to /mutate every 0.2 s on a new connection
(as the apiserver opens connections under load). The table: the server flooded; its RSS (summed
over its process and their children: a candidate's workers) before, at its peak during and after
the flood; the refusals it counted (`gpuplace_webhook_refused_total`, gpuplace's own server's:
"n/a" for a candidate); whether it answers /readyz after; the admissions answered and their
latency. A candidate is stopped at the end, killed if it does not stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event
from pathlib import Path

from flask import Flask

from bench._candidates import (
    ENGINES,
    READY_DIR_ENV,
    CandidateError,
    CandidateServer,
    missing,
    process_environment,
)
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
#: The servers `--server` floods: the webhook's own and the candidates.
SERVERS = ("gpuplace", *ENGINES)
#: The app factory a candidate serves.
STATIC_APP = "bench.flood:static_app"


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


def _settings() -> WebhookSettings:
    return WebhookSettings(server=ServerSettings(host=HOST, port=0, shutdown_delay_seconds=0))


def static_app() -> Flask:
    """The app `_serve` serves, made in a candidate server's process (`--server granian` or
    `gunicorn`), which it notes in `READY_DIR_ENV` (as `bench._candidate_app` does)."""
    app = create_app(_settings(), StaticModel(model()))
    (Path(os.environ[READY_DIR_ENV]) / f"ready-{os.getpid()}").touch()
    return app


def _serve(port_out: multiprocessing.Queue[int], ca_file: str, stop: Event) -> None:
    """The webhook's server with its default bounds, in this (spawned) process."""
    ca = generate_ca("flood-ca", timedelta(days=1))
    Path(ca_file).write_bytes(ca.cert_pem)
    settings = _settings()
    app = create_app(settings, StaticModel(model()))
    tls = ServingTLS(issue_serving(ca, ["localhost"], [HOST], timedelta(days=1)))
    server = https_server(app, tls, settings.server).start()
    port_out.put(server.port)
    stop.wait()
    server.stop()
    tls.close()


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a candidate's worker processes), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def rss_mib(pid: int) -> float:
    """The RSS of `pid` and its descendants, summed (pages they share count in each)."""
    total = 0
    for each in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


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


def _source(source: str | None) -> tuple[str, int] | None:
    """The local address a flood's connections leave from: the one the route picks (None), or
    `source`, so that the server counts them as a client of their own."""
    return None if source is None else (source, 0)


async def open_body(
    port: int, context: ssl.SSLContext, size: int, host: str = HOST, source: str | None = None
) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, local_addr=_source(source)),
            timeout=10,
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
    port: int, context: ssl.SSLContext, host: str = HOST, source: str | None = None
) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, local_addr=_source(source)),
            timeout=10,
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


def answers(port: int, context: ssl.SSLContext, path: str = "/readyz", host: str = HOST) -> str:
    """How the server answers `path`: its status, or the error."""
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return f"{response.status}"
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def counted_refusals(server: str, port: int, context: ssl.SSLContext) -> list[tuple[str, str]]:
    """The table's rows of refusals: gpuplace's server's, read from its /metrics."""
    if server != "gpuplace":
        return [("refused", "n/a (a metric of gpuplace's own server)")]
    try:
        counted = refusals(port, context)
    except (OSError, http.client.HTTPException) as exc:
        return [("refused", f"unknown (/metrics: {type(exc).__name__})")]
    rows = [(f"refused: {k}", f"{v:.0f}") for k, v in sorted(counted.items()) if v]
    return rows or [("refused", "0")]


def described(args: argparse.Namespace) -> str:
    """The server flooded, as the table names it."""
    if args.port:
        return f"{args.server} on 127.0.0.1:{args.port}"
    if args.server == "gpuplace":
        return "gpuplace (its own server, 1 process)"
    return f"{args.server} (the same app, 1 worker process)"


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
    readyz = answers(port, context)
    lat = sorted(admitted.latencies)
    rows = [
        ("server flooded", described(args)),
        ("bodies held open (of sent)", f"{sum(w is not None for w in bodies)} of {args.bodies}"),
        ("idle connections opened (of sent)", f"{sum(w is not None for w in idle)} of {args.idle}"),
        ("seconds to open the flood", f"{opened:.1f}"),
        ("RSS before, MiB", f"{before:.0f}"),
        ("RSS peak during, MiB", f"{peak[0]:.0f}"),
        ("RSS 3 s after, MiB", f"{after:.0f}"),
        *counted_refusals(args.server, port, context),
        ("/readyz 3 s after", readyz),
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


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server",
        choices=SERVERS,
        default="gpuplace",
        help="the server of the webhook's app to flood (with --port: the one listening there)",
    )
    parser.add_argument("--bodies", type=int, default=300)
    parser.add_argument("--body-bytes", type=int, default=3 * MiB)
    parser.add_argument("--idle", type=int, default=3000)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--port", type=int, help="a webhook already running on 127.0.0.1")
    parser.add_argument("--ca", help="with --port: the CA its certificate is issued by")
    parser.add_argument("--pid", type=int, help="with --port: its process, for the RSS")
    args = parser.parse_args(argv)
    if args.port and not (args.ca and args.pid):
        parser.error("--port needs --ca and --pid")
    if not args.port and args.server != "gpuplace" and (reason := missing(args.server)):
        parser.error(reason)
    return args


def candidate(engine: str, workdir: Path) -> CandidateServer:
    """`engine` serving `static_app` with a certificate issued for the run (its CA in
    `workdir`/ca.pem), once it answers /readyz (a context manager that stops it)."""
    ca = generate_ca("flood-ca", timedelta(days=1))
    serving = issue_serving(ca, ["localhost"], [HOST], timedelta(days=1))
    paths = workdir / "tls.crt", workdir / "tls.key", workdir / "ca.pem"
    for path, pem in zip(paths, (serving.cert_pem, serving.key_pem, ca.cert_pem), strict=True):
        path.write_bytes(pem)
    server = CandidateServer(
        engine, workdir, paths, process_environment(workdir / "ready"), app=STATIC_APP
    )
    try:
        server.wait_ready(maps=1)
    except BaseException:
        server.stop()
        raise
    return server


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with contextlib.ExitStack() as stack:
        if args.port:
            port, ca_file, pid = args.port, args.ca, args.pid
        elif args.server != "gpuplace":
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            try:
                server = stack.enter_context(candidate(args.server, workdir))
            except CandidateError as exc:
                print(exc, file=sys.stderr)
                return 1
            port, ca_file, pid = server.port, str(workdir / "ca.pem"), server.pid
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
