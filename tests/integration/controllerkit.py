"""Helpers for controller tests: run `gpuplace controller` as a real process, publish inventories
as an agent would, and wait for pods and statuses through the real apiserver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from gpuplace_dev.localcluster.process import die_with_parent
from placement.annotations import MAP_LABEL, PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, GpuDevice, NodeInventory
from placement.types import EnvMode, GpuUuid, NodeName
from tests.integration.webhookkit import free_port
from webhook.pods import wired_env


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@contextmanager
def fresh_namespace(
    cluster: LocalCluster,
    prefix: str,
    *,
    labels: dict[str, str] | None = None,
    wait: bool = False,
    timeout: float = 120.0,
) -> Iterator[str]:
    """A new namespace `<prefix>-xxxxxx` for the block, deleted after it (`wait`: until it is gone,
    pods and maps with it)."""
    name = unique(prefix)
    cluster.create_namespace(name, labels=labels)
    try:
        yield name
    finally:
        cluster.delete_namespace(name, wait=wait, timeout=timeout)


def write_kubeconfig(
    cluster: LocalCluster, path: Path, user: str, credentials: dict[str, str], namespace: str = ""
) -> Path:
    """Writes to `path` a kubeconfig for `cluster` as `user`, who presents `credentials` (a token,
    or a client certificate and key), in `namespace` if one is given; returns `path`."""
    context = {"cluster": "local", "user": user} | ({"namespace": namespace} if namespace else {})
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_file),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def create_system_namespaces(cluster: LocalCluster) -> None:
    """The namespaces a controller writes to: the model's and the inventories'."""
    for name in ("gpuplace-system", INVENTORY_NAMESPACE):
        cluster.create_namespace(name)


def gpu_uuid(node: str, index: int) -> str:
    digest = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{index}")
    return f"GPU-{digest}"


def inventory_for(node: str, gpus: int, unhealthy: Iterable[int] = ()) -> NodeInventory:
    bad = set(unhealthy)
    return NodeInventory(
        NodeName(node),
        tuple(
            GpuDevice(
                i,
                GpuUuid(gpu_uuid(node, i)),
                "NVIDIA H100 80GB HBM3",
                81559,
                f"00000000:{0x10 + i:02X}:00.0",
                healthy=i not in bad,
                health_reason="XID 79" if i in bad else "",
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def publish_inventory(cluster: LocalCluster, inventory: NodeInventory) -> None:
    """Writes what an agent writes: ConfigMap <node> and a long Lease <node> in gpuplace-inventory."""
    ns = INVENTORY_NAMESPACE
    cluster.create_namespace(ns)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": inventory.node, "namespace": ns},
        "data": {INVENTORY_KEY: inventory.to_json()},
    }
    status, _ = cluster.request("PUT", f"/api/v1/namespaces/{ns}/configmaps/{inventory.node}", body)
    if status == 404:
        status, _ = cluster.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body)
    assert status in (200, 201), status
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": inventory.node, "namespace": ns},
        "spec": {
            "holderIdentity": f"agent-{inventory.node}",
            "leaseDurationSeconds": 3600,
            "renewTime": now(),
        },
    }
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    status, _ = cluster.request("POST", path, lease)
    if status == 409:
        status, _ = cluster.request("PATCH", f"{path}/{inventory.node}", {"spec": lease["spec"]})
    assert status in (200, 201), status


def pod_body(namespace: str, name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """A Pod `namespace/name` with `spec`; `metadata`: more of its metadata (labels, annotations)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **metadata},
        "spec": spec,
    }


def placement_configmap(namespace: str, name: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {PLACEMENT_MAP_LABEL: "true"}},
        "data": {"placement.yaml": text},
    }


def apply_map(cluster: LocalCluster, namespace: str, name: str, text: str) -> None:
    """Creates the source ConfigMap, or merge-patches its data (no resourceVersion: the controller
    patches the status annotation concurrently, as it would under kubectl apply)."""
    body = placement_configmap(namespace, name, text)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    status, resp = cluster.request("POST", path, body)
    if status == 409:
        patch = {"metadata": {"labels": body["metadata"]["labels"]}, "data": body["data"]}
        status, resp = cluster.request("PATCH", f"{path}/{name}", patch)
    assert status in (200, 201), resp


def map_status(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if status != 200:
        return None
    text = (body["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
    return json.loads(text) if text else None


def wait_for_map(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    phase: str,
    containing: str = "",
    what: str = "",
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Waits until map `name` reports `phase` with `containing` in its message; returns its status."""
    return dict(
        wait_for(
            what
            or f"map {namespace}/{name} {phase}" + (f" with {containing!r}" if containing else ""),
            lambda: (
                (s := map_status(cluster, namespace, name))
                and s["phase"] == phase
                and containing in s.get("message", "")
                and s
            ),
            timeout=timeout,
        )
    )


def wait_for(
    what: str | Callable[[], str],
    check: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.2,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def create(cluster: LocalCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, resp = cluster.request("POST", path, body)
    assert status == 201, resp
    return dict(resp)


def create_workload(cluster: LocalCluster, body: dict[str, Any]) -> dict[str, Any]:
    """Creates a StatefulSet or Deployment (`statefulset`, `deployment`) in its namespace."""
    namespace, kind = body["metadata"]["namespace"], body["kind"].lower()
    return create(cluster, f"/apis/apps/v1/namespaces/{namespace}/{kind}s", body)


def gpu_nodes(
    cluster: LocalCluster,
    prefix: str,
    count: int,
    gpus: int = 4,
    inventories: bool = True,
    labels: dict[str, str] | None = None,
) -> list[str]:
    """kwok nodes `<prefix>-1`... with `gpus` fake GPUs each and, by default, their inventories."""
    names = [f"{prefix}-{i}" for i in range(1, count + 1)]
    cluster.create_nodes([FakeNode(n, gpus=gpus, labels=dict(labels or {})) for n in names])
    if inventories:
        for n in names:
            publish_inventory(cluster, inventory_for(n, gpus))
    return names


def bound_pods(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    """The pods of `namespace` bound to a node and not being deleted, by name."""
    return {
        p["metadata"]["name"]: p
        for p in list_pods(cluster, namespace)
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


def wait_for_bound(
    cluster: LocalCluster, namespace: str, count: int, what: str = "", timeout: float = 60.0
) -> dict[str, dict[str, Any]]:
    """Waits until exactly `count` pods of `namespace` are bound; returns them by name."""
    return dict(
        wait_for(
            what or f"{count} bound",
            lambda: (p := bound_pods(cluster, namespace)) and len(p) == count and p,
            timeout=timeout,
        )
    )


def gpuplace_status(cluster: LocalCluster) -> str:
    """What `gpuplace status` prints for the cluster."""
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", "status", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def list_pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    status, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    assert status == 200, body
    return list(body["items"])


def get_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return body if status == 200 else None


def describe_pending(cluster: LocalCluster, namespace: str) -> str:
    """Pending pods with their PodScheduled reason and message, for timeout messages."""
    out = []
    for pod in list_pods(cluster, namespace):
        if not pod["spec"].get("nodeName"):
            cond = scheduled_condition(pod) or {}
            out.append(f"{pod['metadata']['name']}: {cond.get('reason')} {cond.get('message')}")
    return "; ".join(out) or "no pending pods"


def scheduled_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return dict(cond)
    return None


def pending_reason(cluster: LocalCluster, namespace: str, name: str) -> str:
    pod = get_pod(cluster, namespace, name)
    if pod is None or pod["spec"].get("nodeName"):
        return ""
    cond = scheduled_condition(pod)
    return str(cond.get("reason", "")) if cond and cond.get("status") == "False" else ""


class ControllerProcess:
    """`gpuplace controller` in its own process, logging to the cluster's log directory."""

    def __init__(self, cluster: LocalCluster, name: str, *extra: str, lease: str = "") -> None:
        self.name = name
        self.log_path = Path(cluster.logs_dir) / f"controller-{name}.log"
        argv = [
            sys.executable,
            "-m",
            "gpuplace",
            "controller",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--identity={name}",
            f"--lease-name={lease or 'gpuplace-controller-' + name}",
            "--lease-seconds=3",
            "--renew-deadline-seconds=2",
            "--retry-seconds=0.5",
            "--metrics-address=127.0.0.1:0",
            *extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = self.log_path.open("ab")
        # Dies with the test process even when pytest itself is killed.
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ControllerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def refused_binds(proc: ControllerProcess, pods: Iterable[str]) -> list[str]:
    """The lines of the controller's log where the apiserver refused a Binding of one of `pods`
    (by name: its message names the pod, not the namespace). A controller also binds what is
    left of earlier tests, whose pods may go away under it with their namespace."""
    names = list(pods)
    return [
        line
        for line in proc.log().splitlines()
        if "bind refused" in line and any(name in line for name in names)
    ]


def solo_controller(cluster: LocalCluster, prefix: str, *extra: str) -> ControllerProcess:
    """A controller campaigning for a lease of its own (both named `<prefix>-xxxxxx`)."""
    return ControllerProcess(cluster, unique(prefix), *extra, lease=unique(prefix))


@contextmanager
def running_controller(
    cluster: LocalCluster, *extra: str, prefix: str = "c", log_tail: int = 4000
) -> Iterator[ControllerProcess]:
    """A controller for the block; stopped after it, the tail of its log printed (pytest shows it
    when the test failed)."""
    proc = ControllerProcess(cluster, unique(prefix), *extra)
    try:
        yield proc
    finally:
        proc.stop()
        print(proc.log()[-log_tail:])


def map_yaml(
    namespace: str, name: str, entries: list[tuple[int, str, list[int]]], **spec: str
) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        "metadata:",
        f"  name: {name}",
        f"  namespace: {namespace}",
        "spec:",
        *[f"  {k}: {v}" for k, v in spec.items()],
        "  placements:",
    ]
    for index, node, devices in entries:
        lines += [
            f"    - index: {index}",
            f"      node: {node}",
            f"      devices: [{', '.join(map(str, devices))}]",
        ]
    return "\n".join(lines) + "\n"


def admitted(name: str, image: str) -> dict[str, Any]:
    """A container as the gpuplace webhook leaves a map's pod (placement/admitted.py): the binder
    places a map's pod only with this wiring, so pods the tests create without a webhook carry
    it (the pod-bindings policy accepts exactly this form)."""
    return {"name": name, "image": image, "env": [dict(e) for e in wired_env(EnvMode.INDEX)]}


def statefulset(namespace: str, name: str, map_name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name, MAP_LABEL: map_name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": "gpuplace",
                    "containers": [admitted("main", "busybox")],
                },
            },
        },
    }


def deployment(namespace: str, name: str, map_name: str, replicas: int) -> dict[str, Any]:
    body = statefulset(namespace, name, map_name, replicas)
    body["kind"] = "Deployment"
    del body["spec"]["serviceName"], body["spec"]["podManagementPolicy"]
    return body


@contextmanager
def leader_killed_during_burst(
    cluster: LocalCluster,
    namespace: str,
    nodes: list[str],
    *controller_args: str,
    lease: str,
    first_timeout: float,
    all_timeout: float,
    interval: float,
) -> Iterator[dict[str, dict[str, Any]]]:
    """Map `big` declares every GPU of `nodes` (8 each) once; two controllers campaign for
    `lease`; a StatefulSet with a pod per slot is created and the leader is killed once 20 pods
    are bound. Yields the bound pods once all are, while the second controller still leads; stops
    it afterwards."""
    replicas = len(nodes) * 8
    entries = [(i, nodes[i // 8], [i % 8]) for i in range(replicas)]
    apply_map(cluster, namespace, "big", map_yaml(namespace, "big", entries))
    a = ControllerProcess(cluster, unique("a"), *controller_args, lease=lease)
    wait_for("a leads", lambda: "became leader" in a.log())
    b = ControllerProcess(cluster, unique("b"), *controller_args, lease=lease)
    try:
        create_workload(cluster, statefulset(namespace, "big", "big", replicas))
        wait_for(
            "some pods bound",
            lambda: len(bound_pods(cluster, namespace)) >= 20,
            timeout=first_timeout,
        )
        a.kill()
        wait_for("b takes over", lambda: "became leader" in b.log(), timeout=30)
        yield wait_for(
            f"all {replicas} bound",
            lambda: (p := bound_pods(cluster, namespace)) and len(p) == replicas and p,
            timeout=all_timeout,
            interval=interval,
        )
    finally:
        a.kill() if a.alive() else None
        b.stop()
        print(b.log()[-4000:])  # shown by pytest when the test failed


@contextmanager
def occupied_gpus(
    cluster: LocalCluster, prefix: str, flag: str
) -> Iterator[tuple[str, list[str], ControllerProcess, int]]:
    """A controller serving `flag`=127.0.0.1:<port> (its metrics or web address), two nodes of
    4 GPUs (GPU 3 of the second unhealthy), map `llm` of 3 slots and StatefulSet `web`: web-0
    and web-1 bound, web-2 waiting for the unhealthy GPU. Yields (namespace, nodes, controller,
    port)."""
    create_system_namespaces(cluster)
    port = free_port()
    with (
        fresh_namespace(cluster, prefix) as namespace,
        running_controller(cluster, f"{flag}=127.0.0.1:{port}") as controller,
    ):
        nodes = gpu_nodes(cluster, unique(prefix), 2)
        publish_inventory(cluster, inventory_for(nodes[1], 4, unhealthy=[3]))
        entries = [(0, nodes[0], [0, 1]), (1, nodes[0], [2]), (2, nodes[1], [3])]
        apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
        create_workload(cluster, statefulset(namespace, "web", "llm", 3))
        wait_for_bound(cluster, namespace, 2, "2 bound pods")
        yield namespace, nodes, controller, port
