"""The agent publishes MIG devices, NVLink peers and PCIe switch peers: a real `gpuplace agent`
whose pynvml loads the fake libnvidia-ml.so.1, writing to the real apiserver."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.inventory import INVENTORY_NAMESPACE, NodeInventory
from placement.model import MODEL_NAMESPACE
from tests.integration.agentkit import (
    AgentProcess,
    agent_kubeconfig,
    build_fake_nvml,
    published_inventory,
)
from tests.integration.controllerkit import wait_for

pytestmark = pytest.mark.integration

FAKENVML = Path(__file__).resolve().parents[1] / "fakenvml"
WAIT = 90.0

StartAgent = Callable[[str, Path], AgentProcess]


@pytest.fixture(scope="module")
def kubeconfig(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    for name in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        cluster.create_namespace(name)
    return agent_kubeconfig(cluster, tmp_path_factory.mktemp("agent-credentials"))


@pytest.fixture
def start_agent(cluster: LocalCluster, kubeconfig: Path) -> Iterator[StartAgent]:
    library_dir = build_fake_nvml()
    started: list[AgentProcess] = []

    def start(node: str, config: Path) -> AgentProcess:
        cluster.create_nodes([FakeNode(node, gpus=8)])
        agent = AgentProcess(
            cluster, node, kubeconfig=kubeconfig, library_dir=library_dir, config=config
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
        print(f"--- agent {agent.node} ---\n{agent.log()[-3000:]}")  # shown when a test failed


def published(
    cluster: LocalCluster, node: str, ready: Callable[[NodeInventory], bool]
) -> NodeInventory:
    def current() -> NodeInventory | None:
        inventory = published_inventory(cluster, node)
        return inventory if inventory is not None and ready(inventory) else None

    found: NodeInventory = wait_for(f"inventory of {node}", current, timeout=WAIT)
    return found


def copy_config(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copy(FAKENVML / name, path)
    return path


def test_mig_devices_are_published_and_follow_the_gpu(
    cluster: LocalCluster, start_agent: StartAgent, tmp_path: Path
) -> None:
    node = f"mig-{uuid.uuid4().hex[:6]}"
    config = copy_config("h100-mig.json", tmp_path)
    start_agent(node, config)
    inventory = published(cluster, node, lambda i: bool(i.devices))
    (gpu,) = inventory.devices
    assert gpu.mig_mode
    assert [(m.profile, m.start, m.size) for m in gpu.mig_instances] == [
        ("3g.40gb", 0, 4),
        ("2g.20gb", 4, 2),
        ("1g.10gb", 6, 1),
        ("1g.10gb", 7, 1),
    ]
    big = gpu.mig_instances[0].uuid
    assert inventory.mig_parent[big].uuid == gpu.uuid

    # An administrator destroys the 3g.40gb instance: the next inventory no longer lists it.
    data = json.loads(config.read_text())
    del data["devices"][0]["migInstances"][0]
    tmp = config.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(config)
    after = published(cluster, node, lambda i: big not in i.mig_by_uuid)
    assert [m.profile for m in after.devices[0].mig_instances] == ["2g.20gb", "1g.10gb", "1g.10gb"]


def test_nvlink_and_pcie_switch_peers_are_published(
    cluster: LocalCluster, start_agent: StartAgent, tmp_path: Path
) -> None:
    node = f"nvl-{uuid.uuid4().hex[:6]}"
    start_agent(node, copy_config("nvlink-pairs.json", tmp_path))
    inventory = published(cluster, node, lambda i: len(i.devices) == 8)
    for gpu in inventory.devices:
        partner = inventory.by_index[gpu.index ^ 1].uuid
        assert (gpu.nvlink_peers, gpu.pcie_switch_peers) == ((partner,), (partner,)), gpu
