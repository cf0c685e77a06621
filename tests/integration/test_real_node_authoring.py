"""`gpuplace import` and `gpuplace move` on the local cluster's real node: kube-scheduler allocates
each pod's claim from the fake DRA driver's ResourceSlice and the kubelet has the driver prepare
it (what each gpu-probe container printed says which GPU it got). The agent publishes the real
kubelet's PodResources answer; the imported map declares exactly the GPUs the pods hold and plans
zero moves. The StatefulSet then switches to the map (each new pod is bound to its
predecessor's GPU), and `gpuplace move --gpu` re-places the one slot on that GPU: its plan moves
exactly that pod, and once the map's ConfigMap holds the edited file the pod, deleted, runs on its
new GPU while the others keep their uid."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from gpuplace_dev.demo.components import Components, demo_uuid
from gpuplace_dev.demo.realnode import printed as report
from gpuplace_dev.localcluster import GPU_PROBE_IMAGE, REAL_NODE_NAME, LocalCluster
from placement.annotations import DRIFTED_CONDITION, MAP_LABEL, PLACEMENT_MAP_LABEL
from placement.dra import DraSettings
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from placement.podresources import POD_RESOURCES_KEY, PodResources
from placement.validate import parse_map
from tests.integration.controllerkit import apply_map, get_pod, wait_for
from tests.integration.test_real_node import GPUS, NODE_NUMBER, logs

SETTINGS = DraSettings()
REPLICAS = 3
KUSTOMIZATION = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization

generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"

configMapGenerator: []
"""


@pytest.fixture(scope="module")
def components(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The agent (publishing the real kubelet's pod resources), the fake DRA driver, the
    DeviceClass kube-scheduler allocates from, kube-scheduler, the controller and the webhook in
    dra enforcement."""
    for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        real_cluster.create_namespace(namespace)
    components = Components(real_cluster, tmp_path_factory.mktemp("components-authoring"))
    socket = real_cluster.real_node.layout.kubelet_root / "pod-resources" / "kubelet.sock"
    try:
        config = components.agent(
            REAL_NODE_NAME, GPUS, interval=1.0, number=NODE_NUMBER, pod_resources=socket
        )
        components.dra_driver(config)
        components.controller(enforcement="dra")
        components.webhook(enforcement="dra")
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": SETTINGS.device_class},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{SETTINGS.driver}"'}}]
            },
        }
        status, resp = real_cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body)
        assert status in (201, 409), resp
        real_cluster.start_scheduler()
        yield
    finally:
        real_cluster.stop_scheduler()
        components.stop()
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            real_cluster.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/gpuplace")


@pytest.fixture
def ns(real_cluster: LocalCluster, components: None) -> Iterator[str]:
    name = f"real-adopt-{uuid.uuid4().hex[:6]}"
    real_cluster.create_namespace(name)
    yield name
    real_cluster.request(
        "DELETE", f"/api/v1/namespaces/{name}/configmaps?labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
    )
    real_cluster.request("DELETE", f"/apis/apps/v1/namespaces/{name}/statefulsets/probe")
    real_cluster.request("DELETE", f"/api/v1/namespaces/{name}/pods")
    wait_for(
        f"the pods of {name} gone",
        lambda: not real_cluster.request("GET", f"/api/v1/namespaces/{name}/pods")[1]["items"],
        timeout=90,
    )
    real_cluster.delete_namespace(name)


def statefulset(namespace: str) -> dict[str, Any]:
    """gpu-probe pods, each with one GPU through a claim kube-scheduler allocates."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "replicas": REPLICAS,
            "serviceName": "probe",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "probe",
                            "image": GPU_PROBE_IMAGE,
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                },
            },
        },
    }


def claim_template(namespace: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": SETTINGS.device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pods(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")[1]["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def seen_gpus(cluster: LocalCluster, namespace: str, name: str) -> str:
    """The GPUs the container says it got: the driver's CDI edits (NVIDIA_VISIBLE_DEVICES)."""
    return report(logs(cluster, namespace, name, "-c", "probe")).get("NVIDIA_VISIBLE_DEVICES", "")


def running(cluster: LocalCluster, namespace: str, labelled: bool) -> dict[str, str] | None:
    """Pod -> uid once all REPLICAS pods run ready (with the map label when `labelled`)."""
    found = pods(cluster, namespace)
    ready = {
        n: p["metadata"]["uid"]
        for n, p in found.items()
        if (MAP_LABEL in p["metadata"].get("labels", {})) == labelled
        and any(s.get("ready") for s in p.get("status", {}).get("containerStatuses") or [])
    }
    return ready if len(ready) == REPLICAS else None


def run_gpuplace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def test_pods_the_dra_driver_prepared_are_imported_then_one_gpus_slot_moves(
    real_cluster: LocalCluster, ns: str, tmp_path: Path
) -> None:
    status, resp = real_cluster.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
        claim_template(ns),
    )
    assert status == 201, resp
    status, resp = real_cluster.request(
        "POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", statefulset(ns)
    )
    assert status == 201, resp
    wait_for(
        f"{REPLICAS} gpu-probe pods running on their claims",
        lambda: running(real_cluster, ns, labelled=False),
        timeout=180,
    )
    held = {f"probe-{i}": seen_gpus(real_cluster, ns, f"probe-{i}") for i in range(REPLICAS)}
    all_gpus = {demo_uuid(NODE_NUMBER, i) for i in range(GPUS)}
    assert set(held.values()) <= all_gpus and len(set(held.values())) == REPLICAS, held

    def published() -> PodResources | None:
        status, cm = real_cluster.request(
            "GET", f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{REAL_NODE_NAME}"
        )
        text = (cm.get("data") or {}).get(POD_RESOURCES_KEY) if status == 200 else None
        record = PodResources.from_json(text) if text else None
        ok = record is not None and all(record.pod(ns, p) for p in held)
        return record if ok else None

    record = wait_for("the agent to publish the kubelet's pod resources", published, timeout=60)

    root = tmp_path / "repo"
    directory = root / "clusters" / "dev"
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(KUSTOMIZATION)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "test")
        config.set_value("user", "email", "test@example.com")
    repo.git.add(A=True)
    repo.index.commit("an empty cluster directory")
    common = (
        *("--repo", str(root), "--dir", "clusters/dev"),
        *("--kubeconfig", str(real_cluster.kubeconfig), "--format", "json"),
    )

    done = run_gpuplace("import", "--namespace", ns, "--commit", "--branch", "adopt", *common)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (directory / "maps" / "probe.yaml").read_text()
    listed = record.pod(ns, "probe-0")
    assert listed is not None
    # The kubelet's answer where it lists the pod's DRA devices, the claims' allocations where it
    # does not (the map's header says which).
    source = (
        "DRA (kubelet pod resources)" if listed.claims else "DRA claims read from the apiserver"
    )
    assert source in text, text
    imported = parse_map(text, "probe.yaml")
    assert {s.index: (s.node, s.devices) for s in imported.slots} == {
        i: ("realnode", (held[f"probe-{i}"],)) for i in range(REPLICAS)
    }
    plan = json.loads(done.stdout)
    assert plan["valid"], done.stdout
    assert plan["summary"]["slotsAdded"] == REPLICAS and plan["summary"]["slotsMoved"] == 0
    assert plan["summary"]["podsDrifting"] == 0, done.stdout

    # The commit applied, then the StatefulSet handed to the map: each new pod is bound to the
    # slot of its ordinal, its predecessor's GPU, which the driver prepares for it.
    apply_map(real_cluster, ns, "probe", text)
    patch = [
        {"op": "add", "path": "/spec/template/metadata/labels/gpuplace.io~1map", "value": "probe"},
        {"op": "remove", "path": "/spec/template/spec/resourceClaims"},
        {"op": "remove", "path": "/spec/template/spec/containers/0/resources"},
    ]
    real_cluster.kubectl(
        "-n", ns, "patch", "statefulset", "probe", "--type=json", "-p", json.dumps(patch)
    )
    uids = wait_for(
        "the StatefulSet's pods replaced by the map's",
        lambda: running(real_cluster, ns, labelled=True),
        timeout=240,
    )
    for name, gpu in held.items():
        assert seen_gpus(real_cluster, ns, name) == gpu, name

    moving = "probe-1"
    (free,) = all_gpus - set(held.values())
    done = run_gpuplace(
        "move", "--gpu", held[moving], "--commit", "--branch", "rma", "--reason", "RMA", *common
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)
    (dev,) = plan["clusters"]
    assert {d["pod"]: d["reason"] for d in dev["live"]["drifting"]} == {
        f"{ns}/{moving}": "SlotMoved"
    }
    assert plan["summary"]["slotsMoved"] == 1 and plan["summary"]["slotsWaiting"] == 0
    moved = parse_map((directory / "maps" / "probe.yaml").read_text(), "probe.yaml")
    # The only free GPU of the node, on the same node; the other slots as imported.
    assert {s.index: (s.node, s.devices) for s in moved.slots} == {
        i: ("realnode", (free if i == 1 else held[f"probe-{i}"],)) for i in range(REPLICAS)
    }

    # The commit applied: the map's ConfigMap updated from the edited file.
    apply_map(real_cluster, ns, "probe", (directory / "maps" / "probe.yaml").read_text())
    wait_for(
        f"{moving} marked Drifted",
        lambda: any(
            c.get("type") == DRIFTED_CONDITION and c.get("status") == "True"
            for c in (get_pod(real_cluster, ns, moving) or {}).get("status", {}).get("conditions")
            or []
        ),
        timeout=60,
    )
    real_cluster.kubectl("-n", ns, "delete", "pod", moving, "--wait=false")
    after = wait_for(
        f"{moving} back, running",
        lambda: (
            (found := running(real_cluster, ns, labelled=True))
            and found[moving] != uids[moving]
            and found
        ),
        timeout=180,
    )
    assert seen_gpus(real_cluster, ns, moving) == free
    assert {n: u for n, u in after.items() if n != moving} == {
        n: u for n, u in uids.items() if n != moving
    }
    assert repo.active_branch.name == "rma" and str(repo.head.commit.message).startswith(
        "gpuplace move"
    )
    repo.close()
