"""What the placement benchmark does to the local cluster: concurrent API calls (through the
cluster's one client, `kubeio.client.Kube`), the pod watcher process, and CPU and memory readings
of the processes involved."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench._proc import BenchError, start_ready
from bench._stats import busy_seconds, cpu_seconds, status_kib
from bench._traces import traceparent
from gpuplace_dev.localcluster import LocalCluster
from kubeio import bodies
from kubeio.client import Kube
from kubeio.paths import PODS
from kubeio.requests import prepare

T = TypeVar("T")
R = TypeVar("R")
Obj = dict[str, Any]
_TICKS = os.sysconf("SC_CLK_TCK")


def concurrently(items: Sequence[T], call: Callable[[T], R], threads: int) -> list[R]:
    """`call(item)` for every item from `threads` threads (they share the cluster client's
    keep-alive connections); items are dealt round-robin, results come back in their order."""
    threads = max(1, min(threads, len(items)))
    results: list[Any] = [None] * len(items)
    start = threading.Barrier(threads)

    def worker(offset: int) -> None:
        start.wait()  # every thread is up before the first request
        for i in range(offset, len(items), threads):
            results[i] = call(items[i])

    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="bench") as pool:
        for future in [pool.submit(worker, t) for t in range(threads)]:
            future.result()
    return results


def paced(items: Sequence[T], call: Callable[[T], R], rate: float, threads: int) -> list[R]:
    """`call(item)` for every item, item i started no earlier than i / `rate` seconds after the
    first: a steady arrival rate, as a controller creating pods at that rate would (`threads`
    bound how many calls are in flight; a call later than its slot is started at once)."""
    results: list[Any] = [None] * len(items)
    counter = itertools.count()  # next() on a count is atomic under the GIL
    began = time.monotonic() + 0.05

    def worker() -> None:
        while (i := next(counter)) < len(items):
            delay = began + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            results[i] = call(items[i])

    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="paced") as pool:
        for future in [pool.submit(worker) for _ in range(threads)]:
            future.result()
    return results


def expect(status: int, body: Any, wanted: Iterable[int], what: str) -> None:
    if status not in set(wanted):
        message = body.get("message", body) if isinstance(body, dict) else body
        raise BenchError(f"{what}: HTTP {status}: {message}")


def call(
    cluster: LocalCluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    wanted: Iterable[int] = (200, 201),
    what: str = "",
    headers: Mapping[str, str] | None = None,
) -> Any:
    """One admin request that must answer one of `wanted`; returns the decoded body. A 429
    (the apiserver's priority and fairness, or gpuplace's busy map validator) is sent again
    after the wait it asks for, up to `RETRIES_ON_429` times, as client-go does."""
    for attempt in itertools.count():
        status, response = cluster.request(method, path, body, headers=headers)
        if status != 429 or attempt == RETRIES_ON_429:
            break
        time.sleep(retry_after(response))
    expect(status, response, wanted, what or f"{method} {path}")
    return response


#: How often `call` sends a request again that was answered 429 (client-go's default).
RETRIES_ON_429 = 10


def retry_after(status: Any) -> float:
    """The seconds a 429's Status asks to wait (`details.retryAfterSeconds`), else 1."""
    details = status.get("details") if isinstance(status, dict) else None
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    return float(seconds) if isinstance(seconds, int) and 0 < seconds <= 60 else 1.0


def create_pods(
    cluster: LocalCluster,
    namespace: str,
    pods: Sequence[Obj],
    threads: int,
    rate: float | None = None,
    *,
    traced: bool = False,
    answered: dict[str, float] | None = None,
) -> dict[str, float]:
    """Creates the pods from `threads` threads, as fast as they go or at a steady `rate` per
    second; returns when each create was sent (time.monotonic), and puts in `answered` when its
    answer came back. `traced`: each create carries a sampled traceparent of the pod's name
    (`bench._traces`), so the apiserver traces it."""
    path = PODS.collection(namespace)

    def create(pod: Obj) -> float:
        name = pod["metadata"]["name"]
        headers = {"traceparent": traceparent(name)} if traced else None
        sent = time.monotonic()
        call(cluster, "POST", path, pod, wanted={201}, what=f"creating pod {name}", headers=headers)
        if answered is not None:
            answered[name] = time.monotonic()
        return sent

    if rate is None:
        sent = concurrently(pods, create, threads)
    else:
        sent = paced(pods, create, rate, threads)
    return {pod["metadata"]["name"]: t for pod, t in zip(pods, sent, strict=True)}


def delete_pods(
    cluster: LocalCluster,
    namespace: str,
    names: Sequence[str],
    threads: int,
    timeout: float = 300.0,
) -> None:
    """Deletes the pods at once (gracePeriodSeconds=0: no kubelet waits) and waits until the
    namespace has no pods left."""
    options = bodies.delete_options(0)

    def delete(name: str) -> None:
        path = PODS.item(name, namespace)
        call(cluster, "DELETE", path, options, wanted={200, 202, 404}, what=f"deleting pod {name}")

    concurrently(names, delete, threads)
    wait_no_pods(cluster, namespace, timeout)


def wait_no_pods(cluster: LocalCluster, namespace: str, timeout: float = 300.0) -> None:
    def empty() -> bool:
        status, body = cluster.request("GET", f"{PODS.collection(namespace)}?limit=1")
        return status == 200 and not body["items"]

    cluster.wait_for(f"pods in namespace {namespace} to be gone", empty, timeout, interval=0.25)


def pending_summary(cluster: LocalCluster, namespace: str, limit: int = 5) -> str:
    """Why pods are not bound yet, from their PodScheduled conditions (for error messages)."""
    status, body = cluster.request("GET", PODS.collection(namespace))
    if status != 200:
        return f"(cannot list pods: HTTP {status})"
    pending = [p for p in body["items"] if not p["spec"].get("nodeName")]
    reasons = []
    for pod in pending[:limit]:
        conditions = pod.get("status", {}).get("conditions") or []
        scheduled: Obj = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        reasons.append(
            f"{pod['metadata']['name']}: {scheduled.get('reason', 'no condition')} "
            f"{scheduled.get('message', '')}".strip()
        )
    return f"{len(pending)} pending; " + "; ".join(reasons)


@dataclass(frozen=True)
class Observed:
    """What the pod watcher saw: first sight and binding of each pod (time.monotonic)."""

    added: Mapping[str, float]
    bound: Mapping[str, float]
    listed: int
    events: int
    restarts: int  # watches the apiserver ended and the watcher resumed
    cpu: float  # the watcher's own CPU seconds


@dataclass(frozen=True)
class Heartbeats:
    """What the agents' heartbeats cost over a stretch of time (from `HeartbeatLoad.stop`)."""

    renewals: int
    failures: int
    late: int
    seconds: float
    cpu: float  # the renewing process's CPU seconds

    @property
    def per_second(self) -> float:
        return self.renewals / self.seconds if self.seconds > 0 else 0.0


class HeartbeatLoad:
    """`bench._heartbeats` in a subprocess: every node's agent Lease renewed at the agents'
    interval, from when this returns until `stop`."""

    def __init__(
        self, cluster: LocalCluster, namespace: str, nodes: Sequence[str], interval: float
    ) -> None:
        listing = cluster.directory / "heartbeat-nodes.txt"
        listing.write_text("\n".join(nodes) + "\n")
        argv = [
            sys.executable,
            "-m",
            "bench._heartbeats",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
            f"--nodes={listing}",
            f"--interval={interval}",
        ]
        self.pid = 0
        self._proc = start_ready(argv, "heartbeat load")
        self.pid = self._proc.pid

    def stop(self) -> Heartbeats:
        if self._proc.poll() is None:
            self._proc.terminate()
        out, _ = self._proc.communicate(timeout=60)
        lines = out.strip().splitlines()
        if not lines:
            raise BenchError(f"heartbeat load failed ({self._proc.returncode})")
        data = json.loads(lines[-1])
        return Heartbeats(
            data["renewals"], data["failures"], data["late"], data["seconds"], data["cpu"]
        )


class PodWatch:
    """`bench._podwatch` in a subprocess, watching one namespace from before the workload starts."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        count: int,
        timeout: float,
        *,
        claims: bool = False,
    ) -> None:
        """`claims`: watch the namespace's ResourceClaims, "bound" meaning allocated."""
        self.namespace = namespace
        self.count = count
        self.timeout = timeout
        self._cluster = cluster
        layout = cluster.layout
        argv = [
            sys.executable,
            "-m",
            "bench._podwatch",
            f"--server={cluster.server}",
            f"--ca={cluster.ca_file}",
            f"--cert={layout.cert('admin')}",
            f"--key={layout.key('admin')}",
            f"--namespace={namespace}",
            f"--count={count}",
            f"--timeout={timeout}",
            *(["--claims"] if claims else []),
        ]
        self._proc = start_ready(argv, "pod watcher")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait(self, *, partial: bool = False) -> Observed:
        """Waits until `count` pods are bound; raises BenchError (saying why pods are pending)
        when that takes longer than the timeout or a cluster component dies. With `partial`,
        a timeout returns what was bound by then (at least one pod) instead."""
        deadline = time.monotonic() + self.timeout
        out = ""
        while True:
            try:
                # communicate() reads while it waits: the result is larger than a pipe holds.
                out, _ = self._proc.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    self._proc.terminate()
                    out, _ = self._proc.communicate()
                    break
                self._cluster.check_alive()
        observed = self._result(out)
        if partial and observed.bound:
            return observed
        if len(observed.bound) < self.count:
            raise BenchError(
                f"only {len(observed.bound)} of {self.count} pods bound within "
                f"{self.timeout:.0f} s; {pending_summary(self._cluster, self.namespace)}"
            )
        return observed

    def stop(self) -> None:
        """Ends the watcher if it still runs (idempotent; after `wait` or on an error)."""
        if self._proc.poll() is None:
            self._proc.terminate()
        self._proc.communicate()

    def _result(self, out: str) -> Observed:
        lines = out.strip().splitlines()
        if self._proc.returncode != 0 or not lines:
            raise BenchError(f"pod watcher failed ({self._proc.returncode}): {out[-500:]}")
        data = json.loads(lines[-1])
        return Observed(
            data["added"],
            data["bound"],
            data["listed"],
            data["events"],
            data["restarts"],
            data["cpu"],
        )


# --------------------------------------------------------------------------- processes


def process_cpu(pid: int, apart: Collection[int] = ()) -> float:
    """CPU seconds (user + system) the process and its live descendants (a controller's bind
    processes) have used so far; a descendant in `apart` (counted under a name of its own, as
    the components this benchmark starts are) is left out, with its own descendants."""
    total = own_cpu(pid)
    for child in _children(pid):
        if child in apart:
            continue
        with contextlib.suppress(OSError, ValueError):  # it ended meanwhile
            total += process_cpu(child, apart)
    return total


def own_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process alone has used so far."""
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), _TICKS)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory plus its live descendants' (a controller's bind
    processes, a webhook's server processes), each process's own peak: an upper bound of what
    they held together at any one time."""
    total = status_kib(Path(f"/proc/{pid}/status").read_text(), "VmHWM") / 1024
    for child in _children(pid):
        with contextlib.suppress(OSError, ValueError):  # it ended meanwhile
            total += peak_rss_mib(child)
    return total


def run_queue_wait(pid: int) -> float:
    """Seconds the process's threads have been runnable but waiting for a CPU (schedstat's
    second field): on a saturated machine, the part of a call's latency that is the wait to run."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def machine_busy() -> float:
    return busy_seconds(Path("/proc/stat").read_text(), _TICKS)


#: In `CpuMeter` results: CPU the whole machine used, and the part no named process used
#: (other work on the machine; short-lived processes such as the pod watcher before it reports).
MACHINE = "whole machine"
OTHERS = "outside the named processes"


class CpuMeter:
    """CPU seconds used by named processes, and by the machine, between `start()` and `stop()`."""

    def __init__(self, pids: Mapping[str, int], apart: Collection[int] = ()) -> None:
        """`apart`: processes counted elsewhere (the ceiling client's, which report their own
        CPU), left out of whichever named process started them."""
        self._pids = dict(pids)
        self._apart = frozenset(apart)
        self._before: dict[str, float] = {}
        self._machine = 0.0

    def _read(self, apart: Collection[int] = ()) -> dict[str, float]:
        """Each named process's CPU, none counted twice: the others are not its descendants."""
        named = set(self._pids.values()) | self._apart | set(apart)
        return {name: process_cpu(pid, named - {pid}) for name, pid in self._pids.items()}

    def start(self) -> CpuMeter:
        self._before = self._read()
        self._machine = machine_busy()
        return self

    def stop(self, started: Collection[int] = ()) -> dict[str, float]:
        """`started`: processes that started meanwhile and are counted by their own names (a
        binder started inside the block), so not under the process that started them."""
        now = self._read(started)
        used = {name: now[name] - self._before[name] for name in self._pids}
        machine = machine_busy() - self._machine
        return used | {MACHINE: machine, OTHERS: machine - sum(used.values())}


def metrics(kube: Kube) -> str:
    """The /metrics text of the server `kube` talks to (the apiserver, or the webhook)."""
    response = kube.send(prepare("GET", "/metrics"))
    if response.status != 200:
        raise BenchError(f"GET {kube.host}/metrics: HTTP {response.status}")
    return response.data.decode()


class CpuSampler:
    """A process's CPU seconds sampled every `period` while it runs (a thread of this process),
    so the CPU of a stretch of the run (first to last bind, leaving out start-up) can be read."""

    def __init__(self, pid: int, period: float = 0.05, descendants: bool = True) -> None:
        """`descendants`: count the process's descendants too (a controller's bind processes),
        as `process_cpu` does; False: the process alone."""
        self.samples: list[tuple[float, float]] = []
        self._pid, self._period = pid, period
        self._read: Callable[[int], float] = process_cpu if descendants else own_cpu
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append((time.monotonic(), self._read(self._pid)))
            except OSError:
                return  # the process is gone
            if self._stop.wait(self._period):
                return

    def stop(self) -> CpuSampler:
        self._stop.set()
        self._thread.join()
        return self

    def at(self, t: float) -> float:
        """CPU seconds used by time `t`, interpolated between the samples around it."""
        if not self.samples:
            return float("nan")
        before = [(s, c) for s, c in self.samples if s <= t] or self.samples[:1]
        after = [(s, c) for s, c in self.samples if s >= t] or self.samples[-1:]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 <= t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start)


class Profiler:
    """py-spy sampling one process into a collapsed-stack file (one stack a line with its count)
    while a run lasts: only the thread holding the GIL (--gil), which is where a Python process
    spends CPU, and --nonblocking, so the profiled process is never paused."""

    def __init__(self, pid: int, output: Path) -> None:
        py_spy = Path(sys.executable).with_name("py-spy")
        if not py_spy.exists():
            raise BenchError(
                f"profiling needs py-spy next to {sys.executable} (pip install py-spy)"
            )
        self.output = output
        self._log = output.with_suffix(".log").open("wb")
        argv = [str(py_spy), "record", "--pid", str(pid), "--format", "raw"]
        argv += ["--output", str(output), "--nonblocking", "--gil", "--rate", "100"]
        self._proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


@contextlib.contextmanager
def profiling(pid: int, output: Path | None) -> Iterator[None]:
    """Profiles `pid` into `output` for the duration of the block; nothing when output is None."""
    if output is None:
        yield
        return
    profiler = Profiler(pid, output)
    try:
        yield
    finally:
        profiler.stop()


def admission_review(
    kind: str, resource: str, obj: Obj, uid: str = "0", user: str | None = None
) -> Obj:
    """The AdmissionReview (v1) the apiserver sends a webhook for the CREATE of `obj`, a core
    object (`kind`, plural `resource`) named in its own metadata."""
    request: Obj = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "operation": "CREATE",
        "namespace": obj["metadata"]["namespace"],
        "name": obj["metadata"]["name"],
        "object": obj,
    }
    if user is not None:
        request["userInfo"] = {"username": user}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
