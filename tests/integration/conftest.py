"""Fixtures for integration tests: one real control plane per session (`gpuplace_dev.localcluster`).

- ``cluster`` (session): a started `LocalCluster`: etcd, kube-apiserver, kube-controller-manager
  and kwok on loopback. Use ``cluster.kubectl(...)``, ``cluster.kube``,
  ``cluster.request(...)``, ``cluster.kubeconfig``, ``cluster.server``, ``cluster.ca_file``,
  ``cluster.ca`` (issue certificates for test TLS servers), ``cluster.create_nodes(...)``.
  Its directory (certificates, ``logs/<component>.log``) is under pytest's base temp directory,
  which pytest keeps for the last few runs: look there when a test fails. Torn down at session
  end, on failures and on Ctrl-C (children are also killed if pytest itself is killed).
- ``api_client`` (session): one admin ``kubernetes.client.ApiClient`` (the official client, to
  check that the local cluster serves it as a real one does).
- ``gpu_nodes`` (session): names of 4 kwok nodes, ``it-gpu-01``..``it-gpu-04``, 8 GPUs each, Ready.
  Tests that need nodes with particular labels create their own, with unique names.
- ``namespace`` (function): a fresh namespace whose ``default`` ServiceAccount exists (so pods can
  be created at once), deleted after the test without waiting.
- ``team_and_tenant`` (function): two fresh namespaces, (the owning team's, a tenant's), for tests
  of what a tenant (``tests.integration.tenantkit.Tenant``) may do to the team; deleted after.
- ``real_cluster`` (module): a second `LocalCluster` with a real node, ``localhost``
  (containerd and a kubelet: pods bound to it run; ``real_cluster.real_node``), labelled
  ``gpu-node-name=realnode``. Only one real node runs on a machine at a time: starting it waits
  for another's to stop, which is why the fixture is per module: a module that starts a real node
  of its own runs while none is up. Tests using it are marked ``real_node``.

Every test collected under ``tests/integration`` is marked ``integration``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from gpuplace_dev.localcluster import LocalCluster, fake_gpu_nodes
from tests.integration.controllerkit import create_system_namespaces, unique

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
        if "real_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_node)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as local:
        yield local


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("real-cluster"),
        real_nodes=1,
        real_node_labels={"gpu-node-name": "realnode"},
    ) as local:
        yield local


@pytest.fixture
def system_namespaces(cluster: LocalCluster) -> None:
    """For modules that run a controller: ``pytest.mark.usefixtures("system_namespaces")``."""
    create_system_namespaces(cluster)


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster) -> Iterator[kubernetes.client.ApiClient]:
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.ca_file)
    configuration.cert_file = str(cluster.layout.cert("admin"))
    configuration.key_file = str(cluster.layout.key("admin"))
    with kubernetes.client.ApiClient(configuration) as client:
        yield client


@pytest.fixture(scope="session")
def gpu_nodes(cluster: LocalCluster) -> list[str]:
    return cluster.create_nodes(fake_gpu_nodes(4, gpus=8, prefix="it-gpu-"))


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 'test'}-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name)
    yield name
    cluster.delete_namespace(name)
    # A component that died mid-test explains the failure better than the test's own assertion.
    cluster.check_alive()


@pytest.fixture
def team_and_tenant(cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    names = (unique("team"), unique("tenant"))
    for name in names:
        cluster.create_namespace(name)
    yield names
    for name in names:
        cluster.delete_namespace(name)
