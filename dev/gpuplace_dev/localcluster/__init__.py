"""A real local Kubernetes control plane for tests, the demo and benchmarks; no Docker.

etcd, kube-apiserver (TLS, RBAC + Node authorization, service-account issuer and keys, the default
admission plugins including both webhook plugins, plus NodeRestriction), kube-controller-manager
(every controller that needs no cloud, per-controller service-account credentials as in kubeadm)
and kwok (managing nodes annotated ``kwok.x-k8s.io/node: fake`` with its fast stages: nodes turn
Ready, bound pods Running, deleted pods go away) run on random 127.0.0.1 ports; kube-scheduler is
optional (``scheduler=True``, ``scheduler_qps=`` to lift its client rate limit, or
``start_scheduler()`` / ``stop_scheduler()`` later), since gpuplace's binder places its own pods.
Binaries come from `find_binaries` (built into ``~/.cache/gpuplace/k8s-<version>/bin`` by
``hack/build-control-plane.sh`` when missing; ``KUBEBUILDER_ASSETS`` / ``TEST_ASSET_*`` override).

Use::

    from gpuplace_dev.localcluster import LocalCluster, FakeNode, fake_gpu_nodes

    with LocalCluster(namespaces=["inference"]) as cluster:      # start() ... stop()
        cluster.create_nodes(fake_gpu_nodes(3, gpus=8))          # gpu-node-01..03, Ready
        cluster.create_nodes([FakeNode("gpu-a-01", gpus=4, labels={"gpu-node-name": "node1"})])
        cluster.kubectl("apply", "-f", "-", input=manifest_yaml)  # pinned kubectl, admin
        cluster.kube.get("/api/v1/nodes")                         # kubeio.client.Kube, admin
        status, body = cluster.request("POST", path, body)        # raw admin call, JSON in/out

`LocalCluster` (see its docstring for the arguments):

- ``kubeconfig`` (admin: user ``admin``, group ``system:masters``), ``server``
  (``https://127.0.0.1:<port>``), ``ca_file``, ``ca`` (a `CertificateAuthority` that can issue
  more certificates), ``ssl_context()``, ``directory`` / ``logs_dir`` (``logs/<component>.log``),
  ``binaries`` / ``bin_dir``, ``startup_seconds`` / ``startup_phases``.
- ``kubectl(*args, input=None, check=True)`` returns `subprocess.CompletedProcess[str]`; with
  ``check`` a non-zero exit raises `KubectlError` whose message carries kubectl's stderr.
- ``kube`` is the admin `kubeio.client.Kube` (the components' client: thread-safe, keep-alive,
  raises `kubeio.errors.APIError`); ``request(method, path, body=None)`` sends through it and
  returns ``(status, decoded JSON)`` whatever the status, for responses the generated client
  cannot decode, such as ``POST .../pods/<name>/binding`` (PATCH bodies are JSON merge patches).
- ``create_namespace(name, labels=None)`` also waits for the namespace's ``default``
  ServiceAccount (the ServiceAccount admission plugin rejects pods until it exists);
  ``delete_namespace(name, wait=False)``.
- ``create_nodes(nodes, wait_ready=True)`` creates `FakeNode` objects concurrently and waits for
  Ready; ``wait_nodes_ready(names)``. Node names are cluster-wide: pick unique ones.
- ``check_alive()`` raises `ClusterError` with the log tail of a component that died;
  ``wait_for(what, condition, timeout)`` polls a condition and fails early when one died.
- ``LocalCluster.attach(directory)``: the cluster that ``gpuplace cluster up`` left running.

A real node (``LocalCluster(real_nodes=1)``, `gpuplace_dev.localcluster.realnode`): containerd, runc,
CNI plugins and a kubelet on this machine (built by ``hack/build-node.sh`` into
``~/.cache/gpuplace/node``), registered as Node ``localhost``, Ready when ``start()`` returns
(about 1.3 s after the control plane). Pods bound to it run: image ``GPU_PROBE_IMAGE``
(``gpuplace.local/gpu-probe:dev``) prints CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER,
NVIDIA_VISIBLE_DEVICES and every CUDA_/NVIDIA_/GPU_/GPUPLACE_/DRA_ variable, serves the same on
port 8080, then waits for SIGTERM (``--once``: print and exit, for init containers); ``kubectl
logs``, ``exec`` and ``port-forward`` work. ``cluster.real_node`` has ``name``, ``layout``
(``cdi_dir`` for CDI specs, ``plugins_registry`` / ``plugins`` for kubelet plugins such as a DRA
driver), ``binaries`` and ``ctr(...)``. It needs root, and one real node runs per machine at a
time (flock on ``REAL_NODE_LOCK``; ``start()`` waits for it). ``real_node_labels=`` labels the
Node, ``kubelet_args=`` adds kubelet flags (feature gates, say).

Processes run in their own process groups; ``stop()`` sends SIGTERM then SIGKILL to every group.
An attached (default) cluster is also stopped at interpreter exit and on SIGTERM (turned into
KeyboardInterrupt when nobody else handles it), and its children die with the Python process even
on SIGKILL (parent-death signal). ``detach=True`` leaves them running and writes ``state.json``.

To run more processes next to the cluster (a controller, an agent) with the same guarantees, use
``spawn(name, argv, log=cluster.layout.log(name))`` and ``stop_all([...])``.

pytest: ``tests/integration/conftest.py`` provides the session fixture ``cluster`` (this class)
and the per-test fixture ``namespace`` (a fresh namespace name).
"""

from gpuplace_dev.localcluster.binaries import (
    COMPONENTS,
    BinariesError,
    ControlPlaneBinaries,
    bin_dir,
    cache_root,
    find_binaries,
    kubernetes_version,
)
from gpuplace_dev.localcluster.cluster import (
    POD_CIDR,
    SERVICE_CIDR,
    ClusterError,
    KubectlError,
    LocalCluster,
)
from gpuplace_dev.localcluster.images import GPU_PROBE_IMAGE, PAUSE_IMAGE
from gpuplace_dev.localcluster.layout import ClusterLayout, ClusterState
from gpuplace_dev.localcluster.nodebinaries import NodeBinaries, find_node_binaries
from gpuplace_dev.localcluster.nodes import (
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_VALUE,
    FakeNode,
    fake_gpu_nodes,
)
from gpuplace_dev.localcluster.pki import CertificateAuthority, CertKeyPair, SigningKey
from gpuplace_dev.localcluster.process import ManagedProcess, spawn, stop_all
from gpuplace_dev.localcluster.realnode import (
    REAL_NODE_LOCK,
    REAL_NODE_NAME,
    RealNode,
    RealNodeError,
    RealNodeLayout,
)

__all__ = [
    "COMPONENTS",
    "GPU_PROBE_IMAGE",
    "GPU_RESOURCE",
    "KWOK_NODE_ANNOTATION",
    "KWOK_NODE_VALUE",
    "PAUSE_IMAGE",
    "POD_CIDR",
    "REAL_NODE_LOCK",
    "REAL_NODE_NAME",
    "SERVICE_CIDR",
    "BinariesError",
    "CertKeyPair",
    "CertificateAuthority",
    "ClusterError",
    "ClusterLayout",
    "ClusterState",
    "ControlPlaneBinaries",
    "FakeNode",
    "KubectlError",
    "LocalCluster",
    "ManagedProcess",
    "NodeBinaries",
    "RealNode",
    "RealNodeError",
    "RealNodeLayout",
    "SigningKey",
    "bin_dir",
    "cache_root",
    "fake_gpu_nodes",
    "find_binaries",
    "find_node_binaries",
    "kubernetes_version",
    "spawn",
    "stop_all",
]
