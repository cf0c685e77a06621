"""The binding key ring's Secret through the chart's lifecycle: `helm install`, `helm upgrade`,
`helm uninstall` and `helm install` again, for real, against a control plane of its own (the chart's
webhook configurations must not govern the pods of the other tests), with a controller filling the
ring. The ring must come out of every step as the controller wrote it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from tests.chartkit import CHART, NAMESPACE, RELEASE, helm
from tests.integration import shellkit
from tests.integration.controllerkit import (
    solo_controller,
    wait_for,
)
from tests.integration.trustkit import gpuplace_key

SECRET = f"/api/v1/namespaces/{NAMESPACE}/secrets/gpuplace-binding-key"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("keyring-cluster")) as local:
        yield local


def helm_on(cluster: LocalCluster, *args: str) -> str:
    result = helm(*args, check=False, env={"KUBECONFIG": str(cluster.kubeconfig)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def secret(cluster: LocalCluster) -> dict[str, Any] | None:
    status, body = cluster.request("GET", SECRET)
    return body if status == 200 else None


def install(cluster: LocalCluster, *extra: str) -> str:
    return helm_on(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        *extra,
    )


def filled_by_a_controller(cluster: LocalCluster, tmp: Path) -> tuple[dict[str, str], str]:
    """Runs a controller until it leads; the Secret's data and the signing key it reports."""
    proc = solo_controller(cluster, "chart")
    try:
        wait_for("the controller leads", lambda: "leading:" in proc.log(), timeout=60)
        listed = gpuplace_key(cluster, "list")
        assert listed.returncode == 0, listed.stderr
        signing = re.search(r"^(\w{16})\s+\S+\s+yes\b", listed.stdout, re.MULTILINE)
        assert signing, listed.stdout
        stored = secret(cluster)
        assert stored is not None
        return dict(stored["data"]), signing.group(1)
    finally:
        proc.stop()
        (tmp / "controller.log").write_text(proc.log())


@pytest.mark.slow
def test_the_ring_outlives_upgrade_uninstall_and_reinstall(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    install(own_cluster)
    rendered = secret(own_cluster)
    assert rendered is not None and not rendered.get("data")  # the controller fills it
    data, key = filled_by_a_controller(own_cluster, tmp_path)
    assert "keyring.json" in data
    log = (tmp_path / "controller.log").read_text()
    assert "made a new binding key ring" in log
    # No placement policy in this cluster: the controller and `gpuplace status` say what that means.
    assert "no placement policy (ConfigMap gpuplace-system/gpuplace-policy)" in log
    status = subprocess.run(
        [sys.executable, "-m", "gpuplace", "status", f"--kubeconfig={own_cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "Grants: no placement policy" in status

    helm_on(
        own_cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "controller.replicas=3",
    )
    after_upgrade = secret(own_cluster)
    assert after_upgrade is not None and after_upgrade["data"] == data

    out = helm_on(own_cluster, "uninstall", RELEASE, "--namespace", NAMESPACE)
    assert "gpuplace-binding-key" in out  # helm says what it kept
    kept = secret(own_cluster)
    assert kept is not None and kept["data"] == data
    status, _ = own_cluster.request(
        "GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpuplace-controller"
    )
    assert status == 404  # the rest of the release is gone

    install(own_cluster)  # adopts the kept Secret, with its data
    reinstalled = secret(own_cluster)
    assert reinstalled is not None and reinstalled["data"] == data
    # The keys never reach helm's own records of the release (readable by whoever deploys it).
    manifest = helm_on(own_cluster, "get", "manifest", RELEASE, "--namespace", NAMESPACE)
    assert data["keyring.json"] not in manifest
    assert reinstalled["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    again, same_key = filled_by_a_controller(own_cluster, tmp_path)
    assert again == data and same_key == key
    assert "made a new binding key ring" not in (tmp_path / "controller.log").read_text()

    # Removed on purpose, with the README's commands as written.
    env = shellkit.shell_env(own_cluster)
    for command in shellkit.UNINSTALL:
        shellkit.sh(command, tmp_path, env)
    assert secret(own_cluster) is None
    status, namespace = own_cluster.request("GET", "/api/v1/namespaces/gpuplace-inventory")
    assert status == 404 or namespace["metadata"].get("deletionTimestamp")
