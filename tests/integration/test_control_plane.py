"""The local control plane does what gpuplace relies on (docs/local-cluster.md), against the real
apiserver."""

from __future__ import annotations

import base64
import http.server
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from gpuplace_dev.localcluster import (
    COMPONENTS,
    GPU_RESOURCE,
    BinariesError,
    LocalCluster,
    find_binaries,
    kubernetes_version,
)
from tests.integration import shellkit

BUILD_SCRIPT = Path(__file__).parents[2] / "hack" / "build-control-plane.sh"
#: A scheduler nobody runs: pods that name it stay unbound until a test binds them.
UNSERVED_SCHEDULER = "gpuplace-test-unserved"


def pod_manifest(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": pod_spec(),
    }


def pod_spec() -> dict[str, Any]:
    return {
        "schedulerName": UNSERVED_SCHEDULER,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }


def bind(
    cluster: LocalCluster,
    namespace: str,
    pod: str,
    node: str,
    annotations: dict[str, str] | None = None,
) -> None:
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "annotations": annotations or {}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", binding
    )
    assert status == 201, body


def pods_by_name(
    core: kubernetes.client.CoreV1Api, namespace: str, selector: str
) -> dict[str, Any]:
    return {
        p.metadata.name: p
        for p in core.list_namespaced_pod(namespace, label_selector=selector).items
    }


def owner(kind: str, name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """An apps/v1 `kind` (StatefulSet, ReplicaSet) of `replicas` pods labelled app=<name>."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            **spec,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec()},
        },
    }


@pytest.fixture(name="core")
def core_api(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture(name="apps")
def apps_api(api_client: kubernetes.client.ApiClient) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(api_client)


def test_version_reports_the_pinned_release(cluster: LocalCluster) -> None:
    status, body = cluster.request("GET", "/version")

    assert status == 200
    assert body["gitVersion"] == kubernetes_version() == "v1.35.4"
    assert (body["major"], body["minor"]) == ("1", "35")


def test_fake_nodes_are_ready_with_gpu_capacity(
    core: kubernetes.client.CoreV1Api, gpu_nodes: list[str]
) -> None:
    node = core.read_node(gpu_nodes[0])

    ready = {c.type: c.status for c in node.status.conditions}["Ready"]
    assert ready == "True"
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"


def test_binding_sets_node_and_annotations_in_one_write(
    cluster: LocalCluster,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    created = core.create_namespaced_pod(namespace, pod_manifest("worker-0"))
    decision = {
        "gpuplace.io/node": gpu_nodes[1],
        "gpuplace.io/index": "0",
        "gpuplace.io/devices": "GPU-11111111-2222-3333-4444-555555555555",
        "gpuplace.io/cuda-visible-devices": "0",
    }

    bind(cluster, namespace, "worker-0", gpu_nodes[1], decision)

    # The first change after creation must carry both the node and the annotations: one write.
    watch = kubernetes.watch.Watch()
    first = None
    for event in watch.stream(
        core.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=worker-0",
        resource_version=created.metadata.resource_version,
        timeout_seconds=30,
    ):
        if event["type"] == "MODIFIED":
            first = event["object"]
            watch.stop()
    assert first is not None, "no update of the pod arrived within 30 s"
    assert first.spec.node_name == gpu_nodes[1]
    assert decision.items() <= (first.metadata.annotations or {}).items()
    scheduled = {c.type: c.status for c in first.status.conditions or []}
    assert scheduled.get("PodScheduled") == "True"


def test_the_official_client_binds_when_it_leaves_the_response_undecoded(
    core: kubernetes.client.CoreV1Api, namespace: str, gpu_nodes: list[str]
) -> None:
    # The apiserver answers a Binding with a Status, which the generated client cannot decode into
    # a V1Binding (it raises after the binding succeeded); _preload_content=False skips decoding.
    core.create_namespaced_pod(namespace, pod_manifest("p"))

    response = core.create_namespaced_binding(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p", "annotations": {"gpuplace.io/index": "3"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": gpu_nodes[3]},
        },
        _preload_content=False,
    )
    status = json.loads(response.data)
    response.release_conn()

    assert (response.status, status["kind"], status["status"]) == (201, "Status", "Success")
    pod = core.read_namespaced_pod("p", namespace)
    assert pod.spec.node_name == gpu_nodes[3]
    assert pod.metadata.annotations["gpuplace.io/index"] == "3"


def test_binding_an_already_bound_pod_is_a_conflict(
    cluster: LocalCluster,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("p"))
    bind(cluster, namespace, "p", gpu_nodes[0])

    status, body = cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods/p/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": gpu_nodes[1]},
        },
    )

    assert status == 409, body
    assert "already assigned to node" in body["message"]


RunOwner = Callable[..., dict[str, Any]]


@pytest.fixture(name="run_owner")
def owner_runner(
    cluster: LocalCluster,
    core: kubernetes.client.CoreV1Api,
    apps: kubernetes.client.AppsV1Api,
    namespace: str,
) -> RunOwner:
    """Creates `owner(kind, name, replicas, **spec)` in `namespace` with the official client, then
    binds each of its pods, as it appears, to `node_of(pod name)` until all run; returns them."""

    def run(
        kind: str, name: str, replicas: int, node_of: Callable[[str], str], **spec: Any
    ) -> dict[str, Any]:
        if kind == "StatefulSet":
            apps.create_namespaced_stateful_set(namespace, owner(kind, name, replicas, **spec))
        else:
            apps.create_namespaced_replica_set(namespace, owner(kind, name, replicas, **spec))

        def all_running() -> bool:
            pods = pods_by_name(core, namespace, f"app={name}")
            for pod_name, pod in sorted(pods.items()):
                if not pod.spec.node_name:
                    bind(cluster, namespace, pod_name, node_of(pod_name))
            return len(pods) == replicas and all(p.status.phase == "Running" for p in pods.values())

        what = f"{kind} {name} to run {replicas} pods"
        cluster.wait_for(what, all_running, timeout=90, interval=0.2)
        return pods_by_name(core, namespace, f"app={name}")

    return run


def test_statefulset_pods_come_from_the_controller_manager_and_run_on_kwok_nodes(
    run_owner: RunOwner, gpu_nodes: list[str]
) -> None:
    # OrderedReady: llm-1 appears only once llm-0 runs, so each pod is bound as it shows up.
    pods = run_owner(
        "StatefulSet",
        "llm",
        3,
        lambda name: gpu_nodes[int(name.rsplit("-", 1)[1])],
        serviceName="llm",
    )

    assert sorted(pods) == ["llm-0", "llm-1", "llm-2"]
    assert [pods[n].spec.node_name for n in sorted(pods)] == gpu_nodes[:3]
    assert all(p.metadata.owner_references[0].kind == "StatefulSet" for p in pods.values())
    assert pods["llm-2"].metadata.labels["apps.kubernetes.io/pod-index"] == "2"


def test_deleting_the_owner_garbage_collects_its_pods(
    cluster: LocalCluster,
    core: kubernetes.client.CoreV1Api,
    apps: kubernetes.client.AppsV1Api,
    namespace: str,
    gpu_nodes: list[str],
    run_owner: RunOwner,
) -> None:
    owned = run_owner("ReplicaSet", "batch", 2, lambda _name: gpu_nodes[2])
    assert all(p.metadata.owner_references[0].name == "batch" for p in owned.values())

    # Background propagation: the ReplicaSet goes at once; the garbage collector removes the pods.
    apps.delete_namespaced_replica_set("batch", namespace, body={"propagationPolicy": "Background"})
    cluster.wait_for(
        "the garbage collector to delete the pods of ReplicaSet batch",
        lambda: not pods_by_name(core, namespace, "app=batch"),
        timeout=90,
        interval=0.2,
    )

    assert core.list_namespaced_pod(namespace).items == []


class _Webhook:
    """A validating admission webhook over HTTPS on 127.0.0.1 that denies labelled ConfigMaps."""

    MESSAGE = "configmaps labelled deny=yes are not allowed here (gpuplace test webhook)"

    def __init__(self, cluster: LocalCluster, directory: Path) -> None:
        pair = cluster.ca.issue_server("test-webhook", dns_names=("localhost",))
        pair.write(directory / "webhook.crt", directory / "webhook.key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(directory / "webhook.crt", directory / "webhook.key")
        self.reviewed: list[str] = []
        webhook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                labels = request["object"]["metadata"].get("labels") or {}
                webhook.reviewed.append(request["name"])
                response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
                if labels.get("deny") == "yes":
                    response = {
                        "uid": request["uid"],
                        "allowed": False,
                        "status": {"code": 403, "message": webhook.MESSAGE},
                    }
                body = json.dumps(
                    {
                        "apiVersion": review["apiVersion"],
                        "kind": "AdmissionReview",
                        "response": response,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/validate"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self._thread.join()
        self.server.server_close()


@pytest.fixture
def webhook(cluster: LocalCluster, tmp_path: Path) -> Iterator[_Webhook]:
    with _Webhook(cluster, tmp_path) as server:
        yield server


def test_apiserver_calls_an_https_webhook_and_its_denial_reaches_the_client(
    cluster: LocalCluster,
    api_client: kubernetes.client.ApiClient,
    namespace: str,
    webhook: _Webhook,
) -> None:
    name = f"deny-configmaps-{namespace}"
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    admission.create_validating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "deny.gpuplace.test",
                    "clientConfig": {
                        "url": webhook.url,
                        "caBundle": base64.b64encode(cluster.ca.cert_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    try:
        denied = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "denied", "labels": {"deny": "yes"}},
        }
        # The apiserver picks up new webhook configurations asynchronously; a dry run shows when.
        cluster.wait_for(
            "the webhook configuration to take effect",
            lambda: (
                cluster.request(
                    "POST", f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All", denied
                )[0]
                == 403
            ),
            timeout=30,
            interval=0.1,
        )

        result = cluster.kubectl(
            "create", "-n", namespace, "-f", "-", input=json.dumps(denied), check=False
        )
        allowed = cluster.kubectl(
            "create", "configmap", "allowed", "-n", namespace, "--from-literal=k=v", check=False
        )
    finally:
        admission.delete_validating_webhook_configuration(name)

    assert result.returncode != 0
    assert 'admission webhook "deny.gpuplace.test" denied the request' in result.stderr
    assert webhook.MESSAGE in result.stderr
    assert allowed.returncode == 0, allowed.stderr
    assert "allowed" in webhook.reviewed


@pytest.mark.slow
def test_cluster_up_and_down_leave_no_process_behind(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    with shellkit.cluster_up(
        directory, "--nodes", "2", "--gpus", "4", up_timeout=300, down_timeout=120
    ) as (up, state):
        assert up.stdout == f"export KUBECONFIG={directory / 'kubeconfig'}\n"
        assert [p.name for p in state.processes if p.alive()] == [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kwok",
        ]
        nodes = subprocess.run(
            [str(find_binaries(build=False).kubectl), "get", "nodes", "-o", "name"],
            env={**os.environ, "KUBECONFIG": str(directory / "kubeconfig")},
            capture_output=True,
            text=True,
            check=True,
        )
        assert nodes.stdout.split() == ["node/gpu-node-01", "node/gpu-node-02"]


def test_environment_overrides_replace_cached_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = find_binaries(build=False)
    assets = tmp_path / "assets"
    assets.mkdir()
    for component in ("etcd", "kube-apiserver", "kubectl"):
        (assets / component).symlink_to(built.path(component))
    kwok = tmp_path / "my-kwok"
    kwok.symlink_to(built.kwok)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("TEST_ASSET_KWOK", str(kwok))

    found = find_binaries(build=False)

    assert found.etcd == assets / "etcd"
    assert found.kube_apiserver == assets / "kube-apiserver"
    assert found.kwok == kwok
    assert found.kube_controller_manager == built.kube_controller_manager


def test_an_unusable_override_is_reported_with_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TEST_ASSET_ETCD", str(tmp_path / "missing-etcd"))

    with pytest.raises(BinariesError, match=r"TEST_ASSET_ETCD=.*missing-etcd: not an executable"):
        find_binaries(build=False)
    script = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False
    )
    assert script.returncode == 1
    assert "TEST_ASSET_ETCD" in script.stderr


def test_build_script_builds_nothing_that_is_overridden(tmp_path: Path) -> None:
    built = find_binaries(build=False)
    assets = tmp_path / "assets"
    assets.mkdir()
    for component in COMPONENTS:
        (assets / component).symlink_to(built.path(component))
    cache = tmp_path / "cache"

    # No Go on PATH: any build attempt would fail.
    script = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        env={
            "PATH": "/usr/bin:/bin",
            "GPUPLACE_CACHE": str(cache),
            "KUBEBUILDER_ASSETS": str(assets),
        },
        capture_output=True,
        text=True,
        check=False,
    )

    assert script.returncode == 0, script.stderr
    assert script.stdout == f"{cache}/k8s-{kubernetes_version()}/bin\n"
    assert "building" not in script.stderr
