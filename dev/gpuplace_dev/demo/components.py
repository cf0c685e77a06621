"""gpuplace's own components as local processes: agents (fake NVML), controller, webhook."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.process import die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[3]
FAKE_NVML_DIR = REPO_ROOT / "tests" / "fakenvml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_uuid(node_number: int, index: int) -> str:
    """The UUIDs the example maps name: node number and device index, readable on purpose."""
    return f"GPU-{node_number:08x}-0000-4000-8000-{index:012x}"


def fake_gpus(
    node: str,
    count: int,
    number: int | None = None,
    mig: Mapping[int, list[dict[str, object]]] | None = None,
) -> dict[str, object]:
    """A fake NVML configuration: `count` H100s with UUIDs derived from the node's number (the
    name's last ``-<n>`` unless given); the GPUs of `mig` are in MIG mode with those instances
    (tests/fakenvml/README.md's `migInstances`)."""
    if number is None:
        number = int(node.rsplit("-", 1)[-1])
    devices = []
    for index in range(count):
        devices.append(
            {
                "index": index,
                "uuid": demo_uuid(number, index),
                "name": "NVIDIA H100 80GB HBM3",
                "memoryTotalMiB": 81559,
                "memoryUsedMiB": 0,
                "pciBusId": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                "numaNode": index // 2,
            }
        )
        if mig and index in mig:
            devices[-1].update({"migMode": True, "migInstances": mig[index]})
    return {"driverVersion": "550.54.15", "cudaDriverVersion": "12.4", "devices": devices}


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> Component:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            start_new_session=True,
            # The demo's children die with it, however it ends.
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Components:
    """Starts and stops everything gpuplace runs, against one local cluster."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.items: list[Component] = []
        self.webhook_port = 0
        #: Each controller's /metrics and read-only web view ports, by component name.
        self.metrics_ports: dict[str, int] = {}
        self.web_ports: dict[str, int] = {}

    def _gpuplace(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpuplace", *args, f"--kubeconfig={self.cluster.kubeconfig}"]

    def _add(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Component:
        component = Component(name, argv, self.cluster.logs_dir / f"{name}.log", env or {})
        self.items.append(component.start())
        return component

    def agent(
        self,
        node: str,
        gpus: int,
        interval: float = 2.0,
        number: int | None = None,
        mig: Mapping[int, list[dict[str, object]]] | None = None,
        pod_resources: Path | None = None,
    ) -> Path:
        """An agent for ``node`` whose fake NVML reports ``gpus`` devices (UUIDs from ``number``,
        MIG instances from ``mig``, see `fake_gpus`); ``pod_resources``: the kubelet's
        pod-resources socket it publishes from (none read otherwise)."""
        config = self.workdir / f"nvml-{node}.json"
        config.write_text(json.dumps(fake_gpus(node, gpus, number, mig), indent=1))
        env = {
            "LD_LIBRARY_PATH": str(FAKE_NVML_DIR / "build"),
            "GPUPLACE_FAKE_NVML_CONFIG": str(config),
            "NODE_NAME": node,
        }
        self._add(
            f"agent-{node}",
            self._gpuplace(
                "agent",
                f"--node={node}",
                f"--interval={interval}",
                "--metrics-address=127.0.0.1:0",
                f"--pod-resources-socket={pod_resources or ''}",
            ),
            env,
        )
        return config

    def controller(
        self, enforcement: str = "env", identity: str = "demo", name: str = "controller"
    ) -> Component:
        """A controller replica; replicas with other identities wait for the leader's Lease.
        Its metrics and web view listen on ports of its own (`metrics_ports`, `web_ports`)."""
        self.metrics_ports[name], self.web_ports[name] = free_port(), free_port()
        return self._add(
            name,
            self._gpuplace(
                "controller",
                f"--identity={identity}",
                f"--metrics-address=127.0.0.1:{self.metrics_ports[name]}",
                f"--web-address=127.0.0.1:{self.web_ports[name]}",
                "--lease-seconds=5",
                "--renew-deadline-seconds=3",
                "--retry-seconds=1",
                f"--enforcement={enforcement}",
            ),
        )

    def dra_driver(self, nvml_config: Path, taints: Path | None = None) -> Component:
        """The fake GPU DRA driver (hack/dra-driver) as the real node's kubelet plugin: it
        publishes the GPUs of ``nvml_config`` (and their MIG instances) as the node's
        ResourceSlice, with the device taints of ``taints`` (device UUID -> taints, JSON), and
        prepares claims through CDI specs that name exactly the allocated devices."""
        node = self.cluster.real_node
        layout = node.layout
        socket = layout.plugins_registry / "gpu.nvidia.com-reg.sock"
        if len(str(socket)) > 107:  # sun_path: the kubelet could not dial the plugin either
            raise RuntimeError(
                f"{socket}: longer than a unix socket path may be (107 bytes); "
                "put the cluster in a shorter directory"
            )
        return self._add(
            "dra-driver",
            [
                str(node.binaries.dra_driver),
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--node={node.name}",
                f"--nvml-config={nvml_config}",
                f"--cdi-dir={layout.cdi_dir}",
                f"--registrar-dir={layout.plugins_registry}",
                f"--plugin-dir={layout.plugins / 'gpu.nvidia.com'}",
                *([f"--taints={taints}"] if taints is not None else []),
            ],
        )

    def webhook(self, enforcement: str = "env", *extra: str) -> Component:
        """The webhook over HTTPS on loopback, with a serving certificate from the cluster's CA,
        registered with the apiserver (objectSelector on the gpuplace labels, failurePolicy Fail)."""
        self.webhook_port = free_port()
        pair = self.cluster.ca.issue_server("gpuplace-webhook")
        cert, key = self.workdir / "webhook.crt", self.workdir / "webhook.key"
        pair.write(cert, key)
        return self._add(
            "webhook",
            self._gpuplace(
                "webhook",
                "--host=127.0.0.1",
                f"--port={self.webhook_port}",
                f"--tls-cert-file={cert}",
                f"--tls-key-file={key}",
                f"--tls-ca-file={self.cluster.ca_file}",
                f"--register=https://127.0.0.1:{self.webhook_port}",
                f"--enforcement={enforcement}",
                *extra,
            ),
        )

    def remove(self, name: str) -> None:
        """Stops the component ``name`` (to start it again with other flags)."""
        for component in [c for c in self.items if c.name == name]:
            component.stop()
            self.items.remove(component)

    def check_alive(self) -> None:
        for component in self.items:
            if not component.alive():
                raise RuntimeError(f"{component.name} exited:\n{component.log_tail()}")

    def stop(self) -> None:
        for component in reversed(self.items):
            component.stop()
