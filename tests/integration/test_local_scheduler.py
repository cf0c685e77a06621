"""kube-scheduler in the local cluster: its client rate limit raised, stopped and started on demand
(what `make bench` relies on to time it draining a backlog)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.localcluster import LocalCluster, fake_gpu_nodes
from gpuplace_dev.localcluster.layout import ClusterState

NAMESPACE = "sched"


def pod(name: str) -> dict[str, Any]:
    # Default schedulerName: kube-scheduler's.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }


def node_of(cluster: LocalCluster, name: str) -> str:
    status, body = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert status == 200, body
    return str(body["spec"].get("nodeName") or "")


def running(cluster: LocalCluster) -> set[str]:
    return {r.name for r in ClusterState.read(cluster.layout.state_file).processes if r.alive()}


def test_scheduler_with_raised_qps_binds_and_restarts(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path / "cluster", scheduler=True, scheduler_qps=500, namespaces=[NAMESPACE]
    ) as cluster:
        config = yaml.safe_load(cluster.layout.scheduler_config.read_text())
        assert config["clientConnection"]["qps"] == 500.0
        assert config["clientConnection"]["burst"] == 1000
        [node] = cluster.create_nodes(fake_gpu_nodes(1, prefix="sched-node-"))

        status, body = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod("a"))
        assert status == 201, body
        cluster.wait_for("pod a bound", lambda: node_of(cluster, "a") == node, 60)

        cluster.stop_scheduler()
        assert "kube-scheduler" not in running(cluster)
        assert {"etcd", "kube-apiserver", "kwok"} <= running(cluster)
        status, body = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod("b"))
        assert status == 201, body

        cluster.start_scheduler()
        assert "kube-scheduler" in running(cluster)
        cluster.wait_for("pod b bound", lambda: node_of(cluster, "b") == node, 60)
