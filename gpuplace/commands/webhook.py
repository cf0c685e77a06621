"""`gpuplace webhook`: the admission webhook over HTTPS (one event-loop thread a process, map
validation on a few threads), with its model cache and TLS, served from this process or, with
`--processes N`, from N processes sharing the port."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType

from gpuplace.commands._env import (
    EnvFlags,
    add_enforcement_flags,
    add_kubeconfig_flag,
    add_legacy_flags,
    add_log_flags,
)
from kubeio import logs
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from placement.dra import Enforcement
from webhook.app import create_app
from webhook.certs import KeyPair
from webhook.loopserver import LoopServer
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
from webhook.settings import (
    CONNECTION_SHARE_BYTES,
    DEFAULT_CA_SECRET,
    DEFAULT_CONFIGURATION_NAME,
    DEFAULT_LEGACY_SCHEDULER_NAMES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SERVICE_NAME,
    DEFAULT_VALIDATION_QUEUE,
    DEFAULT_VALIDATION_QUEUE_PER_NAMESPACE,
    DEFAULT_VALIDATION_THREADS,
    AdmissionSettings,
    RegistrationSettings,
    ServerSettings,
    TLSSettings,
    WebhookSettings,
)
from webhook.state import state_of
from webhook.tls import CertificateError, MountedFilesWatcher, ServingTLS, read_pair
from webhook.tlsbootstrap import TLSBootstrap

log = logging.getLogger("gpuplace.webhook")
STARTUP_RETRY_SECONDS = 3.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "webhook",
        help="run the admission webhook (pod env wiring, placement-map validation)",
        description="Serves /mutate, /validate, /healthz, /readyz and /metrics over HTTPS. "
        "TLS comes from mounted files (--tls-cert-file/--tls-key-file, reloaded when they "
        "change) or is bootstrapped (--bootstrap-tls): a CA shared through a Secret, a serving "
        "certificate issued from it, and the caBundle written into the webhook configurations.",
    )
    flags = EnvFlags(p)
    add_kubeconfig_flag(flags)
    flags.string("--context", "GPUPLACE_CONTEXT", None)
    flags.string(
        "--namespace",
        "GPUPLACE_NAMESPACE",
        "gpuplace-system",
        help="namespace of the model ConfigMaps, the CA Secret and the webhook Service",
    )
    _add_server_flags(flags)
    flags.string("--scheduler-name", "GPUPLACE_SCHEDULER_NAME", DEFAULT_SCHEDULER_NAME)
    add_legacy_flags(flags, "wire", list(DEFAULT_LEGACY_SCHEDULER_NAMES))
    add_enforcement_flags(flags, dra_details=False)
    _add_tls_flags(EnvFlags(p.add_argument_group("TLS")))
    _add_registration_flags(EnvFlags(p.add_argument_group("webhook configurations")))
    add_log_flags(flags)
    p.set_defaults(handler=run)


def _add_server_flags(flags: EnvFlags) -> None:
    flags.string("--host", "GPUPLACE_WEBHOOK_HOST", "0.0.0.0")  # noqa: S104
    flags.integer("--port", "GPUPLACE_WEBHOOK_PORT", 8443)
    flags.integer(
        "--processes",
        "GPUPLACE_WEBHOOK_PROCESSES",
        1,
        help="server processes sharing the port (SO_REUSEPORT), each with its own GIL and "
        "model cache; 1 serves from this process",
    )
    flags.integer("--max-body-bytes", "GPUPLACE_WEBHOOK_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)
    _add_bound_flags(flags)
    flags.number(
        "--shutdown-delay-seconds",
        "GPUPLACE_SHUTDOWN_DELAY_SECONDS",
        2.0,
        help="after SIGTERM, fail /readyz this long before closing the port",
    )


def _add_bound_flags(flags: EnvFlags) -> None:
    """The server's caps, all processes together (each keeps 1/`--processes`), and timeouts
    (`ServerSettings` says what each one bounds)."""
    flags.integer(
        "--max-connections",
        "GPUPLACE_WEBHOOK_MAX_CONNECTIONS",
        DEFAULT_MAX_CONNECTIONS,
        help="open connections, all processes together; past it a new one replaces the oldest "
        "that never sent a request, or is closed (default %(default)s)",
    )
    flags.integer(
        "--max-buffered-bytes",
        "GPUPLACE_WEBHOOK_MAX_BUFFERED_BYTES",
        DEFAULT_MAX_BUFFERED_BYTES,
        help=f"request bytes buffered, all connections and processes together: "
        f"{CONNECTION_SHARE_BYTES} a connection, the rest a pool for larger bodies, past which "
        "they are answered 503 (default %(default)s)",
    )
    flags.integer(
        "--validation-threads",
        "GPUPLACE_WEBHOOK_VALIDATION_THREADS",
        DEFAULT_VALIDATION_THREADS,
        help="threads that validate placement maps, off the pod admissions' loop, all "
        "processes together (at least one each)",
    )
    flags.integer(
        "--validation-queue-per-namespace",
        "GPUPLACE_WEBHOOK_VALIDATION_QUEUE_PER_NAMESPACE",
        DEFAULT_VALIDATION_QUEUE_PER_NAMESPACE,
        help="map validations of one namespace queued or running; past it they are refused "
        "at once (429, apply again), while other namespaces' still queue",
    )
    flags.integer(
        "--validation-queue",
        "GPUPLACE_WEBHOOK_VALIDATION_QUEUE",
        DEFAULT_VALIDATION_QUEUE,
        help="map validations queued or running, all namespaces together",
    )
    for phase, default, what in (
        ("handshake", 10.0, "a TLS handshake"),
        ("head", 10.0, "a request's line and headers, from its first byte"),
        ("request", 30.0, "a whole request, body included, from its first byte"),
        ("idle", 120.0, "a connection with no request in progress"),
        ("write", 10.0, "an answer the client does not read"),
    ):
        flags.number(
            f"--{phase}-timeout-seconds",
            f"GPUPLACE_WEBHOOK_{phase.upper()}_TIMEOUT_SECONDS",
            default,
            help=f"how long {what} may take before its connection is closed",
        )


def _add_tls_flags(flags: EnvFlags) -> None:
    flags.string("--tls-cert-file", "GPUPLACE_TLS_CERT_FILE", None)
    flags.string("--tls-key-file", "GPUPLACE_TLS_KEY_FILE", None)
    flags.string(
        "--tls-ca-file",
        "GPUPLACE_TLS_CA_FILE",
        None,
        help="CA bundle written by --register with mounted certificates (default: the cert)",
    )
    flags.switch(
        "--bootstrap-tls",
        "--self-signed",
        env="GPUPLACE_BOOTSTRAP_TLS",
        help="generate and share a CA through a Secret, issue the serving certificate, "
        "write the caBundle into the webhook configurations, rotate before expiry",
    )
    flags.string("--ca-secret", "GPUPLACE_CA_SECRET", DEFAULT_CA_SECRET)
    flags.string("--service-name", "GPUPLACE_SERVICE_NAME", DEFAULT_SERVICE_NAME)
    flags.repeated(
        "--dns-name",
        "GPUPLACE_DNS_NAMES",
        [],
        dest="dns_names",
        help="extra DNS name for the serving certificate (repeatable)",
    )
    flags.repeated(
        "--ip-address",
        "GPUPLACE_IP_ADDRESSES",
        ["127.0.0.1"],
        dest="ip_addresses",
        help="IP address for the serving certificate (repeatable; default 127.0.0.1)",
    )


def _add_registration_flags(flags: EnvFlags) -> None:
    flags.string(
        "--configuration-name",
        "GPUPLACE_CONFIGURATION_NAME",
        DEFAULT_CONFIGURATION_NAME,
        help="name of the Mutating- and ValidatingWebhookConfiguration",
    )
    flags.string(
        "--register",
        "GPUPLACE_REGISTER_URL",
        None,
        metavar="URL",
        help="create/update both configurations pointing at URL (e.g. https://127.0.0.1:8443)",
    )
    flags.toggle(
        "--patch-ca-bundle",
        "GPUPLACE_PATCH_CA_BUNDLE",
        True,
        help="with --bootstrap-tls, keep the caBundle of the configurations current",
    )


def settings_from(args: argparse.Namespace) -> WebhookSettings:
    return WebhookSettings(
        admission=AdmissionSettings(
            scheduler_name=args.scheduler_name,
            legacy_mode=args.legacy,
            legacy_scheduler_names=tuple(args.legacy_names),
            enforcement=Enforcement(args.enforcement),
        ),
        server=ServerSettings(
            host=args.host,
            port=args.port,
            processes=args.processes,
            max_body_bytes=args.max_body_bytes,
            max_connections=args.max_connections,
            max_buffered_bytes=args.max_buffered_bytes,
            validation_threads=args.validation_threads,
            validation_queue_per_namespace=args.validation_queue_per_namespace,
            validation_queue=args.validation_queue,
            handshake_timeout_seconds=args.handshake_timeout_seconds,
            head_timeout_seconds=args.head_timeout_seconds,
            request_timeout_seconds=args.request_timeout_seconds,
            idle_timeout_seconds=args.idle_timeout_seconds,
            write_timeout_seconds=args.write_timeout_seconds,
            shutdown_delay_seconds=args.shutdown_delay_seconds,
        ),
        tls=TLSSettings(
            cert_file=args.tls_cert_file,
            key_file=args.tls_key_file,
            ca_file=args.tls_ca_file,
            bootstrap=args.bootstrap_tls,
            namespace=args.namespace,
            ca_secret=args.ca_secret,
            service_name=args.service_name,
            extra_dns_names=tuple(args.dns_names),
            ip_addresses=tuple(args.ip_addresses),
        ),
        registration=RegistrationSettings(
            configuration_name=args.configuration_name,
            register_url=args.register,
            patch_ca_bundle=args.patch_ca_bundle,
        ),
        kube=ClientSettings(kubeconfig=args.kubeconfig, context=args.context),
        model_namespace=args.namespace,
        log_level=args.log_level,
        log_json=args.log_json,
    )


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


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValueError as exc:  # bounds that contradict each other
        print(f"gpuplace webhook: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_json)
    if not settings.tls.mounted and not settings.tls.bootstrap:
        log.error(
            "the webhook serves TLS only: pass --tls-cert-file and --tls-key-file "
            "(e.g. from cert-manager), or --bootstrap-tls"
        )
        return 2
    stop = _stop_on_signals()
    if settings.server.processes > 1:
        return run_processes(settings, stop)
    return _serve(settings, stop)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _serve(
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
        server = LoopServer(app, serving.tls, settings.server).start()
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
    server.drain()
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
    stop = _stop_on_signals()
    watch_parent(stop)
    log.info("webhook process %d serving", index)
    metrics_dir = os.environ[METRICS_DIR_ENV]
    raise SystemExit(_serve(settings, stop, ready.set, metrics_dir))
