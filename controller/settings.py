"""Settings of the controller process: one object, built from flags and GPUPLACE_* env in main()."""

from __future__ import annotations

from dataclasses import dataclass, field

from placement.annotations import LEGACY_NODE_LABEL
from placement.dra import DraSettings, Enforcement
from placement.grants import NodeSelector
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE


@dataclass(frozen=True, slots=True)
class BinderSettings:
    scheduler_name: str = "gpuplace"
    legacy_scheduler_names: tuple[str, ...] = ("gpu-scheduler",)
    legacy: bool = True
    #: Namespaces (by their labels) whose pods are placed, and hold GPUs, by a gpu-scheduling-map
    #: line of their own; None: every namespace (controller/legacyscope.py).
    legacy_namespace_selector: NodeSelector | None = None
    require_inventory: bool = True
    #: Bindings in flight. The apiserver (and etcd, which batches concurrent writes) takes more
    #: binds a second the more arrive at once: on one two-core local control plane (200 kwok
    #: nodes, a backlog of 1,000 pods) 32, 64 and 128 bound about 350, 420 and 460 pods/s; at
    #: 1,000 nodes and 5,000 pods, 128 bound 821, 822 and 732 pods/s and 256 bound 956, 907 and
    #: 891 (alternating on one cluster). They go out from one thread (`kubeio/loop.py`), one
    #: connection each; a connection idle for 90 s is closed.
    bind_workers: int = 256
    #: When the leadership ends, how long the binder waits for the answers to the Bindings it
    #: already sent before the Lease may be released (sent after: none). Past it, the Lease is
    #: left to expire instead of being released.
    drain_seconds: float = 5.0
    #: Unschedulable pods are re-examined at least this often even with no triggering event.
    flush_seconds: float = 30.0
    #: A pod seen before its ResourceClaim exists (dra enforcement) is reported ClaimPending only
    #: if it still waits this long: kube-controller-manager normally generates it in milliseconds.
    claim_pending_report_seconds: float = 2.0
    max_backoff_seconds: float = 10.0
    #: Secret (in the controller's namespace) holding the key Bindings are signed with.
    key_secret_name: str = "gpuplace-binding-key"  # noqa: S105 - a name, not a secret


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    kubeconfig: str | None = None
    identity: str = ""
    system_namespace: str = MODEL_NAMESPACE
    inventory_namespace: str = INVENTORY_NAMESPACE
    lease_name: str = "gpuplace-controller"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0
    alias_label: str = LEGACY_NODE_LABEL
    #: Which forms of a map the cluster source reads: labelled ConfigMaps, PlacementMap custom
    #: resources (the custom resource wins where both declare a map with the same content).
    configmap_maps: bool = True
    resource_maps: bool = True
    metrics_host: str = "0.0.0.0"  # noqa: S104 - a pod's metrics port listens on all interfaces
    metrics_port: int = 8080
    #: The read-only web view (controller/webview.py): "host:port", or "" for none.
    web_address: str = ""
    #: Ask the web view's callers for a bearer token (TokenReview + SubjectAccessReview on
    #: services/proxy of `web_service` in the system namespace): for a view exposed beyond
    #: `kubectl port-forward`.
    web_authenticate: bool = False
    web_service: str = "gpuplace-controller"
    resync_seconds: float = 300.0
    #: A map's status is rewritten within half a second of any change, except when only its
    #: bound-slot count moved: that goes out at most this often, or a burst of binds would cost a
    #: ConfigMap write (and a validating-webhook call) per map every half second.
    status_bound_seconds: float = 5.0
    binder: BinderSettings = field(default_factory=BinderSettings)
    #: `dra`: the binder allocates each pod's ResourceClaim to its declared devices before binding.
    enforcement: Enforcement = Enforcement.ENV
    dra: DraSettings = field(default_factory=DraSettings)
    #: Namespaces that no grant of the placement policy names may place nowhere (True) or
    #: anywhere (False, a new install's default).
    grants_default_deny: bool = False
    #: Test hook: stretches the leader's start-up by this long (informer sync, compile and cache
    #: rebuild on a large cluster can take longer than the lease).
    startup_delay_seconds: float = 0.0
    log_level: str = "info"
    log_json: bool = False
