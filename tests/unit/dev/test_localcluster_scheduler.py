"""kube-scheduler's configuration in the local cluster: the client rate limit is what changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.cluster import scheduler_configuration


def test_scheduler_configuration_raises_client_qps_and_burst() -> None:
    config = scheduler_configuration(Path("/c/kube-scheduler.kubeconfig"), 5000)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["clientConnection"] == {
        "kubeconfig": "/c/kube-scheduler.kubeconfig",
        "qps": 5000.0,
        "burst": 10000,
    }
    assert config["leaderElection"] == {"leaderElect": False}
    # parallelism and profiles stay at kube-scheduler's defaults
    assert "parallelism" not in config
    assert "profiles" not in config


def test_scheduler_configuration_burst_is_at_least_one() -> None:
    assert scheduler_configuration(Path("k"), 0.2)["clientConnection"]["burst"] == 1


def test_scheduler_qps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="scheduler_qps"):
        LocalCluster(scheduler_qps=0)


def test_start_scheduler_needs_a_cluster_of_this_process() -> None:
    with pytest.raises(RuntimeError, match="start_scheduler"):
        LocalCluster().start_scheduler()
