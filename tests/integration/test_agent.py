"""The NVML agent against the real apiserver (issue 6): real `gpuplace agent` processes whose pynvml
loads the fake libnvidia-ml.so.1, each node with its own JSON, and the real controller using what
they publish."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.annotations import CUDA_ANNOTATION
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, DeviceCheck, NodeInventory
from placement.model import MODEL_NAMESPACE
from placement.types import MapKey, NodeName
from tests.integration.agentkit import (
    AgentProcess,
    FakeGpus,
    agent_kubeconfig,
    build_fake_nvml,
    inventory_configmap,
    lease,
    lease_expired,
    model_slot,
    placement_map,
    published_checks,
    published_inventory,
    run_agent,
    wait_for_renewals,
)
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    describe_pending,
    get_pod,
    gpu_uuid,
    pending_reason,
    statefulset,
    wait_for,
    wait_for_map,
)

pytestmark = pytest.mark.integration

#: Seconds between agent renewals in these tests; the Lease then lasts 3 s.
INTERVAL = 1.0
#: Generous: a loaded CI machine runs a control plane, a controller and several agents.
WAIT = 90.0

StartAgent = Callable[..., AgentProcess]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(autouse=True)
def system_namespaces(cluster: LocalCluster) -> None:
    for name in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        cluster.create_namespace(name)


@pytest.fixture(scope="module")
def library_dir() -> Path:
    return build_fake_nvml()


@pytest.fixture(scope="module")
def kubeconfig(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    for name in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        cluster.create_namespace(name)
    return agent_kubeconfig(cluster, tmp_path_factory.mktemp("agent-credentials"))


@pytest.fixture
def start_agent(cluster: LocalCluster, library_dir: Path, kubeconfig: Path) -> Iterator[StartAgent]:
    started: list[AgentProcess] = []

    def start(node: str, config: Path | None, *extra: str) -> AgentProcess:
        agent = AgentProcess(
            cluster,
            node,
            *extra,
            kubeconfig=kubeconfig,
            library_dir=library_dir,
            config=config,
            interval=INTERVAL,
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
        print(f"--- agent {agent.node} ---\n{agent.log()[-3000:]}")  # shown when a test failed


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    name = unique("agt")
    cluster.create_namespace(name)
    yield name
    cluster.delete_namespace(name)


def kwok_nodes(cluster: LocalCluster, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(1, count + 1)]
    cluster.create_nodes([FakeNode(name, gpus=4) for name in names])
    return names


def scale(cluster: LocalCluster, namespace: str, name: str, replicas: int) -> None:
    cluster.kubectl("-n", namespace, "scale", f"statefulset/{name}", f"--replicas={replicas}")


def wait_for_inventory(
    cluster: LocalCluster, node: str, expected: NodeInventory, what: str = "inventory published"
) -> None:
    wait_for(
        lambda: (
            f"{what}: inventory of {node} equal to {expected}"
            f" (is {published_inventory(cluster, node)})"
        ),
        lambda: published_inventory(cluster, node) == expected,
        timeout=WAIT,
    )


def update_map(cluster: LocalCluster, namespace: str, name: str, text: str) -> None:
    """apply_map, again after a conflict with the controller's own status writes."""

    def attempt() -> bool:
        try:
            apply_map(cluster, namespace, name, text)
        except AssertionError as exc:
            if "Conflict" not in str(exc):
                raise
            return False
        return True

    wait_for(f"map {namespace}/{name} written", attempt, timeout=WAIT)


def check_of(cluster: LocalCluster, node: str, map_key: str, index: int) -> DeviceCheck | None:
    for check in published_checks(cluster, node) or []:
        if check.map == map_key and check.index == index:
            return check
    return None


def test_agents_publish_inventories_that_the_controller_places_by(
    cluster: LocalCluster, namespace: str, start_agent: StartAgent, tmp_path: Path
) -> None:
    a, b, c = kwok_nodes(cluster, unique("ag"), 3)
    gpus = {node: FakeGpus(tmp_path / f"{node}.json", node, 4) for node in (a, b, c)}
    agents = {node: start_agent(node, gpus[node].path) for node in (a, b, c)}

    # The inventories appear, field for field as the fake library reports them.
    for node in (a, b, c):
        wait_for_inventory(cluster, node, gpus[node].expected())
        # The heartbeat Lease follows the first inventory (created right after it).
        current = wait_for(f"the heartbeat Lease of {node}", partial(lease, cluster, node))
        spec = current["spec"]
        assert spec["holderIdentity"] == agents[node].identity
        assert spec["leaseDurationSeconds"] == 3  # three missed renewals of 1 s

    controller = ControllerProcess(cluster, unique("c"))
    try:
        key = f"{namespace}/m"
        # Device 7 on a 4-GPU node: the map is Degraded, naming the node and the device.
        update_map(cluster, namespace, "m", placement_map(namespace, "m", [(0, a, 7), (1, b, 1)]))
        degraded = wait_for_map(
            cluster, namespace, "m", "Degraded", "device 7 not found", timeout=WAIT
        )
        assert a in degraded["message"]
        # The agent of that node says the same about the entry.
        missing = wait_for(
            "the agent's check of m[0]",
            lambda: (ch := check_of(cluster, a, key, 0)) and not ch.ok and ch,
            timeout=WAIT,
        )
        assert missing.reason == "DeviceMissing"
        assert f"device 7 not found on node {a} (4 GPUs, indices 0-3)" in missing.message
        wait_for(
            "the agent's check of m[1] passing",
            lambda: (ch := check_of(cluster, b, key, 1)) is not None and ch.ok,
            timeout=WAIT,
        )

        # A pod for that slot waits with DeviceMissing.
        status, body = cluster.request(
            "POST",
            f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
            statefulset(namespace, "web", "m", 1),
        )
        assert status == 201, body
        wait_for(
            lambda: f"web-0 DeviceMissing ({describe_pending(cluster, namespace)})",
            lambda: pending_reason(cluster, namespace, "web-0") == "DeviceMissing",
            timeout=WAIT,
        )

        # Fixing the map (device 3) binds it.
        fixed = [(0, a, 3), (1, b, 1), (2, c, 0)]
        update_map(cluster, namespace, "m", placement_map(namespace, "m", fixed))
        pod = wait_for(
            lambda: f"web-0 bound ({describe_pending(cluster, namespace)})",
            lambda: (p := get_pod(cluster, namespace, "web-0")) and p["spec"].get("nodeName") and p,
            timeout=WAIT,
        )
        assert pod["spec"]["nodeName"] == a
        assert pod["metadata"]["annotations"][CUDA_ANNOTATION] == "3"
        wait_for(
            "the agent's check of m[0] passing",
            lambda: (ch := check_of(cluster, a, key, 0)) is not None and ch.ok,
            timeout=WAIT,
        )

        # A critical XID on node b's GPU 1: the inventory shows it unhealthy, and a new pod for
        # the slot on that device waits with DeviceUnhealthy.
        gpus[b].xid(1, 79)
        inventory = wait_for(
            f"GPU 1 of {b} unhealthy in its inventory",
            lambda: (i := published_inventory(cluster, b)) and not i.by_index[1].healthy and i,
            timeout=WAIT,
        )
        assert inventory.by_index[1].health_reason == "XID 79 (GPU has fallen off the bus)"
        assert [d.index for d in inventory.devices if not d.healthy] == [1]
        scale(cluster, namespace, "web", 2)
        wait_for(
            lambda: f"web-1 DeviceUnhealthy ({describe_pending(cluster, namespace)})",
            lambda: pending_reason(cluster, namespace, "web-1") == "DeviceUnhealthy",
            timeout=WAIT,
        )
        unhealthy = wait_for(
            "the agent's check of m[1] failing",
            lambda: (ch := check_of(cluster, b, key, 1)) and not ch.ok and ch,
            timeout=WAIT,
        )
        assert unhealthy.reason == "DeviceUnhealthy"
        assert "XID 79" in unhealthy.message

        # A GPU that NVML can no longer query (no event: found by the next poll).
        gpus[a].fail(2, "GPU_IS_LOST")
        lost = wait_for(
            f"GPU 2 of {a} unhealthy in its inventory",
            lambda: (i := published_inventory(cluster, a)) and not i.by_index[2].healthy and i,
            timeout=WAIT,
        ).by_index[2]
        assert "NVML cannot query the device" in lost.health_reason
        assert lost.uuid == gpus[a].expected().by_index[2].uuid  # still named, so maps see it

        # Stopping node c's agent makes its inventory stale: a pod for c waits.
        model_key = MapKey(namespace, "m")
        wait_for(
            f"m[2] resolved against the inventory of {c}",
            lambda: (slot := model_slot(cluster, model_key, 2)) is not None and slot.resolved,
            timeout=WAIT,
        )
        assert agents[c].stop() == 0
        assert published_inventory(cluster, c) == gpus[c].expected()  # left in place
        # The controller compiles without an inventory it judges stale: m[2] keeps only the
        # declared index.
        wait_for(
            f"the controller to drop the stale inventory of {c}",
            lambda: (slot := model_slot(cluster, model_key, 2)) is not None and not slot.devices,
            timeout=WAIT,
        )
        assert lease_expired(cluster, c)
        scale(cluster, namespace, "web", 3)
        wait_for(
            lambda: f"web-2 InventoryStale ({describe_pending(cluster, namespace)})",
            lambda: pending_reason(cluster, namespace, "web-2") == "InventoryStale",
            timeout=WAIT,
        )
        for node in (a, b):
            assert agents[node].alive()
        for agent in agents.values():
            assert "Forbidden" not in agent.log()
    finally:
        controller.stop()
        print(f"--- controller ---\n{controller.log()[-3000:]}")


def test_agent_writes_only_changes_and_repairs_its_configmap(
    cluster: LocalCluster, start_agent: StartAgent, tmp_path: Path
) -> None:
    (node,) = kwok_nodes(cluster, unique("aw"), 1)
    gpus = FakeGpus(tmp_path / "nvml.json", node, 4)
    agent = start_agent(node, gpus.path)
    wait_for_inventory(cluster, node, gpus.expected())
    # No model entry targets this fresh node.
    assert wait_for("checks published", lambda: published_checks(cluster, node) == [], WAIT)
    before = inventory_configmap(cluster, node)
    assert before is not None
    wait_for_renewals(cluster, node, 3, timeout=WAIT)
    after = inventory_configmap(cluster, node)
    assert after is not None
    # Renewals touch the Lease only.
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # /healthz, /readyz and /metrics.
    port = wait_for("the metrics port in the log", agent.metrics_port, timeout=WAIT)
    base = f"http://127.0.0.1:{port}"
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(base + path, timeout=10) as response:
            assert response.status == 200
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'gpuplace_agent_devices{health="healthy"} 4.0' in metrics
    assert 'gpuplace_agent_devices{health="unhealthy"} 0.0' in metrics
    assert 'gpuplace_agent_publishes_total{key="inventory.json"}' in metrics

    # Someone else's edit is undone, and a deleted ConfigMap comes back.
    path = f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{node}"
    forged = NodeInventory(NodeName(node)).to_json()
    status, body = cluster.request("PATCH", path, {"data": {INVENTORY_KEY: forged}})
    assert status == 200, body
    wait_for_inventory(cluster, node, gpus.expected(), "the edit undone")
    status, body = cluster.request("DELETE", path)
    assert status == 200, body
    wait_for_inventory(cluster, node, gpus.expected(), "the ConfigMap recreated")
    assert published_checks(cluster, node) == []

    # A deleted Lease is recreated by the next renewal.
    status, body = cluster.request(
        "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{INVENTORY_NAMESPACE}/leases/{node}"
    )
    assert status == 200, body
    wait_for("the Lease recreated", lambda: lease(cluster, node) is not None, timeout=WAIT)
    assert agent.stop() == 0
    assert "agent stopped" in agent.log()


RunAgent = Callable[..., tuple[int, str]]


@pytest.fixture
def run_agent_on(library_dir: Path, kubeconfig: Path, tmp_path: Path) -> RunAgent:
    """Runs `gpuplace agent --node=NODE --kubeconfig=... FLAGS` to completion, the fake NVML
    reading `config`; returns (exit status, output), which is kept in `tmp_path/<log>.log`."""

    def run(node: str, config: Path, log: str, *flags: str) -> tuple[int, str]:
        return run_agent(
            "agent",
            f"--node={node}",
            f"--kubeconfig={kubeconfig}",
            *flags,
            library_dir=library_dir,
            config=config,
            log_path=tmp_path / f"{log}.log",
        )

    return run


def assert_nothing_published(cluster: LocalCluster, node: str) -> None:
    assert inventory_configmap(cluster, node) is None
    assert lease(cluster, node) is None


def test_without_nvml_the_agent_exits_unless_told_to_publish_empty(
    cluster: LocalCluster, run_agent_on: RunAgent, tmp_path: Path
) -> None:
    (node,) = kwok_nodes(cluster, unique("an"), 1)
    missing = tmp_path / "no-such.json"  # the fake then answers DRIVER_NOT_LOADED
    status, output = run_agent_on(node, missing, "absent")
    assert status == 1, output
    assert "NVML is not available on this node" in output
    assert "--publish-empty" in output
    assert_nothing_published(cluster, node)

    status, output = run_agent_on(node, missing, "empty", "--once", "--publish-empty")
    assert status == 0, output
    assert published_inventory(cluster, node) == NodeInventory(NodeName(node))
    assert lease(cluster, node) is not None


def test_once_print_writes_nothing_and_once_publishes_once(
    cluster: LocalCluster, run_agent_on: RunAgent, tmp_path: Path
) -> None:
    (node,) = kwok_nodes(cluster, unique("ao"), 1)
    gpus = FakeGpus(tmp_path / "nvml.json", node, 2)
    status, output = run_agent_on(node, gpus.path, "print", "--once", "--print", "--output=json")
    assert status == 0, output
    printed = json.loads(output)
    assert NodeInventory.from_json(json.dumps(printed["inventory"])) == gpus.expected()
    assert_nothing_published(cluster, node)

    status, output = run_agent_on(node, gpus.path, "once", "--once")
    assert status == 0, output
    assert published_inventory(cluster, node) == gpus.expected()
    assert published_checks(cluster, node) == []
    assert lease(cluster, node) is not None


def test_a_removed_gpu_is_logged_by_uuid_not_by_the_index_that_moved(
    cluster: LocalCluster, start_agent: StartAgent, tmp_path: Path
) -> None:
    """GPU 0 goes away; NVML numbers the other three 0..2. The log names GPU 0 and its UUID as
    gone, and the others as renumbered, never 'GPU 3 disappeared'."""
    (node,) = kwok_nodes(cluster, unique("ar"), 1)
    gpus = FakeGpus(tmp_path / "nvml.json", node, 4)
    agent = start_agent(node, gpus.path)
    wait_for_inventory(cluster, node, gpus.expected())
    gone = gpus.devices.pop(0)
    for index, device in enumerate(gpus.devices):
        device["index"] = index
    gpus.write()
    wait_for_inventory(cluster, node, gpus.expected(), "the three GPUs published")
    log = agent.log()
    assert f"GPU 0 ({gone['uuid']}) disappeared" in log
    assert "GPU 3 disappeared" not in log and "GPU 3 (" not in log
    assert f"GPU {gpu_uuid(node, 3)} is now index 2 (was 3)" in log
    assert agent.stop() == 0
