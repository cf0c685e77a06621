"""Who holds which GPU, seen four ways on a real cluster: `gpuplace gpus` (the grid, from the pods'
annotations), the controller's /metrics (`gpuplace_gpu_holder`, from its slot cache), `gpuplace
status`/`explain -o json`, and the chart's dashboard queries evaluated by a real Prometheus
(Debian's package, installed by `make test`) scraping the real controller and webhook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import DEVICES_ANNOTATION, MAP_LABEL
from tests.chartkit import CHART
from tests.integration.controllerkit import (
    ControllerProcess,
    gpu_uuid,
    occupied_gpus,
    wait_for,
    write_kubeconfig,
)
from tests.integration.webhookkit import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import Endpoint, mutating_configuration
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration

MODEL_NAMESPACE = "gpuplace-system"


def gpuplace(cluster: LocalCluster, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gpuplace", *args, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


@pytest.fixture(scope="module")
def placed(cluster: LocalCluster) -> Iterator[tuple[str, list[str], ControllerProcess, int]]:
    with occupied_gpus(cluster, "obs", "--metrics-address") as placed:
        yield placed


def test_the_grid_agrees_with_the_annotations_and_the_slot_cache(
    cluster: LocalCluster, placed: tuple[str, list[str], ControllerProcess, int]
) -> None:
    namespace, nodes, _controller, port = placed
    node_flags = [f"--node={n}" for n in nodes]
    data = json.loads(gpuplace(cluster, "gpus", "-o", "json", *node_flags))
    cells = data["gpus"]
    assert sorted((c["node"], c["index"]) for c in cells) == [
        (n, i) for n in sorted(nodes) for i in range(4)
    ]
    # From the pods' own annotations: which pod holds which UUID.
    status, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    assert status == 200
    by_annotations = {
        (uuid_, p["metadata"]["name"])
        for p in body["items"]
        if p["spec"].get("nodeName")
        for uuid_ in p["metadata"]["annotations"][DEVICES_ANNOTATION].split(",")
    }
    by_grid = {(c["uuid"], h["pod"]) for c in cells for h in c["holders"]}
    assert by_grid == by_annotations and len(by_grid) == 3
    # From the controller's slot cache, as /metrics exports it.
    text = wait_for(
        "the holders in /metrics",
        lambda: (t := metrics(port)) and t.count(f'namespace="{namespace}"') >= 3 and t,
    )
    by_cache = {
        (m["UUID"], m["pod"])
        for m in (
            dict(re.findall(r'(\w+)="([^"]*)"', line))
            for line in text.splitlines()
            if line.startswith("gpuplace_gpu_holder{")
        )
        if m["namespace"] == namespace
    }
    assert by_cache == by_grid
    states = {(c["node"], c["index"]): c["state"] for c in cells}
    assert states[(nodes[1], 3)] == "degraded" and states[(nodes[1], 0)] == "free"
    assert data["summary"]["held"] == 3 and data["summary"]["degraded"] == 1
    # The text grid: a row per node, a column per GPU.
    grid = gpuplace(cluster, "status", "--gpus", "--map", f"{namespace}/llm", *node_flags)
    assert grid.splitlines()[0].split() == ["NODE", "GPU0", "GPU1", "GPU2", "GPU3"]
    assert "llm#0" in grid and nodes[0] in grid
    # The map holds nothing on the second node (its slot waits for the unhealthy GPU): not shown.
    assert nodes[1] not in grid and "DEGRADED" not in grid


def test_status_and_explain_as_json_and_yaml(
    cluster: LocalCluster, placed: tuple[str, list[str], ControllerProcess, int]
) -> None:
    namespace, nodes, _controller, _port = placed
    status = json.loads(gpuplace(cluster, "status", "-o", "json"))
    assert set(status) == {"maps", "pods", "placementPolicy", "degradedDevices"}
    ours = [m for m in status["maps"] if m["map"] == f"{namespace}/llm"]
    assert ours and ours[0]["status"]["phase"] in ("Valid", "Degraded")
    pods = {p["name"]: p for p in status["pods"] if p["namespace"] == namespace}
    assert pods["web-0"]["node"] == nodes[0] and pods["web-2"]["node"] == ""
    assert yaml.safe_load(gpuplace(cluster, "status", "-o", "yaml")).keys() == status.keys()
    bound = json.loads(gpuplace(cluster, "explain", f"{namespace}/web-0", "-o", "json"))
    assert bound["node"] == nodes[0] and bound["byGpuplace"] and bound["index"] == "0"
    assert bound["map"] == "llm"
    assert bound["gpus"] == ",".join(gpu_uuid(nodes[0], d) for d in (0, 1))
    # Created with the webhook's wiring (as the binder requires of a map's pod): the container
    # sees the binding's CUDA_VISIBLE_DEVICES.
    assert bound["cudaVisibleDevices"] == "0,1"
    waiting = yaml.safe_load(gpuplace(cluster, "explain", f"{namespace}/web-2", "-o", "yaml"))
    assert waiting["node"] == "" and "DeviceUnhealthy" in waiting["pending"]


def test_context_selects_the_kubeconfig_context(cluster: LocalCluster, tmp_path: Path) -> None:
    config_path = write_kubeconfig(
        cluster, tmp_path / "kubeconfig", "admin", {"token": "not-a-token"}
    )
    config = yaml.safe_load(config_path.read_text())
    good = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    # A second context, "real", with the cluster's own credentials; the current one fails.
    config["users"].append({"name": "real", "user": good["users"][0]["user"]})
    config["contexts"].append({"name": "real", "context": {"cluster": "local", "user": "real"}})
    config_path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "gpuplace", "gpus", "-o", "json", f"--kubeconfig={config_path}"]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0
    chosen = subprocess.run(
        [*argv, "--context=real"], capture_output=True, text=True, timeout=60, check=False
    )
    assert chosen.returncode == 0, chosen.stderr
    assert "gpus" in json.loads(chosen.stdout)


@pytest.fixture
def webhook(cluster: LocalCluster) -> Iterator[tuple[RunningWebhook, str]]:
    """The webhook in this process, registered for one labelled namespace."""
    label = "gpuplace.io/obs-it"
    namespace = f"obs-hook-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace, labels={label: "true"})
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, MODEL_NAMESPACE).start()
    running = RunningWebhook(
        cluster, generate_ca("obs-it-ca", timedelta(days=1)), models, port=free_port()
    )
    running.start()
    name = f"gpuplace-obs-it-{uuid.uuid4().hex[:6]}"
    endpoint = Endpoint(ca_bundle=running.ca.cert_pem, url=f"https://127.0.0.1:{running.port}")
    selector = {"matchLabels": {label: "true"}}
    apply_configuration(kube, mutating_configuration(name, endpoint, namespace_selector=selector))
    try:
        yield running, namespace
    finally:
        cluster.request(
            "DELETE", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
        )
        running.stop()
        models.stop()


class Prometheus:
    """Debian's prometheus scraping `targets` ({job: (scheme, host:port)}) every second."""

    def __init__(self, workdir: Path, targets: dict[str, tuple[str, str]]) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus not found: make test installs Debian's prometheus"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": job,
                    "scheme": scheme,
                    "tls_config": {"insecure_skip_verify": True},
                    "static_configs": [{"targets": [address]}],
                }
                for job, (scheme, address) in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "GOMAXPROCS": "1"},
        )

    def ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited; see prometheus.log"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.mark.slow
def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    cluster: LocalCluster,
    placed: tuple[str, list[str], ControllerProcess, int],
    webhook: tuple[RunningWebhook, str],
    tmp_path: Path,
) -> None:
    namespace, _nodes, _controller, port = placed
    running, hook_namespace = webhook
    dashboard = json.loads((CHART / "dashboards" / "gpuplace.json").read_text())
    # As Grafana sends them with the Cluster variable at "All": its allValue for $cluster.
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "cluster"]
    queries = [
        (p["title"], t["expr"].replace("$cluster", variable["allValue"]))
        for p in dashboard["panels"]
        for t in p["targets"]
    ]
    prometheus = Prometheus(
        tmp_path,
        {
            "gpuplace-controller": ("http", f"127.0.0.1:{port}"),
            "gpuplace-webhook": ("https", f"127.0.0.1:{running.port}"),
        },
    )
    try:
        wait_for("prometheus ready", prometheus.ready, timeout=60)
        wait_for(
            "both targets scraped",
            lambda: len(prometheus.query("up == 1")) == 2,
            timeout=60,
        )
        # Traffic while Prometheus watches: admissions through the webhook (dry-run pods).
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "probe-", "labels": {MAP_LABEL: "none"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            cluster.request("POST", f"/api/v1/namespaces/{hook_namespace}/pods?dryRun=All", pod)
            time.sleep(0.2)
        for title, expr in queries:
            wait_for(f"data for {title!r}: {expr}", lambda e=expr: prometheus.query(e), timeout=30)
        # This test's pods (the shared cluster holds other tests' too, some on nodes with no
        # inventory, whose `gpu` label is empty and so absent in Prometheus).
        holders = prometheus.query(f'gpuplace_gpu_holder{{namespace="{namespace}"}}')
        assert holders and {"UUID", "Hostname", "gpu", "pod", "map", "index"} <= set(
            holders[0]["metric"]
        )
    finally:
        prometheus.stop()
