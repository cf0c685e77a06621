"""Helpers for agent tests: run `gpuplace agent` as a real process whose pynvml loads the fake
libnvidia-ml.so.1 (tests/fakenvml), drive its devices through the fake's JSON file, and read what
the agent published through the real apiserver.

Agents run as a user that has exactly the agent's RBAC (write in gpuplace-inventory, read the model
in gpuplace-system), so a write anywhere else fails loudly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplace_dev.localcluster import LocalCluster
from placement.inventory import (
    CHECKS_KEY,
    INVENTORY_KEY,
    INVENTORY_NAMESPACE,
    DeviceCheck,
    GpuDevice,
    NodeInventory,
)
from placement.model import MODEL_LABEL, MODEL_NAMESPACE, CompiledSlot, decode_model
from placement.types import GpuUuid, MapKey, NodeName
from tests.integration.controllerkit import gpu_uuid, map_yaml, wait_for, write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
FAKENVML = ROOT / "tests" / "fakenvml"
FAKE_NVML_CONFIG_ENV = "GPUPLACE_FAKE_NVML_CONFIG"
PRODUCT = "NVIDIA H100 80GB HBM3"
MEMORY_MIB = 81559
DRIVER = "550.54.15"
CUDA = "12.4"


def build_fake_nvml() -> Path:
    """Builds tests/fakenvml/build/libnvidia-ml.so.1 (only on change); returns its directory."""
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(FAKENVML)],
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"building the fake NVML library failed:\n{result.stdout}{result.stderr}"
        )
    library = FAKENVML / "build" / "libnvidia-ml.so.1"
    assert library.is_file(), library
    return library.parent


class FakeGpus:
    """The fake NVML configuration of one node: `gpus` H100s whose UUIDs are `gpu_uuid(node, i)`
    (as controllerkit's inventories). Every change rewrites the file atomically."""

    def __init__(self, path: Path, node: str, gpus: int) -> None:
        self.path = path
        self.node = node
        self.devices: list[dict[str, Any]] = [
            {
                "index": i,
                "uuid": gpu_uuid(node, i),
                "name": PRODUCT,
                "memoryTotalMiB": MEMORY_MIB,
                "pciBusId": f"00000000:{0x18 + i:02X}:00.0",
                "numaNode": i // 2,
            }
            for i in range(gpus)
        ]
        self.write()

    def write(self) -> None:
        text = json.dumps(
            {"driverVersion": DRIVER, "cudaDriverVersion": CUDA, "devices": self.devices}, indent=2
        )
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def xid(self, index: int, code: int) -> None:
        """The device raises a critical XID event."""
        self.devices[index]["xid"] = code
        self.write()

    def fail(self, index: int, error: str = "GPU_IS_LOST") -> None:
        """Every NVML call about the device fails with `error` from now on."""
        self.devices[index]["fail"] = error
        self.write()

    def expected(self) -> NodeInventory:
        """The inventory an agent must publish for these devices while all are healthy."""
        return NodeInventory(
            NodeName(self.node),
            tuple(
                GpuDevice(
                    d["index"],
                    GpuUuid(d["uuid"]),
                    d["name"],
                    d["memoryTotalMiB"],
                    d["pciBusId"],
                    numa_node=d["numaNode"],
                )
                for d in self.devices
            ),
            driver_version=DRIVER,
            cuda_driver_version=CUDA,
        )


def agent_kubeconfig(cluster: LocalCluster, directory: Path) -> Path:
    """A kubeconfig for a fresh user bound to the agent's Roles (as the Helm chart grants them
    to the agent's ServiceAccount): configmaps and leases in gpuplace-inventory, read-only
    configmaps in gpuplace-system. Both namespaces must exist. The user authenticates with a
    client certificate from the cluster's CA; RBAC treats it as it treats a ServiceAccount."""
    name = f"gpuplace-agent-{uuid.uuid4().hex[:6]}"
    rules = {
        INVENTORY_NAMESPACE: [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch"],
            },
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update", "patch"],
            },
        ],
        MODEL_NAMESPACE: [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
        ],
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces"
    for namespace, role_rules in rules.items():
        _create(
            cluster,
            f"{rbac}/{namespace}/roles",
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": name}, "rules": role_rules},
        )  # fmt: skip
        _create(
            cluster,
            f"{rbac}/{namespace}/rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}
                ],
            },
        )
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cluster.ca.issue_client(name).write(cert, key)
    credentials = {"client-certificate": str(cert), "client-key": str(key)}
    return write_kubeconfig(cluster, directory / f"{name}.kubeconfig", name, credentials)


def _create(cluster: LocalCluster, path: str, body: dict[str, Any]) -> None:
    status, response = cluster.request("POST", path, body)
    assert status == 201, response


class AgentProcess:
    """`gpuplace agent --node NODE` in its own process, logging to the cluster's log directory."""

    def __init__(
        self,
        cluster: LocalCluster,
        node: str,
        *extra: str,
        kubeconfig: Path,
        library_dir: Path,
        config: Path | None,
        interval: float = 1.0,
    ) -> None:
        self.node = node
        self.log_path = Path(cluster.logs_dir) / f"agent-{node}.log"
        self.identity = f"agent-{node}-{uuid.uuid4().hex[:4]}"
        self.proc = _start(
            [
                "agent",
                f"--node={node}",
                f"--interval={interval}",
                f"--kubeconfig={kubeconfig}",
                f"--identity={self.identity}",
                "--metrics-address=127.0.0.1:0",
                *extra,
            ],
            library_dir,
            config,
            self.log_path,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in `timeout`; returns the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return int(self.proc.returncode)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics_port(self) -> int | None:
        found = re.search(r"/metrics on port (\d+)", self.log())
        return int(found.group(1)) if found else None


def run_agent(
    *args: str, library_dir: Path, config: Path | None, log_path: Path, timeout: float = 120.0
) -> tuple[int, str]:
    """Runs `gpuplace agent ARGS` to completion; returns (exit status, stdout + stderr)."""
    proc = _start(list(args), library_dir, config, log_path)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    return int(proc.returncode), log_path.read_text(errors="replace")


def _start(
    args: list[str], library_dir: Path, config: Path | None, log_path: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in (FAKE_NVML_CONFIG_ENV, "NODE_NAME")}
    env |= {"LD_LIBRARY_PATH": str(library_dir), "PYTHONUNBUFFERED": "1"}
    if config is not None:
        env[FAKE_NVML_CONFIG_ENV] = str(config)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuplace", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )


# -- what the agent published ------------------------------------------------------------------
def inventory_configmap(cluster: LocalCluster, node: str) -> dict[str, Any] | None:
    status, body = cluster.request(
        "GET", f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{node}"
    )
    return body if status == 200 else None


def published_inventory(cluster: LocalCluster, node: str) -> NodeInventory | None:
    configmap = inventory_configmap(cluster, node)
    text = ((configmap or {}).get("data") or {}).get(INVENTORY_KEY)
    return None if text is None else NodeInventory.from_json(text)


def published_checks(cluster: LocalCluster, node: str) -> list[DeviceCheck] | None:
    configmap = inventory_configmap(cluster, node)
    text = ((configmap or {}).get("data") or {}).get(CHECKS_KEY)
    return None if text is None else [DeviceCheck.from_json(c) for c in json.loads(text)]


def lease(cluster: LocalCluster, node: str) -> dict[str, Any] | None:
    status, body = cluster.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{INVENTORY_NAMESPACE}/leases/{node}"
    )
    return body if status == 200 else None


def lease_expired(cluster: LocalCluster, node: str) -> bool:
    """The Lease has not been renewed for longer than it declares (the test and the agents
    share one clock)."""
    current = lease(cluster, node)
    if current is None:
        return False
    spec = current["spec"]
    renewed = datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    age = (datetime.now(UTC) - renewed).total_seconds()
    return age > float(spec["leaseDurationSeconds"])


def model_slot(cluster: LocalCluster, key: MapKey, index: int) -> CompiledSlot | None:
    """Slot `index` of map `key` in the model the controller last wrote completely."""
    status, body = cluster.request(
        "GET",
        f"/api/v1/namespaces/{MODEL_NAMESPACE}/configmaps?labelSelector={MODEL_LABEL}%3Dtrue",
    )
    assert status == 200, body
    configmaps = {o["metadata"]["name"]: o.get("data") or {} for o in body["items"]}
    try:
        model = decode_model(configmaps)
    except ValueError:
        return None  # caught half-way through a write
    return model.slot(key, index)


def wait_for_renewals(cluster: LocalCluster, node: str, count: int, timeout: float = 60.0) -> None:
    """Waits until the Lease's renewTime has moved `count` times from now."""
    seen: set[str] = set()

    def moved() -> bool:
        current = lease(cluster, node)
        if current is not None:
            seen.add(current["spec"]["renewTime"])
        return len(seen) > count

    wait_for(f"{count} renewals of Lease {node}", moved, timeout)


# -- workloads ---------------------------------------------------------------------------------
def placement_map(namespace: str, name: str, entries: Iterable[tuple[int, str, int]]) -> str:
    """A map with one device a slot."""
    return map_yaml(namespace, name, [(index, node, [device]) for index, node, device in entries])
