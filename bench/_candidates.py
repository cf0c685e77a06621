"""Candidate servers of gpuplace's webhook: the same Flask app (`bench._candidate_app`) served by a
well-kept server instead of gpuplace's own (`kubeio.server`), to measure them on the same bench,
in the same run: granian (Rust's hyper with rustls, WSGI) and gunicorn (a gthread worker).

Each listens with TLS on a free port of 127.0.0.1, HTTP/1.1 as gpuplace's server, with as many
worker processes as the bench's webhook has server processes (`webhook_processes`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from bench._proc import BenchError
from bench._stats import histogram_buckets, histogram_count
from bench._workload import CREATE_THREADS
from gpuplace_dev.demo.components import free_port
from gpuplace_dev.localcluster.process import die_with_parent
from webhook.settings import ServerSettings

#: The candidate servers, in the order the bench runs them.
ENGINES = ("granian", "gunicorn")
#: The app factory every candidate serves.
APP = "bench._candidate_app:create"
#: The threads that answer requests at once in each process (granian's blocking threads,
#: gunicorn's gthread worker's): as many as the threads the bench's bursts create from.
THREADS = CREATE_THREADS
#: What the app factory reads: the bench's webhook's kubeconfig and enforcement, and where each
#: server process notes that it has the model.
KUBECONFIG_ENV = "GPUPLACE_BENCH_KUBECONFIG"
ENFORCEMENT_ENV = "GPUPLACE_BENCH_ENFORCEMENT"
READY_DIR_ENV = "GPUPLACE_BENCH_READY_DIR"
#: How long gunicorn keeps an idle connection: as long as gpuplace's server does, longer than the
#: apiserver's client keeps one idle (Go's http.Transport: 90 s). With gunicorn's default, 2 s,
#: the apiserver writes a create's review on a connection gunicorn is closing: the create fails.
KEEP_ALIVE_SECONDS = ServerSettings().idle_timeout_seconds
#: How long a candidate may take to listen with the whole model.
START_TIMEOUT = 120.0
ROOT = Path(__file__).resolve().parents[1]
MAPS_METRIC = "gpuplace_webhook_model_maps"
ADMISSIONS_METRIC = "gpuplace_webhook_admission_duration_seconds"


class CandidateError(BenchError):
    """A candidate server is not installed or did not start."""


def missing(engine: str) -> str | None:
    """Why `engine` cannot run here (not installed), or None."""
    if engine not in ENGINES:
        return f"{engine} is no candidate server (one of {', '.join(ENGINES)})"
    if importlib.util.find_spec(engine) is None:
        return f"{engine} is not installed (the dev extra has it)"
    return None


def command(
    engine: str, port: int, cert: Path, key: Path, workers: int, app: str = APP
) -> list[str]:
    """The command line that serves the app factory `app` ("module:function") with `engine` on
    127.0.0.1:`port` over TLS."""
    if engine == "granian":
        return [
            sys.executable,
            "-m",
            "granian",
            "--interface=wsgi",
            "--factory",
            "--http=1",
            "--no-ws",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--workers={workers}",
            f"--blocking-threads={THREADS}",
            f"--ssl-certificate={cert}",
            f"--ssl-keyfile={key}",
            app,
        ]
    if engine == "gunicorn":
        return [
            sys.executable,
            "-m",
            "gunicorn",
            f"--bind=127.0.0.1:{port}",
            f"--workers={workers}",
            "--worker-class=gthread",
            f"--threads={THREADS}",
            f"--keep-alive={KEEP_ALIVE_SECONDS:.0f}",
            f"--certfile={cert}",
            f"--keyfile={key}",
            f"--timeout={START_TIMEOUT:.0f}",  # a worker loads the model before it answers
            "--graceful-timeout=5",
            "--no-control-socket",
            f"{app}()",
        ]
    raise CandidateError(missing(engine) or engine)


def environment(kubeconfig: Path, enforcement: str, ready_dir: Path) -> dict[str, str]:
    """What the app factory reads, and this checkout first on the path (as the bench runs)."""
    return {
        KUBECONFIG_ENV: str(kubeconfig),
        ENFORCEMENT_ENV: enforcement,
        **process_environment(ready_dir),
    }


def process_environment(ready_dir: Path) -> dict[str, str]:
    """What every app factory's process needs: where it notes that it is ready, and this checkout
    first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {READY_DIR_ENV: str(ready_dir), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


class CandidateServer:
    """`engine` serving gpuplace's webhook app from `workers` processes (a context manager):
    started at once, `wait_ready` until every process has the model, stopped after."""

    def __init__(
        self,
        engine: str,
        workdir: Path,
        tls: tuple[Path, Path, Path],
        app_env: Mapping[str, str],
        workers: int = 1,
        app: str = APP,
    ) -> None:
        """`tls`: the serving certificate, its key and the CA that issued it; `app_env`: the
        app factory's settings (`environment`; its ready directory is emptied first); `app`: the
        app factory, which notes each process in the ready directory as `APP` does."""
        if reason := missing(engine):
            raise CandidateError(reason)
        cert, key, ca = tls
        self.engine, self.workers = engine, workers
        self.ready_dir = Path(app_env[READY_DIR_ENV])
        self.ready_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.ready_dir.glob("ready-*"):
            stale.unlink()
        self.port = free_port()
        self.log_path = workdir / f"candidate-{engine}.log"
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            command(engine, self.port, cert, key, workers, app),
            cwd=ROOT,
            env={**os.environ, **app_env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only
        )
        self.pid = self._proc.pid
        self._context = ssl.create_default_context(cafile=str(ca))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def wait_ready(self, maps: int, timeout: float = START_TIMEOUT) -> None:
        """Until every process has loaded the model (their ready files) and the server answers
        /readyz and has `maps` maps; CandidateError if it exits or takes longer."""
        deadline = time.monotonic() + timeout
        while not self._ready(maps):
            if (code := self._proc.poll()) is not None:
                raise CandidateError(f"{self.engine} exited ({code}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise CandidateError(
                    f"{self.engine} was not ready within {timeout:.0f} s: {self.log_tail()}"
                )
            time.sleep(0.2)

    def _ready(self, maps: int) -> bool:
        if len(list(self.ready_dir.glob("ready-*"))) < self.workers:
            return False
        try:
            self.get("/readyz")
            return self.model_maps() >= maps
        except (OSError, urllib.error.URLError):  # not listening yet
            return False

    def get(self, path: str) -> str:
        with urllib.request.urlopen(
            f"{self.url}{path}", context=self._context, timeout=10
        ) as answer:
            return str(answer.read().decode())

    def model_maps(self) -> float:
        """The placement maps of the model the answering process holds."""
        for line in self.get("/metrics").splitlines():
            if line.startswith(f"{MAPS_METRIC} "):
                return float(line.split()[1])
        return 0.0

    def reviews(self) -> float:
        """Admissions the answering process has timed (each process counts its own)."""
        return histogram_count(histogram_buckets(self.get("/metrics"), ADMISSIONS_METRIC))

    def log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return " | ".join(text) or f"nothing in {self.log_path}"

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        # Whatever worker outlived it (its own session: the group is its pid).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._log.close()

    def __enter__(self) -> CandidateServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
