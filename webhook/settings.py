"""The webhook's settings: one object of per-area parts, built by the command and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeio.client import ClientSettings
from placement.dra import Enforcement
from placement.model import MODEL_NAMESPACE

DEFAULT_SCHEDULER_NAME = "gpuplace"
DEFAULT_LEGACY_SCHEDULER_NAMES = ("gpu-scheduler",)
DEFAULT_CONFIGURATION_NAME = "gpuplace"
DEFAULT_SERVICE_NAME = "gpuplace-webhook"
DEFAULT_CA_SECRET = "gpuplace-webhook-ca"  # noqa: S105 - the Secret's name
#: The apiserver sends whole objects; 3 MiB is well above etcd's 1.5 MiB object limit.
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """What the pure admission code needs."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    legacy_mode: bool = True
    legacy_scheduler_names: tuple[str, ...] = DEFAULT_LEGACY_SCHEDULER_NAMES
    #: `dra`: pods of maps get the map's ResourceClaim and UUID env (they see only their GPUs).
    enforcement: Enforcement = Enforcement.ENV


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "0.0.0.0"  # noqa: S104 - a webhook pod must accept the apiserver's connections
    port: int = 8443
    #: Server processes sharing the port (SO_REUSEPORT), each with its own GIL and model cache;
    #: 1 serves from the command's own process.
    processes: int = 1
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: After SIGTERM: answer /readyz 503 this long, so endpoints drop the pod before it stops.
    shutdown_delay_seconds: float = 2.0
    #: Then give in-flight requests this long to finish.
    shutdown_timeout_seconds: int = 10


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """Mounted certificate files (cert-manager) or a self-bootstrapped CA shared through a Secret."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None  # the bundle `--register` writes with mounted certificates
    bootstrap: bool = False
    namespace: str = MODEL_NAMESPACE
    ca_secret: str = DEFAULT_CA_SECRET
    service_name: str = DEFAULT_SERVICE_NAME
    extra_dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ("127.0.0.1",)
    ca_validity_days: int = 3650
    cert_validity_days: int = 365
    #: Renew a certificate once this fraction of its lifetime has passed (cert-manager uses 2/3).
    renew_after_fraction: float = 2 / 3
    #: How often mounted files are compared with what is being served.
    reload_interval_seconds: float = 10.0

    @property
    def mounted(self) -> bool:
        return bool(self.cert_file and self.key_file)

    def dns_names(self) -> tuple[str, ...]:
        svc, ns = self.service_name, self.namespace
        names = (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")
        return names + tuple(n for n in self.extra_dns_names if n not in names)


@dataclass(frozen=True, slots=True)
class RegistrationSettings:
    """Which webhook configurations carry our caBundle, and whether we write them ourselves."""

    configuration_name: str = DEFAULT_CONFIGURATION_NAME
    #: Create/update both configurations pointing at this URL (local runs, demo, tests).
    register_url: str | None = None
    #: Patch the caBundle of existing configurations (self-bootstrapped TLS in a cluster).
    patch_ca_bundle: bool = True


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    tls: TLSSettings = field(default_factory=TLSSettings)
    registration: RegistrationSettings = field(default_factory=RegistrationSettings)
    kube: ClientSettings = field(default_factory=ClientSettings)
    model_namespace: str = MODEL_NAMESPACE
    log_level: str = "info"
    log_json: bool = False
