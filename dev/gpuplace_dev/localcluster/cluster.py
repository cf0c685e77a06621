"""`LocalCluster`: etcd, kube-apiserver, kube-controller-manager, kwok (and optionally
kube-scheduler) on loopback, with TLS, RBAC and admission webhooks, as real as a cluster without
kubelets gets."""

from __future__ import annotations

import atexit
import base64
import concurrent.futures
import contextlib
import dataclasses
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl

import yaml

from gpuplace_dev.localcluster import crds, network, policies
from gpuplace_dev.localcluster.binaries import ControlPlaneBinaries, find_binaries
from gpuplace_dev.localcluster.layout import ClusterLayout, ClusterState
from gpuplace_dev.localcluster.nodebinaries import NodeBinaries, find_node_binaries
from gpuplace_dev.localcluster.nodes import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, FakeNode
from gpuplace_dev.localcluster.pki import CertificateAuthority, CertKeyPair, SigningKey
from gpuplace_dev.localcluster.process import (
    ManagedProcess,
    ProcessRecord,
    first_exited,
    spawn,
    stop_all,
    stop_records,
)
from gpuplace_dev.localcluster.realnode import (
    BRIDGE,
    POD_GATEWAY,
    REAL_NODE_NAME,
    TENANT_ADDRESSES,
    NodeLock,
    RealNode,
    RealNodeError,
    RealNodeLayout,
    cleanup,
    cni_config,
    containerd_args,
    containerd_config,
    import_images,
    kubelet_args,
    kubelet_configuration,
    node_directory,
    node_env,
    node_images,
    record_created_paths,
    remove_node_directory,
)
from kubeio import bodies
from kubeio.client import Kube
from kubeio.errors import APITransportError
from kubeio.paths import (
    NAMESPACES,
    NODES,
    PODS,
    SERVICE_ACCOUNTS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from kubeio.requests import prepare
from placement.annotations import NODE_ANNOTATION

SERVICE_CIDR = "10.96.0.0/16"
#: The first address of SERVICE_CIDR: the `kubernetes` Service, named in the serving certificate.
KUBERNETES_SERVICE_IP = "10.96.0.1"
#: kwok's pod IP pool: all pods on all fake nodes draw from it, so it must be large.
POD_CIDR = "10.128.0.1/9"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "admin"
#: The apiserver's client certificate towards kubelets (logs, exec, port-forward), as in kubeadm.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"
#: Controllers that need a cloud provider or pod CIDR allocation, neither of which exists here.
_DISABLED_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
    "node-ipam-controller",
)
#: The controller that turns a node whose kubelet stopped reporting Unknown and taints it
#: (`node_lifecycle`).
_NODE_LIFECYCLE = "node-lifecycle-controller"
_POLL_SECONDS = 0.05


class ClusterError(RuntimeError):
    """The local cluster failed to start, or a component of it stopped."""


class KubectlError(RuntimeError):
    """kubectl exited with a non-zero status; the message carries its stderr."""

    def __init__(self, argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"kubectl {' '.join(argv)} exited with status {result.returncode}: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
        self.result = result


class LocalCluster:
    """A control plane on random loopback ports; see `gpuplace_dev.localcluster` for the API.

    ``directory``: where certificates, kubeconfigs, etcd data and logs go; a new temporary
    directory (removed by `stop`) when None, else created if needed and left in place.
    ``scheduler``: also run kube-scheduler (`start_scheduler` / `stop_scheduler` do it later).
    ``scheduler_qps``: the scheduler's client QPS (burst twice that), through a
    KubeSchedulerConfiguration file; None keeps kube-scheduler's defaults (50 QPS, burst 100),
    which throttle it long before it runs out of CPU when thousands of pods arrive at once.
    ``detach``: children outlive this Python process (``gpuplace cluster up``); otherwise they are
    killed when it exits, however it exits (atexit, SIGTERM, and the kernel's parent-death signal,
    which fires when the *thread* that started the cluster ends: start it from the main thread).
    ``real_nodes``: 1 adds a real node (`gpuplace_dev.localcluster.realnode`): containerd and a
    kubelet on this machine, registered as Node ``localhost`` and Ready when `start` returns;
    ``real_node`` then gives its files and ``ctr``. Only one runs on a machine at a time; `start`
    waits up to ``node_lock_timeout`` seconds for another to stop. ``real_node_labels`` are the
    Node's labels (kubelet ``--node-labels``), ``kubelet_args`` more kubelet flags.
    ``node_binaries`` overrides the built node components (default: `find_node_binaries`).
    ``pod_network``: pods on the real node reach the apiserver through the `kubernetes` Service and
    the apiserver reaches webhook Services' pods (gpuplace_dev.localcluster.network), as an installed
    chart needs; needs ``real_nodes=1`` and iptables. ``policies``: install the local copies of
    the chart's admission policies (off when the chart itself is installed: it owns them).
    ``trace_endpoint``: an OTLP/gRPC collector (``host:port``) the apiserver sends the spans of
    requests that arrive with a sampled W3C ``traceparent`` from a ``system:masters`` client;
    it samples nothing else (a benchmark traces its own requests only).
    ``node_lifecycle``: False leaves kube-controller-manager's node lifecycle controller off, so
    that nodes nothing heartbeats (no kwok annotation) keep the Ready condition they were created
    with instead of turning Unknown and tainted after its grace period.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        scheduler: bool = False,
        scheduler_qps: float | None = None,
        detach: bool = False,
        namespaces: Iterable[str] = (),
        binaries: ControlPlaneBinaries | None = None,
        startup_timeout: float = 120.0,
        real_nodes: int = 0,
        real_node_labels: Mapping[str, str] | None = None,
        kubelet_args: Sequence[str] = (),
        node_binaries: NodeBinaries | None = None,
        node_lock_timeout: float = 900.0,
        trace_endpoint: str | None = None,
        pod_network: bool = False,
        policies: bool = True,
        node_lifecycle: bool = True,
    ) -> None:
        if real_nodes not in (0, 1):
            raise ValueError(
                f"real_nodes must be 0 or 1 (one real node per machine), got {real_nodes}"
            )
        if pod_network and not real_nodes:
            raise ValueError("pod_network needs the real node (real_nodes=1)")
        self._pod_network = pod_network
        self._policies = policies
        self._node_lifecycle = node_lifecycle
        self._real_nodes = real_nodes
        self._real_node_labels = dict(real_node_labels or {})
        self._kubelet_args = tuple(kubelet_args)
        self._node_binaries = node_binaries
        self._node_lock_timeout = node_lock_timeout
        self._trace_endpoint = trace_endpoint
        self._node_lock = NodeLock()
        self._real_node: RealNode | None = None
        self._owns_directory = directory is None
        self._directory = directory
        self._with_scheduler = scheduler
        if scheduler_qps is not None and scheduler_qps <= 0:
            raise ValueError(f"scheduler_qps must be positive, got {scheduler_qps}")
        self._scheduler_qps = scheduler_qps
        self._scheduler: ManagedProcess | None = None
        self._detach = detach
        self._namespaces = tuple(namespaces)
        self._binaries = binaries
        self._startup_timeout = startup_timeout
        self._processes: list[ManagedProcess] = []
        self._records: tuple[ProcessRecord, ...] = ()
        self._server = ""
        self._ssl_context: ssl.SSLContext | None = None
        self._kube: Kube | None = None
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        #: Seconds from `start()` to a usable cluster, and the time of each phase.
        self.startup_seconds = 0.0
        self.startup_phases: dict[str, float] = {}

    # ----------------------------------------------------------------------------- lifecycle

    @classmethod
    def attach(cls, directory: Path) -> LocalCluster:
        """The cluster that ``gpuplace cluster up`` (or ``detach=True``) left running in ``directory``."""
        layout = ClusterLayout(directory)
        if not layout.state_file.is_file():
            raise ClusterError(
                f"{directory}: no cluster state (state.json); is a cluster up there?"
            )
        try:
            state = ClusterState.read(layout.state_file)
        except ValueError as error:
            raise ClusterError(str(error)) from error
        cluster = cls(directory)
        cluster._server = state.server
        cluster._records = state.processes
        cluster._real_nodes = 1 if (layout.directory / "node").is_dir() else 0
        cluster.startup_seconds = state.startup_seconds
        cluster._started = True
        return cluster

    def start(self) -> Self:
        """Starts every component and waits until the cluster serves; stops everything on failure."""
        if self._started:
            raise ClusterError("this LocalCluster was already started; create a new one")
        self._started = True
        began = time.monotonic()
        try:
            self._start(began)
        except BaseException:
            self.stop(keep_directory=True)
            raise
        self.startup_seconds = time.monotonic() - began
        self._write_state()
        return self

    def stop(self, *, keep_directory: bool = False) -> None:
        """Stops every process this cluster started (SIGTERM, then SIGKILL). Idempotent."""
        with self._lock:
            if self._stopped or not self._started:
                return
            self._stopped = True
        _registry.discard(self)
        if self._kube is not None:
            self._kube.close()
        if self._processes:
            stop_all(self._processes)
        else:
            stop_records(self._records)
        if self._directory is not None and self._real_nodes:
            problems = cleanup(self._node_layout())
            remove_node_directory(self.directory / "node")
            self._node_lock.release()
            if problems:
                print("gpuplace: the real node left: " + "; ".join(problems), file=sys.stderr)
        if self._directory is not None:
            layout = ClusterLayout(self._directory)
            layout.state_file.unlink(missing_ok=True)
            if self._owns_directory and not keep_directory:
                shutil.rmtree(self._directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self if self._started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def running(self) -> bool:
        """True while every component that was started still runs."""
        if self._processes:
            return all(p.exit_code() is None for p in self._processes)
        return bool(self._records) and all(r.alive() for r in self._records)

    def check_alive(self) -> None:
        """Raises `ClusterError` with the log tail of the first component that has exited."""
        exited = first_exited(self._processes)
        if exited is not None:
            raise ClusterError(exited)
        for record in self._records:
            if not record.alive():
                raise ClusterError(
                    f"{record.name} (pid {record.pid}) is not running; see {record.log}"
                )

    # ----------------------------------------------------------------------------- access

    @property
    def directory(self) -> Path:
        if self._directory is None:
            raise ClusterError("the cluster has no directory before start()")
        return self._directory

    @property
    def layout(self) -> ClusterLayout:
        return ClusterLayout(self.directory)

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user ``admin``, group ``system:masters``)."""
        return self.layout.kubeconfig

    @property
    def server(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        return self._server

    @property
    def ca_file(self) -> Path:
        """The cluster CA certificate (PEM): it signs the apiserver's and every client certificate."""
        return self.layout.ca_cert

    @property
    def ca(self) -> CertificateAuthority:
        """The cluster CA, to issue more certificates (test webhooks, extra users)."""
        layout = self.layout
        return CertificateAuthority.load(layout.ca_cert.read_bytes(), layout.ca_key.read_bytes())

    @property
    def binaries(self) -> ControlPlaneBinaries:
        if self._binaries is None:
            self._binaries = find_binaries()
        return self._binaries

    @property
    def bin_dir(self) -> Path:
        return self.binaries.bin_dir

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs

    @property
    def real_node(self) -> RealNode:
        """The real node (``real_nodes=1``): name, layout, binaries, ``ctr(...)``."""
        if self._real_node is None:
            if not self._real_nodes:
                raise ClusterError("this cluster has no real node; start it with real_nodes=1")
            self._real_node = RealNode(self._node_layout(), find_node_binaries(build=False))
        return self._real_node

    def _node_layout(self) -> RealNodeLayout:
        return RealNodeLayout(node_directory(self.directory / "node"))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Runs the pinned kubectl against this cluster as admin; raises `KubectlError` if ``check``."""
        argv = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={"KUBECACHEDIR": str(self.layout.kubectl_cache), "HOME": str(self.directory)},
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts the cluster CA and presents the admin certificate."""
        if self._ssl_context is None:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            context.load_cert_chain(self.layout.cert(ADMIN_USER), self.layout.key(ADMIN_USER))
            self._ssl_context = context
        return self._ssl_context

    @property
    def kube(self) -> Kube:
        """The admin client (thread-safe, keeps connections alive): gpuplace's one HTTP client."""
        with self._lock:
            if self._kube is None:
                self._kube = self.admin_client()
            return self._kube

    def admin_client(self, server: str | None = None) -> Kube:
        """A new admin client of `server` (default: the apiserver), trusting the cluster CA and
        presenting the admin certificate: also for servers with a certificate of that CA, such as
        the webhook's /metrics."""
        cert, key = self.layout.cert(ADMIN_USER), self.layout.key(ADMIN_USER)
        return Kube.with_client_certificate(server or self.server, self.ca_file, cert, key)

    def _install_crds(self) -> None:
        """placementmaps.gpuplace.io and placementpolicies.gpuplace.io, as the chart installs
        them; returns once the apiserver serves both."""
        try:
            names = crds.create(self.request)
        except crds.CrdError as error:
            raise ClusterError(str(error)) from error
        self.wait_for(
            "gpuplace's CRDs to be Established",
            lambda: crds.established(self.request, names),
            timeout=60,
            interval=0.1,
        )

    def _install_policies(self) -> None:
        """The chart's ValidatingAdmissionPolicies, so every test runs under them."""
        self._create_policies(policies.local_copies(policies.AGENT, policies.CONTROLLER))

    def _create_policies(self, objects: list[dict[str, Any]]) -> None:
        resources = {
            "ValidatingAdmissionPolicy": VALIDATING_ADMISSION_POLICIES,
            "ValidatingAdmissionPolicyBinding": VALIDATING_ADMISSION_POLICY_BINDINGS,
        }
        for obj in objects:
            status, body = self.request("POST", resources[obj["kind"]].collection(), obj)
            if status not in (201, 409):
                raise ClusterError(f"installing {obj['kind']} {obj['metadata']['name']}: {body}")

    def audit_events(self) -> list[dict[str, Any]]:
        """The apiserver's audit events so far (see `_AUDIT_POLICY`: Bindings only)."""
        path = self.layout.audit_log
        if not path.exists():
            return []
        events = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line being written
        return events

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One admin request; returns (status, decoded JSON body or None) whatever the status,
        for callers that branch on it. PATCH bodies are JSON merge patches."""
        path, _, query = path.partition("?")
        request = prepare(method, path, body=body, headers=headers)
        if query:
            request = dataclasses.replace(request, query=tuple(parse_qsl(query)))
        response = self.kube.send(request, timeout=timeout)
        return response.status, response.json()

    # ----------------------------------------------------------------------------- objects

    def create_namespace(
        self, name: str, *, labels: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        """Creates a namespace (if missing) and waits for its ``default`` ServiceAccount, without
        which the ServiceAccount admission plugin rejects pods."""
        body = bodies.namespace(name, labels)
        status, response = self.request("POST", NAMESPACES.collection(), body)
        if status not in {201, 409}:
            raise ClusterError(f"creating namespace {name}: HTTP {status}: {_message(response)}")
        self.wait_for(
            f"ServiceAccount default in namespace {name}",
            lambda: self._status(SERVICE_ACCOUNTS.item("default", name)) == 200,
            timeout,
        )

    def install_pod_binding_policy(self, *, timeout: float = 60.0) -> None:
        """Installs the ValidatingAdmissionPolicy that the Helm chart ships (bindings nobody can
        forge or rewrite) and waits until the apiserver enforces it."""
        self._create_policies(policies.local_copies(policies.POD_BINDINGS))
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "policy-probe", "annotations": {NODE_ANNOTATION: "x"}},
            "spec": {"containers": [{"name": "c", "image": "probe"}]},
        }
        self.wait_for(
            "the pod binding policy to be enforced",
            lambda: (
                self.request("POST", f"{PODS.collection('default')}?dryRun=All", probe)[0] == 403
            ),
            timeout,
            interval=0.2,
        )

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 120.0) -> None:
        """Deletes a namespace; ``wait`` until the namespace controller has emptied and removed it."""
        status, response = self.request("DELETE", NAMESPACES.item(name))
        if status not in {200, 202, 404}:
            raise ClusterError(f"deleting namespace {name}: HTTP {status}: {_message(response)}")
        if wait:
            self.wait_for(
                f"namespace {name} to be deleted",
                lambda: self._status(NAMESPACES.item(name)) == 404,
                timeout,
            )

    def create_nodes(
        self, nodes: Iterable[FakeNode], *, wait_ready: bool = True, timeout: float = 120.0
    ) -> list[str]:
        """Creates kwok-managed nodes (concurrently) and, by default, waits until all are Ready."""
        manifests = [node.manifest() for node in nodes]
        names = [m["metadata"]["name"] for m in manifests]

        workers = max(1, min(16, len(manifests) // 8))

        def create(chunk: list[dict[str, Any]]) -> None:
            for manifest in chunk:
                status, response = self.request("POST", NODES.collection(), manifest)
                if status != 201:
                    raise ClusterError(
                        f"creating node {manifest['metadata']['name']}: HTTP {status}: "
                        f"{_message(response)}"
                    )

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            chunks = [manifests[i::workers] for i in range(workers)]
            for future in [pool.submit(create, chunk) for chunk in chunks]:
                future.result()
        if wait_ready:
            self.wait_nodes_ready(names, timeout=timeout)
        return names

    def wait_nodes_ready(self, names: Iterable[str], *, timeout: float = 120.0) -> None:
        """Waits until every named node reports condition Ready=True (kwok sets it)."""
        pending = set(names)

        def ready() -> bool:
            # resourceVersion=0: served from the apiserver's watch cache, not a quorum read.
            status, body = self.request("GET", f"{NODES.collection()}?resourceVersion=0")
            if status != 200:
                return False
            for item in body.get("items", []):
                conditions = item.get("status", {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    pending.discard(item["metadata"]["name"])
            return not pending

        self.wait_for(
            lambda: f"nodes Ready (still waiting for {', '.join(sorted(pending)[:5])})",
            ready,
            timeout,
            interval=0.2,
        )

    # ----------------------------------------------------------------------------- startup

    def _start(self, began: float) -> None:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="gpuplace-cluster-"))
        else:
            self._directory.mkdir(parents=True, exist_ok=True)
        layout = self.layout
        layout.create()
        binaries = self.binaries
        node_binaries = None
        if self._real_nodes:
            node_binaries = self._node_binaries or find_node_binaries()
        self._phase("binaries", began)
        if self._real_nodes:
            self._node_lock.acquire(
                self._node_lock_timeout,
                on_wait=lambda: print(
                    f"gpuplace: waiting for the real node of another cluster to stop "
                    f"({self._node_lock.path})",
                    file=sys.stderr,
                ),
            )
            self._phase("real node lock", began)

        etcd_port, etcd_peer_port, apiserver_port = _free_ports(3)
        self._server = f"https://127.0.0.1:{apiserver_port}"
        self._write_pki(layout)
        self._phase("certificates", began)

        if not self._detach:
            _registry.add(self)
        env = _component_env(layout)
        self._start_apiserver(binaries, env, etcd_port, etcd_peer_port, apiserver_port, began)
        self._start_controllers(binaries, env, began)
        if node_binaries is not None:
            self._start_real_node(node_binaries, began)
        for namespace in self._namespaces:
            self.create_namespace(namespace)
        self._phase("namespaces", began)
        if self._policies:
            self.install_pod_binding_policy()
            self._phase("pod binding policy", began)

    def _start_apiserver(
        self,
        binaries: ControlPlaneBinaries,
        env: dict[str, str],
        etcd_port: int,
        etcd_peer_port: int,
        apiserver_port: int,
        began: float,
    ) -> None:
        """etcd and kube-apiserver; returns once the apiserver is ready, with gpuplace's CRDs and
        policies installed."""
        layout = self.layout
        self._spawn("etcd", _etcd_args(binaries, layout, etcd_port, etcd_peer_port), env)
        layout.audit_policy.write_text(_AUDIT_POLICY)
        args = _apiserver_args(binaries, layout, apiserver_port, etcd_port)
        if self._pod_network:
            # Webhook Services are dialled at their endpoints (pod addresses on the bridge).
            args.append("--enable-aggregator-routing=true")
        if self._trace_endpoint is not None:
            layout.tracing_config.write_text(_tracing_config(self._trace_endpoint))
            args.append(f"--tracing-config-file={layout.tracing_config}")
        # The apiserver retries etcd until it answers, so both start at once.
        self._spawn("kube-apiserver", args, env)
        self.wait_for("kube-apiserver /readyz", lambda: self._status("/readyz") == 200)
        self._phase("apiserver ready", began)
        self._install_crds()
        self._phase("CRDs established", began)
        if self._policies:
            self._install_policies()

    def _start_controllers(
        self, binaries: ControlPlaneBinaries, env: dict[str, str], began: float
    ) -> None:
        """kube-controller-manager, kwok (and kube-scheduler); returns once the controller
        manager works."""
        layout = self.layout
        # kube-controller-manager gives up if the apiserver is not healthy within 10 seconds, so
        # the clients start only now.
        disabled = _DISABLED_CONTROLLERS + (() if self._node_lifecycle else (_NODE_LIFECYCLE,))
        args = _controller_manager_args(binaries, layout, disabled)
        self._spawn("kube-controller-manager", args, env)
        layout.kwok_config.write_text(_KWOK_CONFIG)
        self._spawn("kwok", _kwok_args(binaries, layout), env)
        if self._with_scheduler:
            self._start_scheduler()
        # The serviceaccount controller creating `default` proves the controller manager runs with
        # working credentials (it uses per-controller service-account tokens, as kubeadm does).
        self.wait_for(
            "kube-controller-manager (ServiceAccount default/default)",
            lambda: self._status(SERVICE_ACCOUNTS.item("default", "default")) == 200,
        )
        self._phase("controller-manager ready", began)

    def _start_real_node(self, binaries: NodeBinaries, began: float) -> None:
        """containerd, the images, then the kubelet; returns once the Node is Ready."""
        node = RealNodeLayout(node_directory(self.directory / "node", create=True))
        for directory in (node.directory, node.cni_conf_dir, node.cdi_dir, node.pod_logs):
            directory.mkdir(parents=True, exist_ok=True)
        record_created_paths(node)
        self._real_node = RealNode(node, binaries)
        env = node_env(binaries, node)
        lock = () if self._node_lock.fd is None else (self._node_lock.fd,)
        node.containerd_config.write_text(containerd_config(node, binaries))
        services = SERVICE_CIDR if self._pod_network else None
        (node.cni_conf_dir / "10-gpuplace.conflist").write_text(
            json.dumps(cni_config(node, services), indent=2)
        )
        if self._pod_network:
            try:
                network.install(
                    node.network_record,
                    bridge=BRIDGE,
                    gateway=POD_GATEWAY,
                    tenants=TENANT_ADDRESSES,
                    service_ip=KUBERNETES_SERVICE_IP,
                    apiserver_port=int(self._server.rsplit(":", 1)[1]),
                )
            except network.NetworkError as error:
                raise ClusterError(f"the real node's pod network: {error}") from error
        # containerd and the kubelet hold the node lock too, so a detached node keeps it.
        self._spawn("containerd", containerd_args(binaries, node), env, pass_fds=lock)

        def containerd_serves() -> bool:
            if not node.containerd_socket.exists():
                return False
            try:
                self._real_node_ctr("version")
            except RealNodeError:
                return False
            return True

        self.wait_for("containerd serving on its socket", containerd_serves, interval=0.1)
        import_images(binaries, node, node_images(binaries))
        self._phase("containerd ready, images imported", began)

        ca = self.ca
        pair = ca.issue_client(f"system:node:{REAL_NODE_NAME}", organizations=("system:nodes",))
        pair.write(self.layout.cert("kubelet"), self.layout.key("kubelet"))
        node.kubelet_kubeconfig.write_text(
            _kubeconfig(self._server, ca.cert_pem, pair, f"system:node:{REAL_NODE_NAME}")
        )
        node.kubelet_kubeconfig.chmod(0o600)
        ca.issue_server(
            REAL_NODE_NAME, dns_names=(REAL_NODE_NAME,), ip_addresses=("127.0.0.1",)
        ).write(self.layout.cert("kubelet-serving"), self.layout.key("kubelet-serving"))
        config = kubelet_configuration(
            node,
            port=_free_ports(1)[0],
            ca_file=self.layout.ca_cert,
            serving_cert=self.layout.cert("kubelet-serving"),
            serving_key=self.layout.key("kubelet-serving"),
        )
        node.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = kubelet_args(binaries, node, labels=self._real_node_labels, extra=self._kubelet_args)
        self._spawn("kubelet", argv, env, pass_fds=lock)
        self.wait_nodes_ready([REAL_NODE_NAME], timeout=self._startup_timeout)
        self._phase("real node Ready", began)

    def _real_node_ctr(self, *args: str) -> None:
        assert self._real_node is not None
        self._real_node.ctr(*args, timeout=5.0)

    def _spawn(
        self, name: str, argv: list[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> ManagedProcess:
        process = spawn(
            name, argv, log=self.layout.log(name), env=env, detach=self._detach, pass_fds=pass_fds
        )
        self._processes.append(process)
        return process

    def _start_scheduler(self) -> None:
        layout = self.layout
        argv = _scheduler_args(self.binaries, layout)
        if self._scheduler_qps is not None:
            config = scheduler_configuration(
                layout.component_kubeconfig("kube-scheduler"), self._scheduler_qps
            )
            layout.scheduler_config.write_text(yaml.safe_dump(config, sort_keys=False))
            argv.append(f"--config={layout.scheduler_config}")
        self._scheduler = self._spawn("kube-scheduler", argv, _component_env(layout))

    def start_scheduler(self) -> None:
        """Starts kube-scheduler on a running cluster (no-op while it runs), e.g. to time how fast
        it drains pods created while it was stopped."""
        if not self._processes:
            raise ClusterError("start_scheduler needs a cluster started by this process")
        if self._scheduler is not None and self._scheduler.exit_code() is None:
            return
        if self._scheduler is not None:
            self._processes.remove(self._scheduler)
        self._start_scheduler()
        self._write_state()

    def stop_scheduler(self) -> None:
        """Stops kube-scheduler (no-op when it does not run); the rest of the cluster keeps running."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        stop_all([scheduler])
        self._processes.remove(scheduler)
        self._write_state()

    def stop_apiserver(self) -> None:
        """Stops kube-apiserver alone (an outage as clients see it: connections refused); etcd,
        the controller manager and kwok keep running. A stopped apiserver stays stopped."""
        apiserver = next((p for p in self._processes if p.name == "kube-apiserver"), None)
        if apiserver is None:
            raise ClusterError("stop_apiserver needs a cluster started by this process")
        stop_all([apiserver])
        self._processes.remove(apiserver)
        self._write_state()

    def _phase(self, name: str, began: float) -> None:
        self.startup_phases[name] = round(time.monotonic() - began, 3)

    def _write_pki(self, layout: ClusterLayout) -> None:
        ca = CertificateAuthority.generate("gpuplace-local-ca")
        ca.pair.write(layout.ca_cert, layout.ca_key)
        ca.issue_server(
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", KUBERNETES_SERVICE_IP),
        ).write(layout.cert("kube-apiserver"), layout.key("kube-apiserver"))
        SigningKey.generate().write(layout.service_account_key, layout.service_account_pub)
        ca.issue_client(KUBELET_CLIENT, organizations=("system:masters",)).write(
            layout.cert(KUBELET_CLIENT), layout.key(KUBELET_CLIENT)
        )
        users = {
            ADMIN_USER: ("admin", ("system:masters",)),
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            "kube-scheduler": ("system:kube-scheduler", ()),
        }
        for name, (common_name, groups) in users.items():
            pair = ca.issue_client(common_name, organizations=groups)
            pair.write(layout.cert(name), layout.key(name))
            kubeconfig = _kubeconfig(self._server, ca.cert_pem, pair, common_name)
            target = layout.kubeconfig if name == ADMIN_USER else layout.component_kubeconfig(name)
            target.write_text(kubeconfig)
            target.chmod(0o600)

    def _write_state(self) -> None:
        if not self._processes:
            return
        ClusterState(
            server=self._server,
            kubeconfig=self.kubeconfig,
            processes=tuple(p.record for p in self._processes),
            startup_seconds=self.startup_seconds,
        ).write(self.layout.state_file)

    # ----------------------------------------------------------------------------- waiting

    def _status(self, path: str) -> int:
        try:
            status, _ = self.request("GET", path, timeout=5.0)
        except APITransportError:
            return 0
        return status

    def wait_for(
        self,
        what: str | Callable[[], str],
        condition: Callable[[], bool],
        timeout: float | None = None,
        *,
        interval: float = _POLL_SECONDS,
    ) -> None:
        """Polls ``condition`` until true; raises `ClusterError` naming ``what`` after ``timeout``
        seconds (default: the startup timeout), or at once when a component has died."""
        deadline = time.monotonic() + (self._startup_timeout if timeout is None else timeout)
        while not condition():
            self.check_alive()
            if time.monotonic() > deadline:
                described = what if isinstance(what, str) else what()
                raise ClusterError(
                    f"timed out waiting for {described}; component logs are in {self.logs_dir}"
                )
            time.sleep(interval)


# --------------------------------------------------------------------------------- arguments


def _etcd_args(b: ControlPlaneBinaries, layout: ClusterLayout, port: int, peer: int) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    return [
        str(b.etcd),
        "--name=gpuplace",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=gpuplace={peer_url}",
        # A throwaway cluster: durability across power loss buys nothing and fsync costs a lot.
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


#: DRA device taints (KEP-5055, alpha in Kubernetes 1.35): the apiserver keeps `taints` in
#: ResourceSlices and serves DeviceTaintRules (resource.k8s.io/v1alpha3, `DEVICE_TAINT_API`),
#: kube-scheduler heeds them, kube-controller-manager evicts for NoExecute ones.
DEVICE_TAINT_GATES = "--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true"
DEVICE_TAINT_API = "--runtime-config=resource.k8s.io/v1alpha3=true"


def _apiserver_args(
    b: ControlPlaneBinaries, layout: ClusterLayout, port: int, etcd_port: int
) -> list[str]:
    return [
        str(b.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.pki}",
        f"--tls-cert-file={layout.cert('kube-apiserver')}",
        f"--tls-private-key-file={layout.key('kube-apiserver')}",
        f"--client-ca-file={layout.ca_cert}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={layout.service_account_pub}",
        f"--service-account-signing-key-file={layout.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # Kubelets authorize the apiserver's logs, exec and port-forward calls by this certificate.
        f"--kubelet-client-certificate={layout.cert(KUBELET_CLIENT)}",
        f"--kubelet-client-key={layout.key(KUBELET_CLIENT)}",
        f"--kubelet-certificate-authority={layout.ca_cert}",
        # On top of the default plugins (which include MutatingAdmissionWebhook and
        # ValidatingAdmissionWebhook, ServiceAccount, NamespaceLifecycle, ResourceQuota, ...).
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        # 127.0.0.1 is not a valid Endpoints address; nothing in this cluster dials the
        # `kubernetes` Service, so its endpoints are not maintained.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        f"--audit-policy-file={layout.audit_policy}",
        f"--audit-log-path={layout.audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxbackup=1",
        DEVICE_TAINT_GATES,
        DEVICE_TAINT_API,
    ]


def _tracing_config(endpoint: str) -> str:
    # No samplingRatePerMillion: only requests whose (trusted) parent span is sampled are traced.
    return (
        "apiVersion: apiserver.config.k8s.io/v1\n"
        "kind: TracingConfiguration\n"
        f"endpoint: {json.dumps(endpoint)}\n"
    )


#: Who sent each Binding, accepted or refused, and when the apiserver received it: the record
#: against which tests check that a replica that lost its lease sent none (metadata only).
_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create]
    resources: [{group: "", resources: [pods/binding]}]
  - level: None
"""


def _controller_manager_args(
    b: ControlPlaneBinaries, layout: ClusterLayout, disabled: Sequence[str] = _DISABLED_CONTROLLERS
) -> list[str]:
    controllers = ",".join(["*", *(f"-{c}" for c in disabled)])
    return [
        str(b.kube_controller_manager),
        f"--kubeconfig={layout.component_kubeconfig('kube-controller-manager')}",
        "--secure-port=0",
        "--leader-elect=false",
        f"--controllers={controllers}",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.service_account_key}",
        f"--root-ca-file={layout.ca_cert}",
        f"--cluster-signing-cert-file={layout.ca_cert}",
        f"--cluster-signing-key-file={layout.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Benchmarks create thousands of pods a minute; the default 20 QPS would be the bottleneck.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        DEVICE_TAINT_GATES,
    ]


def _scheduler_args(b: ControlPlaneBinaries, layout: ClusterLayout) -> list[str]:
    return [
        str(b.kube_scheduler),
        f"--kubeconfig={layout.component_kubeconfig('kube-scheduler')}",
        "--secure-port=0",
        "--leader-elect=false",
        DEVICE_TAINT_GATES,
    ]


def scheduler_configuration(kubeconfig: Path, qps: float) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with the client's QPS raised (burst twice that); everything
    else, parallelism and the default plugins included, stays at kube-scheduler's defaults.
    With ``--config`` the scheduler takes its kubeconfig and leader election from this file."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": float(qps),
            "burst": max(1, round(2 * qps)),
        },
        "leaderElection": {"leaderElect": False},
    }


def _kwok_args(b: ControlPlaneBinaries, layout: ClusterLayout) -> list[str]:
    return [
        str(b.kwok),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={layout.kwok_config}",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
        f"--cidr={POD_CIDR}",
    ]


# No Stage objects here: kwok then uses its built-in fast stages (node-initialize, node heartbeat
# with leases, pod-ready, pod-complete, pod-delete), so nodes turn Ready and bound pods Running at
# once. The parallelism options keep it ahead of benchmark bursts.
_KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 16
  nodeLeaseDurationSeconds: 40
"""


def _component_env(layout: ClusterLayout) -> dict[str, str]:
    # A fixed environment: no proxy variables or a user's KUBECONFIG leak into the components.
    return {"HOME": str(layout.directory), "PATH": "/usr/bin:/bin"}


def _kubeconfig(server: str, ca_pem: bytes, pair: CertKeyPair, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuplace-local",
                    "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(pair.cert_pem),
                        "client-key-data": b64(pair.key_pem),
                    },
                }
            ],
            "contexts": [
                {"name": "gpuplace-local", "context": {"cluster": "gpuplace-local", "user": user}}
            ],
            "current-context": "gpuplace-local",
        },
        sort_keys=False,
    )


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together, so the kernel cannot repeat one)."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]


def _message(response: Any) -> str:
    if isinstance(response, dict):
        return str(response.get("message", response))
    return str(response)


# --------------------------------------------------------------------------------- cleanup


class _Registry:
    """Attached clusters still running: stopped at interpreter exit and on SIGTERM.

    Strong references on purpose: a cluster dropped without `stop()` is still stopped at exit.
    """

    def __init__(self) -> None:
        self._clusters: set[LocalCluster] = set()
        self._lock = threading.Lock()
        self._atexit_registered = False
        self._previous_sigterm: _SignalHandler | None = None

    def add(self, cluster: LocalCluster) -> None:
        with self._lock:
            self._clusters.add(cluster)
            if not self._atexit_registered:
                atexit.register(self.stop_all)
                self._atexit_registered = True
            if self._previous_sigterm is None:
                self._previous_sigterm = _install_sigterm_handler()

    def discard(self, cluster: LocalCluster) -> None:
        with self._lock:
            self._clusters.discard(cluster)
            previous = self._previous_sigterm
            if not self._clusters and previous is not None and _restore_sigterm_handler(previous):
                self._previous_sigterm = None

    def stop_all(self) -> None:
        with self._lock:
            clusters = list(self._clusters)
        for cluster in clusters:
            cluster.stop()


_SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_registry = _Registry()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum}")


def _install_sigterm_handler() -> _SignalHandler | None:
    """Turns SIGTERM into KeyboardInterrupt, so that cleanup (finally blocks, pytest fixture
    teardown, atexit) runs as on Ctrl-C; only where nobody else handles SIGTERM already.
    Returns the handler it replaced, or None when it installed nothing."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, _on_sigterm)
    return previous


def _restore_sigterm_handler(previous: _SignalHandler) -> bool:
    """Puts the replaced handler back, unless someone else has changed it since."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, previous)
    return True
