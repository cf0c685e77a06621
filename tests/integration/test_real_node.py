"""What the container sees: gpuplace's pods on the local cluster's real node (containerd, kubelet).

The whole chain runs for real: an agent publishes the node's (fake NVML) GPUs, the controller
binds, the webhook wires the environment, the kubelet starts the container, and the assertions
read what the gpu-probe container itself printed (``kubectl logs``), what ``kubectl exec env``
shows, and what it serves through ``kubectl port-forward``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.demo.components import Components, demo_uuid
from gpuplace_dev.demo.realnode import printed as report  # the NAME=value lines the probe printed
from gpuplace_dev.localcluster import GPU_PROBE_IMAGE, REAL_NODE_NAME, LocalCluster
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_LABEL,
    LEGACY_ANNOTATION,
    MAP_LABEL,
)
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from tests.integration.controllerkit import (
    apply_map,
    map_status,
    map_yaml,
    placement_configmap,
    pod_body,
    wait_for,
)
from tests.integration.tenantkit import Tenant

#: The real node's fake GPUs have the UUIDs demo_uuid(NODE_NUMBER, index).
NODE_NUMBER = 9
GPUS = 4


@pytest.fixture(scope="module")
def gpuplace(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """gpuplace's components against the real cluster: an agent for the real node (4 fake GPUs),
    the controller and the webhook (registered, legacy mode on)."""
    for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        real_cluster.create_namespace(namespace)
    components = Components(real_cluster, tmp_path_factory.mktemp("components"))
    try:
        components.agent(REAL_NODE_NAME, GPUS, interval=1.0, number=NODE_NUMBER)
        components.controller()
        components.webhook()

        def ready() -> bool:
            components.check_alive()
            status, cm = real_cluster.request(
                "GET", f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{REAL_NODE_NAME}"
            )
            registered, _ = real_cluster.request(
                "GET",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuplace",
            )
            return status == 200 and INVENTORY_KEY in (cm.get("data") or {}) and registered == 200

        wait_for("the agent's inventory and the webhook's registration", ready, timeout=90)
        yield
    finally:
        components.stop()


@pytest.fixture
def ns(real_cluster: LocalCluster, gpuplace: None) -> Iterator[str]:
    name = f"real-{uuid.uuid4().hex[:6]}"
    real_cluster.create_namespace(name)
    yield name
    real_cluster.delete_namespace(name)


# -- helpers -------------------------------------------------------------------------------------
def probe_pod(
    name: str,
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """A gpu-probe pod with an init container that prints its report once."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "initContainers": [{"name": "init", "image": GPU_PROBE_IMAGE, "args": ["--once"]}],
        "containers": [
            {"name": "probe", "image": GPU_PROBE_IMAGE, "ports": [{"containerPort": 8080}]}
        ],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return pod_body(namespace, name, spec, labels=labels or {}, annotations=annotations or {})


def admit(cluster: LocalCluster, ns: str, name: str, map_name: str) -> None:
    """`kubectl apply` of a probe pod for `map_name`; again while the webhook has not seen the
    map yet (a webhook running in the cluster, reached through its Service)."""
    pod = json.dumps(probe_pod(name, ns, labels={MAP_LABEL: map_name}))
    wait_for(
        f"pod {name} admitted",
        lambda: cluster.kubectl("apply", "-f", "-", input=pod, check=False).returncode == 0,
        timeout=60,
    )


def create_pod(cluster: LocalCluster, body: dict[str, Any]) -> None:
    """Creates the pod; retries while the webhook has not yet seen the map it names."""
    namespace = body["metadata"]["namespace"]
    deadline = time.monotonic() + 30
    while True:
        status, response = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        if status == 201:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"creating pod {body['metadata']['name']}: {status} {response}")
        time.sleep(0.5)


def get_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    status, pod = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert status == 200, pod
    return pod


def probe_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return next((s for s in statuses if s["name"] == "probe"), {})


def wait_running(
    cluster: LocalCluster, namespace: str, name: str, restarts: int = 0
) -> dict[str, Any]:
    """Waits until the probe container runs (after ``restarts`` restarts) and serves."""

    def running() -> dict[str, Any] | None:
        cluster.check_alive()
        pod = get_pod(cluster, namespace, name)
        status = probe_status(pod)
        if status.get("ready") and status.get("restartCount", 0) >= restarts:
            return pod
        return None

    return wait_for(
        lambda: f"pod {namespace}/{name} running: {get_pod(cluster, namespace, name)['status']}",
        running,
        timeout=120,
    )


def logs(cluster: LocalCluster, namespace: str, name: str, *args: str) -> str:
    """The container's output; waits for the report, which the probe prints right at start."""
    return wait_for(
        f"the report in the log of {namespace}/{name} {' '.join(args)}",
        lambda: (
            (out := cluster.kubectl("-n", namespace, "logs", name, *args, check=False).stdout)
            and "environment at start" in out
            and out
        ),
        timeout=30,
    )


def bound_map(cluster: LocalCluster, namespace: str, name: str, text: str) -> None:
    apply_map(cluster, namespace, name, text)
    wait_for(
        f"map {namespace}/{name} Valid",
        lambda: (status := map_status(cluster, namespace, name)) and status["phase"] == "Valid",
    )


def port_forward_get(cluster: LocalCluster, namespace: str, name: str) -> str:
    """GET / on the pod's port 8080 through ``kubectl port-forward`` (apiserver -> kubelet ->
    containerd -> the pod's network namespace)."""
    argv = [
        str(cluster.binaries.kubectl),
        f"--kubeconfig={cluster.kubeconfig}",
        "-n",
        namespace,
        "port-forward",
        f"pod/{name}",
        ":8080",
    ]
    env = {"KUBECACHEDIR": str(cluster.layout.kubectl_cache), "HOME": str(cluster.directory)}
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as forward:
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()
            match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
            assert match, f"kubectl port-forward said: {line}"
            url = f"http://127.0.0.1:{match.group(1)}/"
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())
        finally:
            forward.terminate()
            forward.wait(10)


# -- tests ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_index_map_pod_sees_its_devices_in_log_exec_init_and_port_forward(
    real_cluster: LocalCluster, ns: str
) -> None:
    bound_map(real_cluster, ns, "probe", map_yaml(ns, "probe", [(0, REAL_NODE_NAME, [2, 3])]))
    create_pod(
        real_cluster, probe_pod("probe-0", ns, labels={MAP_LABEL: "probe", INDEX_LABEL: "0"})
    )
    pod = wait_running(real_cluster, ns, "probe-0")
    assert pod["spec"]["nodeName"] == REAL_NODE_NAME
    assert pod["metadata"]["annotations"][CUDA_ANNOTATION] == "2,3"

    printed = report(logs(real_cluster, ns, "probe-0", "-c", "probe"))
    assert printed["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert printed["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "NVIDIA_VISIBLE_DEVICES" not in printed  # envMode index sets only the CUDA variables

    init = report(logs(real_cluster, ns, "probe-0", "-c", "init"))
    assert init["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert init["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"

    env = real_cluster.kubectl("-n", ns, "exec", "probe-0", "-c", "probe", "--", "env").stdout
    assert "CUDA_VISIBLE_DEVICES=2,3" in env.splitlines()
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env.splitlines()
    assert "HOSTNAME=probe-0" in env.splitlines()

    served = report(port_forward_get(real_cluster, ns, "probe-0"))
    assert served["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_container_killed_and_restarted_prints_the_same_devices(
    real_cluster: LocalCluster, ns: str
) -> None:
    bound_map(real_cluster, ns, "restart", map_yaml(ns, "restart", [(0, REAL_NODE_NAME, [1])]))
    create_pod(
        real_cluster, probe_pod("restart-0", ns, labels={MAP_LABEL: "restart", INDEX_LABEL: "0"})
    )
    pod = wait_running(real_cluster, ns, "restart-0")
    assert report(logs(real_cluster, ns, "restart-0", "-c", "probe"))["CUDA_VISIBLE_DEVICES"] == "1"
    container = probe_status(pod)["containerID"].removeprefix("containerd://")

    real_cluster.real_node.ctr("tasks", "kill", "--signal", "SIGKILL", container)
    pod = wait_running(real_cluster, ns, "restart-0", restarts=1)
    status = probe_status(pod)
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 137  # killed, not exited
    assert status["containerID"].removeprefix("containerd://") != container
    again = report(logs(real_cluster, ns, "restart-0", "-c", "probe"))
    before = report(logs(real_cluster, ns, "restart-0", "-c", "probe", "--previous"))
    assert again["CUDA_VISIBLE_DEVICES"] == before["CUDA_VISIBLE_DEVICES"] == "1"
    assert again["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_uuid_map_gives_nvidia_visible_devices(real_cluster: LocalCluster, ns: str) -> None:
    text = map_yaml(ns, "by-uuid", [(0, REAL_NODE_NAME, [0, 3])], envMode="uuid")
    bound_map(real_cluster, ns, "by-uuid", text)
    create_pod(
        real_cluster, probe_pod("by-uuid-0", ns, labels={MAP_LABEL: "by-uuid", INDEX_LABEL: "0"})
    )
    pod = wait_running(real_cluster, ns, "by-uuid-0")
    uuids = f"{demo_uuid(NODE_NUMBER, 0)},{demo_uuid(NODE_NUMBER, 3)}"
    assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == uuids

    printed = report(logs(real_cluster, ns, "by-uuid-0", "-c", "probe"))
    assert printed["NVIDIA_VISIBLE_DEVICES"] == uuids
    assert printed["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert printed["CUDA_VISIBLE_DEVICES"] == pod["metadata"]["annotations"][CUDA_ANNOTATION]
    assert report(logs(real_cluster, ns, "by-uuid-0", "-c", "init"))["NVIDIA_VISIBLE_DEVICES"] == (
        uuids
    )


def test_legacy_pod_prints_the_value_of_its_line(real_cluster: LocalCluster, ns: str) -> None:
    # The earlier tools' format: the whole map in the annotation, the index from the name's
    # -<n> suffix, the node by its gpu-node-name label (the real node carries realnode).
    annotation = "0=realnode:0,1\n1=realnode:3\n"
    create_pod(
        real_cluster,
        probe_pod(
            "trainer-1", ns, annotations={LEGACY_ANNOTATION: annotation}, scheduler="gpu-scheduler"
        ),
    )
    pod = wait_running(real_cluster, ns, "trainer-1")
    assert pod["spec"]["nodeName"] == REAL_NODE_NAME
    printed = report(logs(real_cluster, ns, "trainer-1", "-c", "probe"))
    assert printed["CUDA_VISIBLE_DEVICES"] == "3"
    assert printed["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_real_node_is_a_node_of_the_cluster(real_cluster: LocalCluster) -> None:
    status, node = real_cluster.request("GET", f"/api/v1/nodes/{REAL_NODE_NAME}")
    assert status == 200, node
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.35.4"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    assert node["metadata"]["labels"]["gpu-node-name"] == "realnode"
    # Its state is below the cluster's directory (a link to a short path: socket paths are short).
    layout = real_cluster.real_node.layout
    assert layout.directory == (Path(real_cluster.directory) / "node").resolve()
    assert layout.containerd_socket.is_socket()
    images = real_cluster.real_node.ctr("images", "ls", "-q").stdout.split()
    assert GPU_PROBE_IMAGE in images


def test_tenant_spoofing_the_environment_gets_only_its_declared_gpu(
    real_cluster: LocalCluster, ns: str
) -> None:
    # A ServiceAccount with only `edit` in its namespace writes its own map and a pod that sets
    # the GPU variables and the binding's annotation itself: the container sees the declared GPU.
    tenant = Tenant(real_cluster, ns)
    configmap = placement_configmap(
        ns, "mine", map_yaml(ns, "mine", [(0, REAL_NODE_NAME, [1])], envMode="index")
    )
    created = tenant.create(configmap)
    assert created.returncode == 0, created.stderr
    wait_for(
        "map mine Valid",
        lambda: (status := map_status(real_cluster, ns, "mine")) and status["phase"] == "Valid",
    )
    pod = probe_pod(
        "mine-0",
        ns,
        labels={MAP_LABEL: "mine", INDEX_LABEL: "0"},
        annotations={CUDA_ANNOTATION: "0,1,2,3", DEVICES_ANNOTATION: demo_uuid(NODE_NUMBER, 0)},
    )
    spoofed = [
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1,2,3"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    pod["spec"]["containers"][0]["env"] = spoofed
    pod["spec"]["initContainers"][0]["env"] = spoofed
    created = tenant.create(pod)
    assert created.returncode == 0, created.stderr
    wait_running(real_cluster, ns, "mine-0")

    for container in ("probe", "init"):
        out = tenant.kubectl("logs", "mine-0", "-c", container)
        assert out.returncode == 0, out.stderr
        printed = report(out.stdout)
        assert printed["CUDA_VISIBLE_DEVICES"] == "1", (container, out.stdout)
        assert "NVIDIA_VISIBLE_DEVICES" not in printed, (container, out.stdout)
    env = tenant.kubectl("exec", "mine-0", "-c", "probe", "--", "env")
    assert env.returncode == 0, env.stderr
    assert [line for line in env.stdout.splitlines() if "VISIBLE_DEVICES" in line] == [
        "CUDA_VISIBLE_DEVICES=1"
    ]
