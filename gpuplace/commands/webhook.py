"""`gpuplace webhook`: the admission webhook over HTTPS (cheroot), with its model cache and TLS."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from gpuplace.commands._env import (
    add_enforcement_flags,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
)
from kubeio import logs
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from placement.dra import Enforcement
from webhook.app import create_app
from webhook.certs import KeyPair
from webhook.manifests import Endpoint, mutating_configuration, validating_configuration
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration
from webhook.server import WebhookServer
from webhook.settings import (
    DEFAULT_CA_SECRET,
    DEFAULT_CONFIGURATION_NAME,
    DEFAULT_LEGACY_SCHEDULER_NAMES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SERVICE_NAME,
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
    p.add_argument("--kubeconfig", default=env_str("KUBECONFIG", None))
    p.add_argument("--context", default=env_str("GPUPLACE_CONTEXT", None))
    p.add_argument(
        "--namespace",
        default=env_str("GPUPLACE_NAMESPACE", "gpuplace-system"),
        help="namespace of the model ConfigMaps, the CA Secret and the webhook Service",
    )
    p.add_argument("--host", default=env_str("GPUPLACE_WEBHOOK_HOST", "0.0.0.0"))  # noqa: S104
    p.add_argument("--port", type=int, default=env_int("GPUPLACE_WEBHOOK_PORT", 8443))
    p.add_argument("--threads", type=int, default=env_int("GPUPLACE_WEBHOOK_THREADS", 16))
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=env_int("GPUPLACE_WEBHOOK_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
    )
    p.add_argument(
        "--shutdown-delay-seconds",
        type=float,
        default=env_float("GPUPLACE_SHUTDOWN_DELAY_SECONDS", 2.0),
        help="after SIGTERM, fail /readyz this long before closing the port",
    )
    p.add_argument(
        "--scheduler-name", default=env_str("GPUPLACE_SCHEDULER_NAME", DEFAULT_SCHEDULER_NAME)
    )
    p.add_argument(
        "--legacy",
        action=argparse.BooleanOptionalAction,
        default=env_bool("GPUPLACE_LEGACY", True),
        help="also wire pods carrying the gpu-scheduling-map annotation",
    )
    p.add_argument(
        "--legacy-scheduler-name",
        action="append",
        dest="legacy_names",
        default=None,
        help="schedulerName of legacy pods (repeatable; default gpu-scheduler)",
    )
    add_enforcement_flags(p, dra_details=False)
    tls = p.add_argument_group("TLS")
    tls.add_argument("--tls-cert-file", default=env_str("GPUPLACE_TLS_CERT_FILE", None))
    tls.add_argument("--tls-key-file", default=env_str("GPUPLACE_TLS_KEY_FILE", None))
    tls.add_argument(
        "--tls-ca-file",
        default=env_str("GPUPLACE_TLS_CA_FILE", None),
        help="CA bundle written by --register with mounted certificates (default: the cert)",
    )
    tls.add_argument(
        "--bootstrap-tls",
        "--self-signed",
        action="store_true",
        default=env_bool("GPUPLACE_BOOTSTRAP_TLS", False),
        help="generate and share a CA through a Secret, issue the serving certificate, "
        "write the caBundle into the webhook configurations, rotate before expiry",
    )
    tls.add_argument("--ca-secret", default=env_str("GPUPLACE_CA_SECRET", DEFAULT_CA_SECRET) or "")
    tls.add_argument(
        "--service-name", default=env_str("GPUPLACE_SERVICE_NAME", DEFAULT_SERVICE_NAME) or ""
    )
    tls.add_argument(
        "--dns-name",
        action="append",
        dest="dns_names",
        default=None,
        help="extra DNS name for the serving certificate (repeatable)",
    )
    tls.add_argument(
        "--ip-address",
        action="append",
        dest="ip_addresses",
        default=None,
        help="IP address for the serving certificate (repeatable; default 127.0.0.1)",
    )
    reg = p.add_argument_group("webhook configurations")
    reg.add_argument(
        "--configuration-name",
        default=env_str("GPUPLACE_CONFIGURATION_NAME", DEFAULT_CONFIGURATION_NAME),
        help="name of the Mutating- and ValidatingWebhookConfiguration",
    )
    reg.add_argument(
        "--register",
        metavar="URL",
        default=env_str("GPUPLACE_REGISTER_URL", None),
        help="create/update both configurations pointing at URL (e.g. https://127.0.0.1:8443)",
    )
    reg.add_argument(
        "--patch-ca-bundle",
        action=argparse.BooleanOptionalAction,
        default=env_bool("GPUPLACE_PATCH_CA_BUNDLE", True),
        help="with --bootstrap-tls, keep the caBundle of the configurations current",
    )
    p.add_argument("--log-level", default=env_str("GPUPLACE_LOG_LEVEL", "info"))
    p.add_argument("--log-json", action="store_true", default=env_bool("GPUPLACE_LOG_JSON", False))
    p.set_defaults(handler=run)


def settings_from(args: argparse.Namespace) -> WebhookSettings:
    legacy_names = tuple(
        args.legacy_names
        or env_list("GPUPLACE_LEGACY_SCHEDULER_NAMES", list(DEFAULT_LEGACY_SCHEDULER_NAMES))
    )
    return WebhookSettings(
        admission=AdmissionSettings(
            scheduler_name=args.scheduler_name,
            legacy_mode=args.legacy,
            legacy_scheduler_names=legacy_names,
            enforcement=Enforcement(args.enforcement),
        ),
        server=ServerSettings(
            host=args.host,
            port=args.port,
            threads=args.threads,
            max_body_bytes=args.max_body_bytes,
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
            extra_dns_names=tuple(args.dns_names or env_list("GPUPLACE_DNS_NAMES", [])),
            ip_addresses=tuple(
                args.ip_addresses or env_list("GPUPLACE_IP_ADDRESSES", ["127.0.0.1"])
            ),
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
    apply_configuration(kube, validating_configuration(name, endpoint))
    log.info("registered webhook configurations %s pointing at %s", name, url)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    logs.configure(settings.log_level, settings.log_json)
    tls = settings.tls
    if not tls.mounted and not tls.bootstrap:
        log.error(
            "the webhook serves TLS only: pass --tls-cert-file and --tls-key-file "
            "(e.g. from cert-manager), or --bootstrap-tls"
        )
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    kube = Kube.connect(settings.kube)
    models = ModelCache(kube, settings.model_namespace).start()
    app = create_app(settings, models)
    metrics = state_of(app).metrics

    def served(pair: KeyPair) -> None:
        metrics.certificate_expiry.set(pair.not_after.timestamp())

    boot: TLSBootstrap | None = None
    watcher: MountedFilesWatcher | None = None
    try:
        if tls.cert_file and tls.key_file:
            serving = ServingTLS(read_pair(tls.cert_file, tls.key_file), on_change=served)
            watcher = MountedFilesWatcher(
                serving, tls.cert_file, tls.key_file, tls.reload_interval_seconds
            ).start()
            bundle = Path(tls.ca_file or tls.cert_file).read_bytes()
        else:
            boot = TLSBootstrap(kube, tls, settings.registration)
            pair = _bootstrap_pair(boot, stop)
            if pair is None:
                return 0
            serving = ServingTLS(pair, on_change=served)
            bundle = boot.bundle
    except (CertificateError, OSError) as exc:
        log.error("cannot serve TLS: %s", exc)
        return 2
    try:
        _register(kube, settings, bundle)
        server = WebhookServer(app, serving, settings.server).start()
    except (APIError, OSError) as exc:
        log.error("cannot start: %s", exc)
        serving.close()
        return 1
    if boot is not None:
        boot.start(serving)
    stop.wait()
    server.drain()
    server.stop()
    for part in (boot, watcher, models):
        if part is not None:
            part.stop()
    serving.close()
    log.info("stopped")
    return 0
