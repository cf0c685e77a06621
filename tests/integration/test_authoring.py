"""`gpuplace import` and `gpuplace move` against the real apiserver, kube-controller-manager,
kube-scheduler and kwok nodes, on a git repository laid out as examples/gitops.

Import: pods whose GPUs kube-scheduler allocated through DRA claims (the driver's ResourceSlices,
claims generated from templates, as in a device-plugin-free cluster) are imported with no agent
pod resources published, so the claims' allocations are read from the apiserver; the maps name
each pod's allocated GPU by UUID, and the plan of the commit against the live cluster moves no
pod. Move: slots on a node are moved off it by a commit whose plan moves exactly their pods."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import git
import grpc
import pytest
import yaml

from agent.podresources import encode_response
from gpuplace_dev.demo.components import FAKE_NVML_DIR, demo_uuid, fake_gpus
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.dra import DraSettings, device_name, slice_for
from placement.inventory import INVENTORY_NAMESPACE
from placement.podresources import POD_RESOURCES_KEY, PodResources, plugin_gpus
from placement.types import MapKey
from placement.validate import parse_map
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create,
    create_workload,
    describe_pending,
    fresh_namespace,
    gpu_uuid,
    inventory_for,
    list_pods,
    map_yaml,
    publish_inventory,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_map,
)
from tests.integration.webhookkit import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import Endpoint, mutating_configuration
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

SETTINGS = DraSettings()
KUSTOMIZATION = """\
# The dev cluster, as the ApplicationSet builds it. A comment a person wrote.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization

generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"

configMapGenerator:
{entries}"""


def run_gpuplace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def repository(root: Path, maps: dict[str, str]) -> git.Repo:
    """A map repository with one cluster directory, clusters/dev, holding `maps` (name ->
    text), committed on main."""
    directory = root / "clusters" / "dev"
    (directory / "maps").mkdir(parents=True)
    entries = ""
    for name, text in maps.items():
        namespace = yaml.safe_load(text)["metadata"]["namespace"]
        (directory / "maps" / f"{name}.yaml").write_text(text)
        entries += (
            f"  - name: {name}\n    namespace: {namespace}\n    files:\n"
            f"      - placement.yaml=maps/{name}.yaml\n"
        )
    (directory / "kustomization.yaml").write_text(KUSTOMIZATION.format(entries=entries))
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "test")
        config.set_value("user", "email", "test@example.com")
    repo.git.add(A=True)
    repo.index.commit("maps")
    return repo


# -- import ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device_class(cluster: LocalCluster) -> None:
    """The driver's DeviceClass (what its chart installs), for kube-scheduler to allocate from."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": SETTINGS.device_class},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{SETTINGS.driver}"'}}]},
    }
    status, resp = cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body)
    assert status in (201, 409), resp


@pytest.fixture
def scheduler(cluster: LocalCluster) -> Iterator[None]:
    cluster.start_scheduler()
    try:
        yield
    finally:
        cluster.stop_scheduler()


def dra_nodes(cluster: LocalCluster, prefix: str, count: int, gpus: int, pool: str) -> list[str]:
    """kwok nodes labelled pool=<pool>, with inventories and the driver's ResourceSlices; the
    first carries the logical name `<prefix>-logical`."""
    names = [unique(f"{prefix}-{i}") for i in range(count)]
    cluster.create_nodes(
        [
            FakeNode(
                n,
                gpus=gpus,
                labels={
                    "pool": pool,
                    **({"gpu-node-name": f"{names[0]}-logical"} if i == 0 else {}),
                },
            )
            for i, n in enumerate(names)
        ]
    )
    for name in names:
        inventory = inventory_for(name, gpus)
        publish_inventory(cluster, inventory)
        status, resp = cluster.request(
            "POST", "/apis/resource.k8s.io/v1/resourceslices", slice_for(inventory, SETTINGS)
        )
        assert status == 201, resp
    return names


def claimed_workload(
    kind: str, namespace: str, name: str, replicas: int, pool: str
) -> dict[str, Any]:
    """A StatefulSet or Deployment of kube-scheduler's whose pods each get one GPU through a
    claim generated from the template `gpu-<name>`."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "nodeSelector": {"pool": pool},
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{name}"}],
            },
        },
    }
    if kind == "StatefulSet":
        spec |= {"serviceName": name, "podManagementPolicy": "Parallel"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def claim_template(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpu-{name}", "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": SETTINGS.device_class}}
                    ]
                }
            }
        },
    }


def allocated_gpu(cluster: LocalCluster, pod: dict[str, Any]) -> str | None:
    """The UUID of the GPU kube-scheduler allocated to the pod's claim, once it has."""
    names = [s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []]
    if not names or not names[0]:
        return None
    ns = pod["metadata"]["namespace"]
    status, claim = cluster.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{names[0]}"
    )
    if status != 200:
        return None
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    for result in results.get("results") or []:
        node = result["pool"]
        index = next(i for i in range(64) if device_name(i) == result["device"])
        return gpu_uuid(node, index)
    return None


def test_import_of_pods_on_dra_claims_plans_zero_moves(
    cluster: LocalCluster, device_class: None, scheduler: None, tmp_path: Path
) -> None:
    pool = unique("import")
    a, _ = dra_nodes(cluster, "import", 2, gpus=2, pool=pool)
    with fresh_namespace(cluster, "adopt") as namespace:
        for kind, name, replicas in (("StatefulSet", "llm", 2), ("Deployment", "web", 2)):
            create(
                cluster,
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
                claim_template(namespace, name),
            )
            create_workload(cluster, claimed_workload(kind, namespace, name, replicas, pool))

        def placed() -> dict[str, tuple[str, str]] | None:
            pods = {p["metadata"]["name"]: p for p in list_pods(cluster, namespace)}
            out = {}
            for name, pod in pods.items():
                gpu = allocated_gpu(cluster, pod)
                if gpu is None or not pod["spec"].get("nodeName"):
                    return None
                out[name] = (pod["spec"]["nodeName"], gpu)
            return out if len(out) == 4 else None

        where = wait_for("kube-scheduler places the 4 pods on their claims", placed, timeout=120)
        root = tmp_path / "repo"
        repo = repository(root, {})
        before = (root / "clusters/dev/kustomization.yaml").read_text()

        done = run_gpuplace(
            "import",
            "--repo",
            str(root),
            "--dir",
            "clusters/dev",
            "--namespace",
            namespace,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--commit",
            "--branch",
            "adopt",
            "--reason",
            "adopt the running pods",
            "--format",
            "json",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # No agent published pod resources here: the claims were read from the apiserver.
        assert (
            "DRA claims read from the apiserver (no pod resources published"
            in (root / "clusters/dev/maps/llm.yaml").read_text()
        )

        assert repo.active_branch.name == "adopt"
        message = repo.head.commit.message
        assert message.startswith("gpuplace import: 2 map(s), 4 slot(s)"), message
        assert "Why: adopt the running pods" in message
        # The kustomization keeps every byte it had and gains the two entries.
        after = (root / "clusters/dev/kustomization.yaml").read_text()
        assert after.startswith(before) and "placement.yaml=maps/web.yaml" in after

        logical = {a: f"{a}-logical"}
        llm = parse_map((root / "clusters/dev/maps/llm.yaml").read_text(), "llm.yaml")
        assert llm.key == MapKey(namespace, "llm")
        for slot in llm.slots:
            node, gpu = where[f"llm-{slot.index}"]
            assert (slot.node, slot.devices) == (logical.get(node, node), (gpu,))
        web = parse_map((root / "clusters/dev/maps/web.yaml").read_text(), "web.yaml")
        assert web.indexing.value == "allocate"
        held = {(logical.get(n, n), g) for p, (n, g) in where.items() if p.startswith("web-")}
        assert {(s.node, s.devices[0]) for s in web.slots} == held

        plan = json.loads(done.stdout)
        summary = plan["summary"]
        assert plan["valid"], done.stdout
        assert summary["slotsAdded"] == 4 and summary["slotsMoved"] == 0
        assert summary["podsDrifting"] == 0 and summary["slotsWaiting"] == 0, done.stdout
        (dev,) = plan["clusters"]
        assert dev["live"]["error"] is None and dev["live"]["drifting"] == []
        repo.close()


# -- move -----------------------------------------------------------------------------------


SCOPE_LABEL = "gpuplace.io/authoring-it"
CONFIGURATION = "gpuplace-authoring-it"


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster) -> Iterator[None]:
    """The webhook, for the namespaces labelled SCOPE_LABEL: the binder places only the pods it
    admitted."""
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, "gpuplace-system").start()
    server = RunningWebhook(
        cluster, generate_ca("authoring-it-ca", timedelta(days=2)), models, port=free_port()
    )
    server.start()
    endpoint = Endpoint(ca_bundle=server.ca.cert_pem, url=f"https://127.0.0.1:{server.port}")
    selector = {"matchLabels": {SCOPE_LABEL: "true"}}
    apply_configuration(
        kube, mutating_configuration(CONFIGURATION, endpoint, namespace_selector=selector)
    )
    try:
        yield
    finally:
        cluster.request(
            "DELETE",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIGURATION}",
        )
        server.stop()
        models.stop()


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster, log_tail=6000) as proc:
        yield proc


def test_move_off_a_node_plans_exactly_the_slots_on_it(
    cluster: LocalCluster, webhook: None, controller: ControllerProcess, tmp_path: Path
) -> None:
    prefix = unique("move")
    nodes = [f"{prefix}-{i}" for i in range(1, 4)]
    cluster.create_nodes([FakeNode(n, gpus=4) for n in nodes])
    for n in nodes:
        publish_inventory(cluster, inventory_for(n, 4))
    a, b, c = nodes
    with fresh_namespace(cluster, "move", labels={SCOPE_LABEL: "true"}) as namespace:
        serving = map_yaml(namespace, "serving", [(0, a, [0]), (1, a, [1, 2]), (2, b, [0])])
        # A person's comment and spacing, which the edit must keep.
        serving = serving.replace("  placements:\n", "  # three replicas\n  placements:\n")
        other = map_yaml(namespace, "other", [(0, c, [0, 1, 2])])
        apply_map(cluster, namespace, "serving", serving)
        apply_map(cluster, namespace, "other", other)
        wait_for_map(cluster, namespace, "serving", "Valid")
        wait_for_map(cluster, namespace, "other", "Valid")
        create_workload(cluster, statefulset(namespace, "x", "serving", 3))
        create_workload(cluster, statefulset(namespace, "y", "other", 1))
        wait_for(
            lambda: f"4 pods bound ({describe_pending(cluster, namespace)})",
            lambda: len(bound_pods(cluster, namespace)) == 4,
            timeout=120,
        )
        root = tmp_path / "repo"
        repo = repository(root, {"serving": serving, "other": other})

        done = run_gpuplace(
            "move",
            "--node",
            a,
            "--repo",
            str(root),
            "--dir",
            "clusters/dev",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--commit",
            "--branch",
            "drain",
            "--format",
            "json",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        plan = json.loads(done.stdout)
        (dev,) = plan["clusters"]
        drifting = {d["pod"]: d["reason"] for d in dev["live"]["drifting"]}
        assert drifting == {f"{namespace}/x-0": "SlotMoved", f"{namespace}/x-1": "SlotMoved"}
        assert plan["summary"]["slotsMoved"] == 2 and plan["valid"]
        assert plan["summary"]["slotsWaiting"] == 0

        text = (root / "clusters/dev/maps/serving.yaml").read_text()
        moved = parse_map(text, "serving.yaml")
        assert moved.by_index[2].node == b and moved.by_index[2].devices == (0,)
        targets = {moved.by_index[0].node, moved.by_index[1].node}
        assert a not in targets
        # b has GPUs 1-3 free, c only GPU 3: the two slots (3 GPUs) go where they fit, and the
        # GPUs they name were free.
        taken = {(b, gpu_uuid(b, 0)), *((c, gpu_uuid(c, i)) for i in range(3))}
        for index in (0, 1):
            slot = moved.by_index[index]
            assert not {(slot.node, d) for d in slot.devices} & taken
        assert "  # three replicas\n" in text
        lines = serving.splitlines()
        matcher = difflib.SequenceMatcher(a=lines, b=text.splitlines(), autojunk=False)
        replaced = [
            lines[i]
            for tag, i1, i2, _, _ in matcher.get_opcodes()
            if tag != "equal"
            for i in range(i1, i2)
        ]
        # Only the node and devices of slots 0 and 1 changed.
        assert replaced == [
            f"      node: {a}",
            "      devices: [0]",
            f"      node: {a}",
            "      devices: [1, 2]",
        ], replaced
        assert repo.head.commit.message.startswith(f"gpuplace move: 2 slot(s) off node {a}")
        repo.close()


def test_freeze_writes_the_controllers_picks_and_moves_no_pod(
    cluster: LocalCluster, webhook: None, controller: ControllerProcess, tmp_path: Path
) -> None:
    (node,) = [unique("freeze")]
    cluster.create_nodes([FakeNode(node, gpus=4)])
    publish_inventory(cluster, inventory_for(node, 4))
    with fresh_namespace(cluster, "freeze", labels={SCOPE_LABEL: "true"}) as namespace:
        picks = (
            "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata:\n"
            f"  name: picks\n  namespace: {namespace}\nspec:\n  placements:\n"
            f"    - index: 0\n      node: {node}\n      count: 2   # the controller picks\n"
            f"    - index: 1\n      node: {node}\n      devices: [3]\n"
        )
        apply_map(cluster, namespace, "picks", picks)
        wait_for_map(cluster, namespace, "picks", "Valid")
        create_workload(cluster, statefulset(namespace, "x", "picks", 2))
        pods = wait_for(
            lambda: f"2 pods bound ({describe_pending(cluster, namespace)})",
            lambda: (found := bound_pods(cluster, namespace)) and len(found) == 2 and found,
            timeout=120,
        )
        held = pods["x-0"]["metadata"]["annotations"]["gpuplace.io/devices"].split(",")
        root = tmp_path / "repo"
        repo = repository(root, {"picks": picks})

        done = run_gpuplace(
            "freeze",
            "--repo",
            str(root),
            "--dir",
            "clusters/dev",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--commit",
            "--format",
            "json",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        text = (root / "clusters/dev/maps/picks.yaml").read_text()
        assert f"      devices: [{', '.join(held)}]   # the controller picks\n" in text
        assert text.replace(f"devices: [{', '.join(held)}]", "count: 2") == picks
        plan = json.loads(done.stdout)
        (dev,) = plan["clusters"]
        assert plan["valid"] and dev["live"]["drifting"] == [], done.stdout
        # The declaration changes (count 2 -> two devices); the pod holding them stays.
        assert plan["summary"]["podsDrifting"] == 0 and plan["summary"]["slotsWaiting"] == 0
        assert repo.head.commit.message.startswith("gpuplace freeze: 1 slot(s)")
        repo.close()


# -- the kubelet's record, published by the agent ------------------------------------------------


@contextmanager
def fake_kubelet(socket: str, pods: list[dict[str, Any]]) -> Iterator[None]:
    """A gRPC server on `socket` that answers the PodResources `List` as a kubelet does (the v1
    wire format) with `pods`."""
    answer = encode_response(pods)
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: answer)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield
    finally:
        server.stop(None)


def plugin_pod(namespace: str, name: str, gpus: list[str]) -> dict[str, Any]:
    """A pod's entry in the kubelet's answer: the device plugin's GPUs of its one container."""
    devices = [{"resource_name": "nvidia.com/gpu", "device_ids": gpus}]
    return {
        "name": name,
        "namespace": namespace,
        "containers": [{"name": "main", "devices": devices}],
    }


def device_plugin_statefulset(namespace: str, name: str, node: str) -> dict[str, Any]:
    """A StatefulSet of 2 pods on `node`, each asking the device plugin for one GPU."""
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"nodeName": node, "containers": [container]},
            },
        },
    }


def test_the_agent_publishes_the_kubelets_record_and_import_reads_device_plugin_gpus_from_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    node = unique("plugin")
    number = 0x61
    cluster.create_nodes([FakeNode(node, gpus=4)])
    gpus = [demo_uuid(number, i) for i in range(4)]
    # A unix socket's path has room for about 100 bytes: tmp_path may be longer.
    sockets = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    socket = str(sockets / "kubelet.sock")
    with fresh_namespace(cluster, "plugin") as namespace:
        create_workload(cluster, device_plugin_statefulset(namespace, "llm", node))
        wait_for(
            "the 2 device-plugin pods Running",
            lambda: (
                sum(p["status"].get("phase") == "Running" for p in list_pods(cluster, namespace))
                == 2
            ),
            timeout=120,
        )
        # What the node's kubelet says the device plugin gave each pod: GPUs 1 and 3.
        record = [
            plugin_pod(namespace, "llm-0", [gpus[1]]),
            plugin_pod(namespace, "llm-1", [gpus[3]]),
        ]
        nvml = tmp_path / "nvml.json"
        nvml.write_text(json.dumps(fake_gpus(node, 4, number)))
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(FAKE_NVML_DIR / "build"),
            "GPUPLACE_FAKE_NVML_CONFIG": str(nvml),
        }
        with fake_kubelet(socket, record):
            agent = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gpuplace",
                    "agent",
                    f"--node={node}",
                    "--once",
                    f"--pod-resources-socket={socket}",
                    "--metrics-address=127.0.0.1:0",
                    f"--kubeconfig={cluster.kubeconfig}",
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
                env=env,
            )
        shutil.rmtree(sockets, ignore_errors=True)
        assert agent.returncode == 0, agent.stdout + agent.stderr
        status, cm = cluster.request(
            "GET", f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{node}"
        )
        assert status == 200, cm
        published = PodResources.from_json(cm["data"][POD_RESOURCES_KEY])
        assert published.node == node
        listed = published.pod(namespace, "llm-1")
        assert listed is not None and plugin_gpus(listed.plugin) == ((gpus[3],), ())

        root = tmp_path / "repo"
        repo = repository(root, {})
        done = run_gpuplace(
            "import",
            "--repo",
            str(root),
            "--dir",
            "clusters/dev",
            "--namespace",
            namespace,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--format",
            "json",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        text = (root / "clusters/dev/maps/llm.yaml").read_text()
        # The kubelet's record, not the pods' specs (which ask for "1 GPU", none in particular).
        assert "device plugin (kubelet pod resources)" in text, text
        assert "DRA claims read from the apiserver" not in text, text
        llm = parse_map(text, "llm.yaml")
        assert {s.index: (s.node, s.devices) for s in llm.slots} == {
            0: (node, (gpus[1],)),
            1: (node, (gpus[3],)),
        }
        plan = json.loads(done.stdout)
        assert plan["valid"], done.stdout
        assert plan["summary"]["slotsAdded"] == 2 and plan["summary"]["slotsMoved"] == 0
        assert plan["summary"]["podsDrifting"] == 0, done.stdout
        repo.close()
