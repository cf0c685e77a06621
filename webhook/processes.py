"""Several webhook server processes sharing one port (SO_REUSEPORT), kept running by the parent.

One Python process serves admissions one at a time under its GIL, and most of its CPU goes to
thread switches; N processes each bind the port with SO_REUSEPORT and the kernel spreads the
apiserver's connections over them.

Workers are started with `spawn`: a fresh interpreter holds none of the parent's threads or locks,
and `prometheus_client` chooses its multiprocess value class at import, from the environment the
parent set before the start. The parent:
- reserves the port (binding port 0 chooses it) with a bound, never listening socket, so a worker
  restarted later binds the same port;
- restarts a worker that exits while the parent runs, and gives up (`WorkerStartError`) on one
  that exits `MAX_FAILED_STARTS` times in a row before it ever served: a setting or certificate
  it cannot serve with fails the same way each time, and a crash-looping container shows it;
- on stop sends SIGTERM to every worker (each drains and finishes its in-flight requests), waits,
  and kills what is still running after the deadline;
- marks a stopped worker dead for the metrics, so its `live*` gauges leave the totals while its
  counters and histograms stay in them.
Workers watch the parent's sentinel (`multiprocessing.parent_process()`) and stop when it dies.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from pathlib import Path

from prometheus_client import multiprocess

log = logging.getLogger(__name__)

#: The environment variable through which `prometheus_client` shares metrics between processes.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: A worker that exits is restarted no sooner than this after its last start (no busy loop
#: when every start fails, e.g. on a bad setting).
RESTART_BACKOFF_SECONDS = 1.0
#: Starts in a row that end before the worker serves, after which the parent gives up.
MAX_FAILED_STARTS = 5
#: How long `stop` waits after SIGKILL for a process to be reaped.
KILL_WAIT_SECONDS = 5.0
#: How long an exiting worker (its sentinel readable) is given to be reaped.
EXIT_WAIT_SECONDS = 5.0

#: A worker's entry point: (its number, the event it sets once it serves and has its model).
Target = Callable[[int, Event], None]


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket holding `port` (0: one the kernel chooses).
    Connections go only to the workers' listening sockets."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def watch_parent(stop: threading.Event) -> None:
    """In a worker: sets `stop` once the parent process is gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def run() -> None:
        wait([sentinel])
        log.warning("the parent process is gone: stopping")
        stop.set()

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


class WorkerStartError(RuntimeError):
    """A worker exited `MAX_FAILED_STARTS` times in a row before it served."""


@dataclass
class _Slot:
    process: SpawnProcess
    ready: Event
    started: float = field(default_factory=time.monotonic)
    #: Starts in a row, this one's predecessors, that ended before the worker served.
    failed_starts: int = 0


class ServerProcesses:
    """The parent's view of its workers. Only the thread that called `start` uses it."""

    def __init__(self, count: int, target: Target) -> None:
        self._count = count
        self._target = target
        self._context = multiprocessing.get_context("spawn")
        self.metrics_dir = tempfile.mkdtemp(prefix="gpuplace-webhook-metrics-")
        self._slots: list[_Slot] = []

    def start(self) -> ServerProcesses:
        os.environ[METRICS_DIR_ENV] = self.metrics_dir
        self._slots = [self._spawn(index) for index in range(self._count)]
        return self

    def _spawn(self, index: int, failed_starts: int = 0) -> _Slot:
        ready = self._context.Event()
        process = self._context.Process(
            target=self._target, args=(index, ready), name=f"webhook-{index}", daemon=False
        )
        process.start()
        log.info("started webhook process %d (pid %s)", index, process.pid)
        return _Slot(process, ready, failed_starts=failed_starts)

    @property
    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self._slots if slot.process.pid is not None]

    def wait_ready(self, stop: threading.Event, poll: float = 0.2) -> bool:
        """True once every worker is ready; False if stopped first. Restarts workers meanwhile."""
        while not stop.is_set():
            if all(slot.ready.is_set() for slot in self._slots):
                return True
            self.supervise(poll)
        return False

    def supervise(self, timeout: float) -> None:
        """Waits up to `timeout` for a worker to exit and restarts the ones that did."""
        ready = set(wait([slot.process.sentinel for slot in self._slots], timeout))
        for index, slot in enumerate(self._slots):
            if slot.process.sentinel in ready:
                # Readable once the worker has closed its end, as it exits; the kernel reaps
                # it a moment later, and is_alive() is true until then (long on a busy machine).
                slot.process.join(EXIT_WAIT_SECONDS)
            if slot.process.is_alive():
                continue
            slot.process.join()
            self._forget(slot)
            code = slot.process.exitcode
            failed = 0 if slot.ready.is_set() else slot.failed_starts + 1
            if failed >= MAX_FAILED_STARTS:
                raise WorkerStartError(
                    f"webhook process {index} exited {failed} times in a row before it served "
                    f"(last exit code {code}); its log says why"
                )
            log.warning(
                "webhook process %d (pid %s) exited with %s: restarting",
                index,
                slot.process.pid,
                code,
            )
            time.sleep(max(0.0, slot.started + RESTART_BACKOFF_SECONDS - time.monotonic()))
            self._slots[index] = self._spawn(index, failed)

    def _forget(self, slot: _Slot) -> None:
        if slot.process.pid is not None:
            multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                slot.process.pid, self.metrics_dir
            )

    def stop(self, deadline_seconds: float) -> None:
        """SIGTERM to every worker; SIGKILL to those still running after `deadline_seconds`."""
        for slot in self._slots:
            if slot.process.is_alive() and slot.process.pid is not None:
                os.kill(slot.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + deadline_seconds
        for slot in self._slots:
            slot.process.join(max(0.0, deadline - time.monotonic()))
            if slot.process.is_alive():
                log.warning("webhook process pid %s did not stop in time: killed", slot.process.pid)
                slot.process.kill()
                slot.process.join(KILL_WAIT_SECONDS)
            self._forget(slot)

    def close(self) -> None:
        os.environ.pop(METRICS_DIR_ENV, None)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)


def write_pair_files(directory: Path, cert_pem: bytes, key_pem: bytes) -> tuple[Path, Path]:
    """Writes a certificate and key where workers read them; each file is replaced by a rename,
    so a worker never reads half a file (it retries a mismatched pair on its next check)."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    for path, data in ((key, key_pem), (cert, cert_pem)):
        partial = path.with_suffix(".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        partial.replace(path)
    return cert, key
