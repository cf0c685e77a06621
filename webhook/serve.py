"""The webhook's serving lifecycle: from settings to a serving process, until a signal.

With `processes` 1 this process serves: it reads the model, starts TLS (mounted files, watched,
or a bootstrapped pair, rotated), listens (`webhook.server`), registers the webhook
configurations once it can answer, and on SIGTERM fails /readyz for the shutdown delay, then
stops accepting and finishes the requests in flight. With N > 1 this process is the parent of N
server processes sharing the port (`webhook.processes`): it holds the TLS material, registers
once every process is ready, restarts the ones that exit and stops them on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType

from kubeio import logs
from kubeio.client import Kube
from kubeio.errors import APIError
from webhook.app import create_app
from webhook.certs import KeyPair
from webhook.manifests import Endpoint, mutating_configuration, validating_configuration
from webhook.modelcache import ModelCache
from webhook.processes import (
    METRICS_DIR_ENV,
    ServerProcesses,
    WorkerStartError,
    reserve_port,
    watch_parent,
    write_pair_files,
)
from webhook.register import apply_configuration
from webhook.server import drain, https_server
from webhook.settings import WebhookSettings
from webhook.state import state_of
from webhook.tls import CertificateError, MountedFilesWatcher, ServingTLS, read_pair
from webhook.tlsbootstrap import TLSBootstrap

log = logging.getLogger("gpuplace.webhook")
STARTUP_RETRY_SECONDS = 3.0


def run(settings: WebhookSettings) -> int:
    """Serves until SIGTERM or SIGINT; the command's exit code."""
    logs.configure(settings.log_level, settings.log_json)
    if not settings.tls.mounted and not settings.tls.bootstrap:
        log.error(
            "the webhook serves TLS only: pass --tls-cert-file and --tls-key-file "
            "(e.g. from cert-manager), or --bootstrap-tls"
        )
        return 2
    stop = stop_on_signals()
    if settings.server.processes > 1:
        return run_processes(settings, stop)
    return serve(settings, stop)


def _bootstrap_pair(boot: TLSBootstrap, stop: threading.Event) -> KeyPair | None:
    """The first serving certificate; retried until the apiserver answers (or we are stopped)."""
    while not stop.is_set():
        try:
            return boot.issue()
        except APIError as exc:
            log.warning("cannot read or create the CA Secret yet: %s", exc)
            stop.wait(STARTUP_RETRY_SECONDS)
    return None


def _register(kube: Kube, settings: WebhookSettings, ca_bundle: bytes) -> None:
    url = settings.registration.register_url
    if not url:
        return
    endpoint = Endpoint(ca_bundle=ca_bundle, url=url)
    name = settings.registration.configuration_name
    admission = settings.admission
    legacy = admission.legacy_scheduler_names if admission.legacy_mode else ()
    apply_configuration(kube, mutating_configuration(name, endpoint, legacy_scheduler_names=legacy))
    apply_configuration(kube, validating_configuration(name, endpoint, resources=True))
    log.info("registered webhook configurations %s pointing at %s", name, url)


@dataclass(frozen=True, slots=True)
class _Serving:
    """The TLS the server serves, the CA bundle to register, and what keeps the pair current."""

    tls: ServingTLS
    bundle: bytes
    boot: TLSBootstrap | None = None
    watcher: MountedFilesWatcher | None = None


def _serving_or_exit(
    kube: Kube, settings: WebhookSettings, stop: threading.Event, served: Callable[[KeyPair], None]
) -> _Serving | int:
    """`_start_tls`, or the command's exit code: 2 when the certificate cannot be served, 0
    when stopped before the first pair."""
    try:
        serving = _start_tls(kube, settings, stop, served)
    except (CertificateError, OSError) as exc:
        log.error("cannot serve TLS: %s", exc)
        return 2
    return 0 if serving is None else serving


def _start_tls(
    kube: Kube, settings: WebhookSettings, stop: threading.Event, served: Callable[[KeyPair], None]
) -> _Serving | None:
    """Mounted files (watched) or a bootstrapped pair; None when stopped before the first pair.
    Raises CertificateError or OSError when the mounted files cannot be served."""
    tls = settings.tls
    if tls.cert_file and tls.key_file:
        serving = ServingTLS(read_pair(tls.cert_file, tls.key_file), on_change=served)
        watcher = MountedFilesWatcher(
            serving, tls.cert_file, tls.key_file, tls.reload_interval_seconds
        ).start()
        return _Serving(serving, Path(tls.ca_file or tls.cert_file).read_bytes(), watcher=watcher)
    boot = TLSBootstrap(kube, tls, settings.registration)
    pair = _bootstrap_pair(boot, stop)
    if pair is None:
        return None
    return _Serving(ServingTLS(pair, on_change=served), boot.bundle, boot=boot)


def stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def serve(
    settings: WebhookSettings,
    stop: threading.Event,
    ready: Callable[[], None] | None = None,
    metrics_dir: str | None = None,
) -> int:
    """Serves from this process until `stop`; `ready` is called once it listens and has read
    the model (and registered the configurations, if it registers them)."""
    kube = Kube.connect(settings.kube)
    models = ModelCache(kube, settings.model_namespace).start()
    app = create_app(settings, models, metrics_dir)
    metrics = state_of(app).metrics

    def served(pair: KeyPair) -> None:
        metrics.certificate_expiry.set(pair.not_after.timestamp())

    serving = _serving_or_exit(kube, settings, stop, served)
    if isinstance(serving, int):
        return serving
    try:
        server = https_server(app, serving.tls, settings.server).start()
    except OSError as exc:
        log.error("cannot start: %s", exc)
        serving.tls.close()
        return 1
    # Registered only once this replica listens and has read the model: from then on the
    # apiserver calls it, and failurePolicy Fail refuses what it cannot reach.
    while not models.wait_loaded(0.5):
        if stop.is_set():
            server.stop()
            serving.tls.close()
            return 0
    try:
        _register(kube, settings, serving.bundle)
    except APIError as exc:
        log.error("cannot register: %s", exc)
        server.stop()
        serving.tls.close()
        return 1
    if serving.boot is not None:
        serving.boot.start(serving.tls)
    if ready is not None:
        ready()
    stop.wait()
    drain(app, settings.server, server)
    server.stop()
    for part in (serving.boot, serving.watcher, models):
        if part is not None:
            part.stop()
    serving.tls.close()
    log.info("stopped")
    return 0


def run_processes(settings: WebhookSettings, stop: threading.Event) -> int:
    """The parent of `settings.server.processes` server processes: it reserves the port, holds
    the TLS material (bootstrapped here, once), registers the configurations once every process
    is ready, keeps the workers running and stops them on `stop`."""
    server = settings.server
    kube = Kube.connect(settings.kube)
    try:
        reserved = reserve_port(server.host, server.port)
    except OSError as exc:
        log.error("cannot bind %s:%d: %s", server.host, server.port, exc)
        return 1
    files = Path(tempfile.mkdtemp(prefix="gpuplace-webhook-tls-"))
    try:
        return _parent(settings, stop, kube, int(reserved.getsockname()[1]), files)
    finally:
        reserved.close()
        shutil.rmtree(files, ignore_errors=True)


def _parent(
    settings: WebhookSettings, stop: threading.Event, kube: Kube, port: int, files: Path
) -> int:
    def served(pair: KeyPair) -> None:
        if not settings.tls.mounted:  # bootstrapped: the workers read what the parent issued
            write_pair_files(files, pair.cert_pem, pair.key_pem)

    serving = _serving_or_exit(kube, settings, stop, served)
    if isinstance(serving, int):
        return serving
    tls = settings.tls
    cert, key = files / "tls.crt", files / "tls.key"
    if tls.cert_file and tls.key_file:  # workers watch the mounted files themselves
        cert, key = Path(tls.cert_file), Path(tls.key_file)
    worker = replace(
        settings,
        server=replace(settings.server, port=port),
        tls=replace(tls, cert_file=str(cert), key_file=str(key), bootstrap=False),
        registration=replace(settings.registration, register_url=None),
    )
    workers = ServerProcesses(settings.server.processes, partial(_worker, worker)).start()
    log.info("serving HTTPS on %s:%d from processes %s", settings.server.host, port, workers.pids)
    code = 0
    try:
        if workers.wait_ready(stop):
            log.info("%d processes ready", settings.server.processes)
            _register(kube, settings, serving.bundle)
            if serving.boot is not None:
                serving.boot.start(serving.tls)
            while not stop.is_set():
                workers.supervise(0.5)
    except APIError as exc:
        log.error("cannot register: %s", exc)
        code = 1
    except WorkerStartError as exc:
        log.error("%s", exc)
        code = 1
    finally:
        server = settings.server
        workers.stop(server.shutdown_delay_seconds + server.shutdown_timeout_seconds + 5)
        workers.close()
        for part in (serving.boot, serving.watcher):
            if part is not None:
                part.stop()
        serving.tls.close()
    log.info("stopped")
    return code


def _worker(settings: WebhookSettings, index: int, ready: Event) -> None:
    """One server process (spawned): serves until SIGTERM or until the parent is gone."""
    logs.configure(settings.log_level, settings.log_json)
    stop = stop_on_signals()
    watch_parent(stop)
    log.info("webhook process %d serving", index)
    metrics_dir = os.environ[METRICS_DIR_ENV]
    raise SystemExit(serve(settings, stop, ready.set, metrics_dir))
