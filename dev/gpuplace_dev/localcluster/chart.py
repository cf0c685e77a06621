"""charts/gpuplace installed for real on a local cluster's real node, from the image built here.

`install` imports the image (`make image`, hack/build-image.sh) into the real node's containerd,
gives the release namespace the Pod Security level the agent needs (it mounts NVML from the host),
points the agent at the fake NVML library through the chart's own `agent.nvml` mount, and runs
`helm install`; controller, webhook and agent then run as pods on node `localhost` with their
ServiceAccounts, the apiserver reaching the webhook through its Service and the pods reaching the
apiserver through the `kubernetes` Service (`LocalCluster(pod_network=True)`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.localcluster.cluster import LocalCluster
from gpuplace_dev.localcluster.realnode import REAL_NODE_NAME
from gpuplace_dev.localcluster.tools import CHART, REPO_ROOT, helm_binary, helm_env

RELEASE = "gpuplace"
NAMESPACE = "gpuplace-system"
INVENTORY_NAMESPACE = "gpuplace-inventory"
FAKE_NVML = REPO_ROOT / "tests" / "fakenvml" / "build" / "libnvidia-ml.so.1"
#: Where the agent finds the fake library's configuration, inside its nvml mount.
NVML_CONFIG = "/opt/gpuplace/nvml/nvml.json"


class ChartError(RuntimeError):
    pass


@dataclass(frozen=True)
class BuiltImage:
    name: str
    digest: str  # the manifest's: what a registry and `make image` name it by
    id: str  # the config's: the image ID a kubelet reports for a locally imported image
    archive: Path


def build_image(*, force: bool = False) -> BuiltImage:
    """`make image`: the archive in the cache when it was built from these sources."""
    result = subprocess.run(
        [str(REPO_ROOT / "hack" / "build-image.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
        env={**os.environ, "IMAGE_FORCE": "1" if force else "0"},
    )
    if result.returncode != 0:
        raise ChartError(f"hack/build-image.sh failed:\n{result.stderr[-3000:]}")
    fields = dict(re.findall(r"^(\w+):\s+(\S+)$", result.stdout, re.MULTILINE))
    archive = Path(result.stdout.strip().splitlines()[-1])
    return BuiltImage(fields["image"], fields["digest"], fields["id"], archive)


def import_image(cluster: LocalCluster, image: BuiltImage, *also: str) -> None:
    """Into the real node's containerd (namespace k8s.io), under its name and the names `also`
    (another tag of the same image, for an upgrade)."""
    node = cluster.real_node
    node.ctr("images", "import", "--label=io.cri-containerd.image=managed", str(image.archive))
    for name in also:
        node.ctr("images", "tag", "--force", image.name, name)
        node.ctr("images", "label", name, "io.cri-containerd.image=managed")


def nvml_directory(cluster: LocalCluster, devices: Mapping[str, Any]) -> Path:
    """The fake NVML library and its configuration in one directory, mounted by the chart's
    `agent.nvml` (hostPathType Directory)."""
    if not FAKE_NVML.is_file():
        raise ChartError(f"{FAKE_NVML} is missing: run `make fakenvml`")
    directory = cluster.directory / "nvml"
    directory.mkdir(exist_ok=True)
    shutil.copy2(FAKE_NVML, directory / FAKE_NVML.name)
    tmp = directory / "nvml.json.tmp"
    tmp.write_text(json.dumps(devices, indent=1))
    tmp.replace(directory / "nvml.json")
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def fake_nvml(count: int) -> dict[str, Any]:
    """A fake NVML configuration of `count` H100s for the real node (UUIDs `real_node_uuid`)."""
    devices = [
        {
            "index": index,
            "uuid": real_node_uuid(index),
            "name": "NVIDIA H100 80GB HBM3",
            "memoryTotalMiB": 81559,
            "pciBusId": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            "numaNode": index // 2,
        }
        for index in range(count)
    ]
    return {"driverVersion": "550.54.15", "cudaDriverVersion": "12.4", "devices": devices}


def real_node_uuid(index: int) -> str:
    return f"GPU-10ca1000-0000-4000-8000-{index:012x}"


def local_values(image: BuiltImage, nvml: Path) -> dict[str, Any]:
    """The chart's values for the local cluster: the image built here (never pulled), every pod
    on the real node, the agent on the fake NVML library."""
    repository, _, tag = image.name.rpartition(":")
    on_real_node = {"kubernetes.io/hostname": REAL_NODE_NAME}
    return {
        "global": {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}},
        "controller": {"nodeSelector": on_real_node},
        "webhook": {"nodeSelector": on_real_node},
        "agent": {
            "nodeSelector": on_real_node,
            "intervalSeconds": 2,
            "nvml": {"hostPath": str(nvml), "hostPathType": "Directory"},
            "extraEnv": [{"name": "GPUPLACE_FAKE_NVML_CONFIG", "value": NVML_CONFIG}],
        },
    }


class Helm:
    """helm against one cluster, with a private home (no user configuration leaks in)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.env = helm_env(cluster.kubeconfig)

    def __call__(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [str(helm_binary()), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=self.env,
        )
        if result.returncode != 0:
            raise ChartError(f"helm {' '.join(args[:2])}: {result.stderr.strip()}")
        return result.stdout


#: What NVIDIA's GPU feature discovery puts on a GPU node, and the chart's agent selects.
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"


def prepare_namespace(cluster: LocalCluster, namespace: str = NAMESPACE) -> None:
    """The release namespace, with the privileged Pod Security level: the agent mounts NVML from
    the host (hostPath); and the real node labelled as a GPU node."""
    cluster.kubectl("label", "--overwrite", "node", REAL_NODE_NAME, GPU_NODE_LABEL)
    cluster.create_namespace(namespace)
    cluster.kubectl(
        "label",
        "--overwrite",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=privileged",
    )


def install(
    cluster: LocalCluster,
    image: BuiltImage,
    nvml: Path,
    *,
    values: Sequence[Mapping[str, Any]] = (),
    verb: str = "install",
    timeout: float = 240,
) -> str:
    """`helm install` (or `upgrade`) of the chart with the local values and `values` over them;
    returns once every component's pods are Running and Ready on the real node."""
    files = []
    for i, layer in enumerate((local_values(image, nvml), *values)):
        path = cluster.directory / f"chart-values-{i}.yaml"
        path.write_text(yaml.safe_dump(dict(layer)))
        files += ["-f", str(path)]
    prepare_namespace(cluster)
    out = Helm(cluster)(verb, RELEASE, str(CHART), "--namespace", NAMESPACE, *files)
    wait_ready(cluster, timeout=timeout)
    return out


def plan_cluster_role() -> dict[str, Any]:
    """The chart's ClusterRole gpuplace-plan (what `gpuplace plan` may read), as `helm template`
    renders it with the default values, for clusters where the chart itself is not installed."""
    template = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    result = subprocess.run(
        [str(helm_binary()), *template, "--show-only", "templates/plan-clusterrole.yaml"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=helm_env(),
    )
    if result.returncode != 0:
        raise ChartError(f"helm template: {result.stderr.strip()}")
    role: dict[str, Any] = yaml.safe_load(result.stdout)
    return role


def uninstall(cluster: LocalCluster) -> str:
    return Helm(cluster)("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")


def component_pods(cluster: LocalCluster, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    status, body = cluster.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods?labelSelector=app.kubernetes.io/part-of%3Dgpuplace",
    )
    if status != 200:
        raise ChartError(f"listing the release's pods: HTTP {status}")
    return list(body["items"])


def _ready(pod: Mapping[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


WORKLOADS = (
    "deployment/gpuplace-controller",
    "deployment/gpuplace-webhook",
    "daemonset/gpuplace-agent",
)


def wait_ready(cluster: LocalCluster, *, timeout: float = 240) -> list[dict[str, Any]]:
    """Until every component's rollout is done (`kubectl rollout status`: as many updated, Ready
    pods as the workload wants, none of an older revision left); returns the Ready pods."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = [
            w
            for w in WORKLOADS
            if cluster.kubectl(
                "-n", NAMESPACE, "rollout", "status", "--timeout=2s", w, check=False
            ).returncode
        ]
        if not pending:
            return [p for p in component_pods(cluster) if _ready(p)]
        time.sleep(1)
    summary = "; ".join(
        f"{p['metadata']['name']} {p['status'].get('phase')}"
        f" {[c.get('state') for c in p['status'].get('containerStatuses') or []]}"
        for p in component_pods(cluster)
    )
    raise ChartError(f"the chart's pods did not become Ready in {timeout:.0f}s: {summary}")
