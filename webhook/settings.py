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
#: Bytes of requests every connection may buffer without drawing on the shared pool: the head
#: (at most 64 KiB) and a pod's review fit, so small admissions never wait on a flood of bodies.
CONNECTION_SHARE_BYTES = 128 * 1024
#: Defaults for the whole server (every process of a pod together), sized for the chart's 512 MiB
#: limit per webhook pod with one process:
#: - about 70 MiB a process before any connection (interpreter, Flask, the model cache of a small
#:   model);
#: - 512 connections x about 30 KiB each open (TLS state, buffers, objects): 15 MiB;
#: - request bytes: 512 x 128 KiB shares + a 64 MiB pool (twenty-one 3 MiB bodies at once) =
#:   `DEFAULT_MAX_BUFFERED_BYTES`, 128 MiB; a map being validated keeps its bytes until answered;
#: - answers a client leaves unread: 512 x (64 KiB + one answer), about 64 MiB at worst;
#: - the requests being answered: up to 3 a process (its loop and 2 validation threads) bodies of
#:   3 MiB decoded into Python objects, about 90 MiB at worst.
#: About 360 MiB in all. The caps hold for the server as a whole: with `processes` N each process
#: gets 1/N of them (`ServerSettings.per_process`). What each further process adds of its own,
#: its interpreter and model cache and the bodies its loop and validation thread decode, the caps
#: do not cover: about 130 MiB a process, for the memory limit to allow.
DEFAULT_MAX_CONNECTIONS = 512
#: 0: half of `max_connections` to one client address (`kubeio.bounds.Bounds.per_client`): a
#: tenant alone never holds the port, yet the apiserver (one address, or one per apiserver
#: replica; behind a NAT or konnectivity every replica's) opens a connection per admission in
#: flight and keeps room for 256 at once on each webhook replica by default. A client at its cap
#: loses its own longest-waiting connection for the new one, so an apiserver's pool only turns
#: over.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 0
DEFAULT_MAX_BUFFERED_BYTES = DEFAULT_MAX_CONNECTIONS * CONNECTION_SHARE_BYTES + 64 * 1024 * 1024
DEFAULT_VALIDATION_THREADS = 2
DEFAULT_VALIDATION_QUEUE_PER_NAMESPACE = 4
DEFAULT_VALIDATION_QUEUE = 32


@dataclass(frozen=True, slots=True)
class ProcessCaps:
    """One server process's share of the server's caps (`ServerSettings.per_process`)."""

    max_connections: int
    max_connections_per_client: int
    max_buffered_bytes: int
    validation_threads: int
    validation_queue_per_namespace: int
    validation_queue: int

    @property
    def pool_bytes(self) -> int:
        """What bodies larger than a connection's share draw on, all connections together."""
        return self.max_buffered_bytes - self.max_connections * CONNECTION_SHARE_BYTES


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
    # The caps below hold for the server, all its processes together: each process keeps
    # 1/`processes` of them (`per_process`), so the pod's worst case does not grow with processes.
    #: Open connections; past it a new one takes the place of the connection that has waited the
    #: longest on its client, or is closed at once.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Open connections of one client address; past it the client's own longest-waiting
    #: connection makes room for its new one. 0: half of `max_connections`.
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    #: Request bytes buffered, all connections together: each connection's
    #: `CONNECTION_SHARE_BYTES`, the rest a pool larger bodies draw on (past it: 503).
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    #: Threads that validate placement maps (seconds each for a large map), off the loop; each
    #: process has at least one.
    validation_threads: int = DEFAULT_VALIDATION_THREADS
    #: Validations queued or running, per namespace and in all; past either: refused at once.
    #: Each process has at least one of each.
    validation_queue_per_namespace: int = DEFAULT_VALIDATION_QUEUE_PER_NAMESPACE
    validation_queue: int = DEFAULT_VALIDATION_QUEUE
    #: A new connection's TLS handshake must end within this long.
    handshake_timeout_seconds: float = 10.0
    #: A request's line and headers must arrive within this long of its first byte.
    head_timeout_seconds: float = 10.0
    #: The whole request, body included, must arrive within this long of its first byte.
    request_timeout_seconds: float = 30.0
    #: A connection with no request in progress is closed after this long.
    idle_timeout_seconds: float = 120.0
    #: An answer the client does not read (no progress) for this long closes its connection.
    write_timeout_seconds: float = 10.0
    #: After SIGTERM: answer /readyz 503 this long, so endpoints drop the pod before it stops.
    shutdown_delay_seconds: float = 2.0
    #: Then give in-flight requests this long to finish.
    shutdown_timeout_seconds: int = 10

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be at least 1, not {self.processes}")
        if min(self.max_connections, self.validation_threads) < 1:
            raise ValueError("max connections and validation threads must be at least 1")
        if min(self.validation_queue_per_namespace, self.validation_queue) < 1:
            raise ValueError("the validation queue's caps must be at least 1")
        if not 0 <= self.max_connections_per_client <= self.max_connections:
            raise ValueError(
                f"max connections per client {self.max_connections_per_client} must be between "
                f"1 and max connections {self.max_connections} (0: half of them)"
            )
        if self.max_connections < self.processes:
            raise ValueError(
                f"max connections {self.max_connections} leave none to some of the "
                f"{self.processes} processes: give at least {self.processes}"
            )
        caps = self.per_process()
        if caps.pool_bytes < self.max_body_bytes - CONNECTION_SHARE_BYTES:
            least = self.processes * (
                caps.max_connections * CONNECTION_SHARE_BYTES + self.max_body_bytes
            )
            each = "" if self.processes == 1 else f" in each of the {self.processes} processes"
            raise ValueError(
                f"max buffered bytes {self.max_buffered_bytes} leave no room for one body of "
                f"max body bytes {self.max_body_bytes} besides the connections' shares of "
                f"{CONNECTION_SHARE_BYTES}{each}: give at least {least}"
            )

    def _per_client(self) -> int:
        return self.max_connections_per_client or max(1, self.max_connections // 2)

    def per_process(self) -> ProcessCaps:
        """What each of the `processes` keeps: the caps divided between them (rounded down, so
        together they stay within the caps), with at least one validation thread and one place
        in each validation queue a process, and one connection a client."""
        n = self.processes
        return ProcessCaps(
            max_connections=self.max_connections // n,
            max_connections_per_client=self._per_client() // n or 1,
            max_buffered_bytes=self.max_buffered_bytes // n,
            validation_threads=max(1, self.validation_threads // n),
            validation_queue_per_namespace=max(1, self.validation_queue_per_namespace // n),
            validation_queue=max(1, self.validation_queue // n),
        )


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
