"""`gpuplace webhook`: its flags, read into `WebhookSettings`; serving them is `webhook.serve`'s
(the admission webhook over HTTPS from this process or, with `--processes N`, from N processes
sharing the port)."""

from __future__ import annotations

import argparse
import sys

from gpuplace.commands._env import (
    EnvFlags,
    add_enforcement_flags,
    add_kubeconfig_flag,
    add_legacy_flags,
    add_log_flags,
    from_flags,
)
from kubeio.client import ClientSettings
from placement.dra import Enforcement
from webhook import serve
from webhook.settings import (
    CONNECTION_SHARE_BYTES,
    DEFAULT_CA_SECRET,
    DEFAULT_CONFIGURATION_NAME,
    DEFAULT_LEGACY_SCHEDULER_NAMES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
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
        help="open connections, all processes together; past it a new one replaces the one "
        "that has waited the longest on its client, or is closed (default %(default)s)",
    )
    flags.integer(
        "--max-connections-per-client",
        "GPUPLACE_WEBHOOK_MAX_CONNECTIONS_PER_CLIENT",
        DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        help="open connections of one client address, all processes together; past it the "
        "client's own longest-waiting connection makes room; 0: half of --max-connections "
        "(default %(default)s)",
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
    return from_flags(
        WebhookSettings,
        args,
        admission=from_flags(
            AdmissionSettings,
            args,
            legacy_mode=args.legacy,
            legacy_scheduler_names=tuple(args.legacy_names),
            enforcement=Enforcement(args.enforcement),
        ),
        server=from_flags(ServerSettings, args),
        tls=from_flags(
            TLSSettings,
            args,
            cert_file=args.tls_cert_file,
            key_file=args.tls_key_file,
            ca_file=args.tls_ca_file,
            bootstrap=args.bootstrap_tls,
            extra_dns_names=tuple(args.dns_names),
            ip_addresses=tuple(args.ip_addresses),
        ),
        registration=from_flags(RegistrationSettings, args, register_url=args.register),
        kube=ClientSettings(kubeconfig=args.kubeconfig, context=args.context),
        model_namespace=args.namespace,
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValueError as exc:  # bounds that contradict each other
        print(f"gpuplace webhook: {exc}", file=sys.stderr)
        return 2
    return serve.run(settings)
