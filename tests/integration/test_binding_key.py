"""The binding key ring with pods running, against the real apiserver and controller processes: the
key deleted, replaced or corrupted never gives a held GPU to another pod; `gpuplace key adopt`
restores normal holdings; `gpuplace key rotate` keeps every bound pod verified."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import DEVICES_ANNOTATION, SIGNATURE_ANNOTATION
from placement.keyring import KEYRING_FIELD
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    create,
    get_pod,
    gpu_uuid,
    map_status,
    map_yaml,
    pending_reason,
    solo_controller,
    unique,
    wait_for,
)
from tests.integration.trustkit import (
    bound,
    events,
    gpuplace_key,
    map_pod,
    metric,
    node_with_gpus,
    status_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

SECRET = "/api/v1/namespaces/gpuplace-system/secrets/gpuplace-binding-key"
UNVERIFIABLE = "gpuplace.io/BindingUnverifiable"


@pytest.fixture
def team(cluster: LocalCluster) -> Iterator[str]:
    name = unique("keyring")
    cluster.create_namespace(name)
    yield name
    # Its pods go at once: bound under a ring the next test replaces, they would count there.
    cluster.request("DELETE", f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0")
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[list[ControllerProcess]]:
    """Controllers started by the test (the last one leads); all stopped after it. The key ring
    is removed before the test, so that its keys sign this test's pods only (`gpuplace key
    rotate` counts every bound pod of the cluster signed with a key: the controllers of earlier
    tests sign with the ring they found), and after it, so that a corrupt ring does not outlive
    it."""
    cluster.request("DELETE", SECRET)
    procs: list[ControllerProcess] = []
    yield procs
    for proc in procs:
        proc.stop()
    cluster.request("DELETE", SECRET)


def start(cluster: LocalCluster, procs: list[ControllerProcess]) -> ControllerProcess:
    proc = solo_controller(cluster, "key")
    procs.append(proc)
    wait_for("the controller leads", lambda: "leading:" in proc.log(), timeout=60)
    return proc


def placed(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess], name: str, slots: int
) -> tuple[str, ControllerProcess, dict[str, Any]]:
    """A node, map `name` with `slots` slots (slot i on GPU i), a leader, and pod `name`-0 bound."""
    node = node_with_gpus(cluster)
    apply_map(cluster, team, name, map_yaml(team, name, [(i, node, [i]) for i in range(slots)]))
    proc = start(cluster, controller)
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod(f"{name}-0", name))
    pod = wait_for(f"{name}-0 bound", lambda: bound(cluster, team, f"{name}-0"))
    return node, proc, pod


def condition(cluster: LocalCluster, namespace: str, name: str) -> dict[str, str] | None:
    pod = get_pod(cluster, namespace, name) or {}
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == UNVERIFIABLE:
            return dict(cond)
    return None


def key_of(pod: dict[str, object]) -> str:
    annotations = pod["metadata"]["annotations"]  # type: ignore[index]
    return str(annotations[SIGNATURE_ANNOTATION]).split(":")[1]


def key_secret(cluster: LocalCluster) -> dict[str, Any]:
    """The key ring's Secret, which must exist."""
    status, secret = cluster.request("GET", SECRET)
    assert status == 200, secret
    return dict(secret)


def unverifiable(cluster: LocalCluster, namespace: str) -> list[str]:
    """The pods of `namespace` that `gpuplace key list` shows as unverifiable."""
    listed = gpuplace_key(cluster, "list")
    assert listed.returncode == 0, listed.stderr
    return re.findall(rf"^  ({re.escape(namespace)}/[\w-]+): ", listed.stdout, re.MULTILINE)


def signing_key(cluster: LocalCluster) -> str:
    listed = gpuplace_key(cluster, "list")
    assert listed.returncode == 0, listed.stderr
    found = re.search(r"^(\w{16})\s+\S+\s+yes\b", listed.stdout, re.MULTILINE)
    assert found, listed.stdout
    return found.group(1)


def test_a_lost_key_blocks_the_pods_gpus_until_re_adopted(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess]
) -> None:
    node = node_with_gpus(cluster)
    apply_map(cluster, team, "m", map_yaml(team, "m", [(0, node, [0, 1])]))
    first = start(cluster, controller)
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("m-0", "m"))
    held = wait_for("m-0 bound", lambda: bound(cluster, team, "m-0"))
    assert held["metadata"]["annotations"][SIGNATURE_ANNOTATION].startswith("v2:")
    first.stop()

    # The key is lost (helm uninstall + install without the keep policy, a prune, a restore into a
    # fresh cluster), and the map moves slot 0 away while m-0 keeps running on GPUs 0 and 1.
    status, _ = cluster.request("DELETE", SECRET)
    assert status == 200
    apply_map(cluster, team, "m", map_yaml(team, "m", [(0, node, [2]), (1, node, [0, 1])]))
    second = start(cluster, controller)
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("m-1", "m"))
    wait_for("m-1 waits", lambda: pending_reason(cluster, team, "m-1") == "DeviceBusy")
    assert bound(cluster, team, "m-1") is None

    # Reported: Event and condition on the pod, the gauge, gpuplace status, the map's status.
    cond = wait_for("m-0's condition", lambda: condition(cluster, team, "m-0"))
    assert cond["status"] == "True" and cond["reason"] == "BindingUnverifiable"
    assert key_of(held) in cond["message"] and "gpuplace key adopt" in cond["message"]
    wait_for(
        "the Event",
        lambda: any(e["reason"] == "BindingUnverifiable" for e in events(cluster, team, "m-0")),
    )
    # (The gauge counts the whole cluster: pods of other tests may be unverifiable too.)
    blocked = metric(second, "gpuplace_unverifiable_bindings")
    assert blocked >= 1
    assert "BindingUnverifiable" in status_row(cluster, team, "m-0")
    explained = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace",
            "explain",
            f"{team}/m-0",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "BindingUnverifiable: pod" in explained and "gpuplace key adopt" in explained
    shown = wait_for(
        "the map status counts it",
        lambda: (
            (st := map_status(cluster, team, "m")) and st["slots"].get("unverifiable") == 1 and st
        ),
    )
    assert "binding key the key ring no longer holds" in shown["message"]
    listed = gpuplace_key(cluster, "list")
    assert f"{team}/m-0: node {node} GPUs {gpu_uuid(node, 0)},{gpu_uuid(node, 1)}" in listed.stdout

    # Re-adopted: held as verified, reported no more, and still nobody else gets its GPUs.
    dry = gpuplace_key(cluster, "adopt", "--dry-run")
    assert f"would adopt {team}/m-0" in dry.stdout and condition(cluster, team, "m-0")
    adopted = gpuplace_key(cluster, "adopt")
    assert adopted.returncode == 0, adopted.stderr
    assert f"adopting {team}/m-0" in adopted.stdout
    wait_for(
        "the condition turns False",
        lambda: (c := condition(cluster, team, "m-0")) and c["reason"] == "BindingAdopted",
    )
    wait_for("the gauge", lambda: metric(second, "gpuplace_unverifiable_bindings") < blocked)
    assert unverifiable(cluster, team) == []
    assert pending_reason(cluster, team, "m-1") == "DeviceBusy"
    second.stop()
    third = start(cluster, controller)  # a new leader reads the adoption record too
    assert f"unverifiable binding: pod {team}/" not in third.log()
    assert unverifiable(cluster, team) == []
    assert bound(cluster, team, "m-1") is None

    # m-0 gone, its GPUs go to the slot that names them now.
    cluster.request("DELETE", f"/api/v1/namespaces/{team}/pods/m-0?gracePeriodSeconds=0")
    placed = wait_for("m-1 bound", lambda: bound(cluster, team, "m-1"))
    assert placed["metadata"]["annotations"][DEVICES_ANNOTATION] == (
        f"{gpu_uuid(node, 0)},{gpu_uuid(node, 1)}"
    )


def test_rotation_keeps_every_bound_pod_verified_and_retires_unused_keys(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess]
) -> None:
    _node, proc, first = placed(cluster, team, controller, "r", 2)
    k1 = key_of(first)
    assert signing_key(cluster) == k1

    rotated = gpuplace_key(cluster, "rotate")
    assert rotated.returncode == 0, rotated.stderr
    k2 = signing_key(cluster)
    assert k2 != k1 and f"new signing key {k2}" in rotated.stdout
    assert f"kept {k1}: 1 bound pod(s)" in rotated.stdout
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("r-1", "r"))
    second = wait_for("r-1 bound", lambda: bound(cluster, team, "r-1"))
    wait_for("the leader signs with the new key", lambda: key_of(second) == k2)

    # r-0 gone, its key is used by nobody: the next rotation retires it (k2 signed until then).
    cluster.request("DELETE", f"/api/v1/namespaces/{team}/pods/r-0?gracePeriodSeconds=0")
    wait_for("r-0 gone", lambda: get_pod(cluster, team, "r-0") is None)
    again = gpuplace_key(cluster, "rotate")
    assert f"retired {k1}: no bound pod uses it" in again.stdout, again.stdout
    assert f"kept {k2}: 1 bound pod(s)" in again.stdout
    # Every bound pod still verified, by this leader and by the next.
    proc.stop()
    successor = start(cluster, controller)
    assert unverifiable(cluster, team) == []
    assert condition(cluster, team, "r-1") is None
    for leader in (proc, successor):
        assert f"unverifiable binding: pod {team}/" not in leader.log()


def test_a_replaced_key_fails_closed_for_the_running_pods(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess]
) -> None:
    node, proc, _pod = placed(cluster, team, controller, "p", 1)
    # Replaced while the controller runs, in the format of the releases before the ring.
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "gpuplace-binding-key", "namespace": "gpuplace-system"},
        "data": {"key": base64.b64encode(b"r" * 32).decode()},
    }
    status, body = cluster.request("PUT", SECRET, secret)
    assert status == 200, body
    wait_for("p-0 reported", lambda: condition(cluster, team, "p-0"))
    assert unverifiable(cluster, team) == [f"{team}/p-0"]
    assert f"unverifiable binding: pod {team}/p-0" in proc.log()
    # The slot moves to another GPU and a new slot names GPU 0: it waits for p-0.
    apply_map(cluster, team, "p", map_yaml(team, "p", [(0, node, [3]), (1, node, [0])]))
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("p-1", "p"))
    wait_for("p-1 waits", lambda: pending_reason(cluster, team, "p-1") == "DeviceBusy")


def test_a_corrupt_ring_keeps_the_last_good_one_serving_and_is_never_overwritten(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess]
) -> None:
    _node, proc, good = placed(cluster, team, controller, "c", 3)
    secret = key_secret(cluster)
    secret["data"][KEYRING_FIELD] = base64.b64encode(b"{truncated").decode()
    status, body = cluster.request("PUT", SECRET, secret)
    assert status == 200, body
    wait_for("the error is logged", lambda: "binding key ring unreadable" in proc.log())
    assert "data.keyring.json: not JSON" in proc.log()
    assert metric(proc, "gpuplace_binding_key_ring_errors_total") >= 1
    # The last good ring serves: the next pod binds, signed with the same key, c-0 stays verified.
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("c-1", "c"))
    wait_for("c-1 bound", lambda: bound(cluster, team, "c-1"))
    assert key_of(bound(cluster, team, "c-1") or {}) == key_of(good)
    assert condition(cluster, team, "c-0") is None
    # A new leader cannot trust a ring it cannot read: it binds nothing, says why, and leaves the
    # Secret for an administrator to mend.
    proc.stop()
    restarted = solo_controller(cluster, "key")
    controller.append(restarted)
    wait_for("the refusal", lambda: "binding key ring not usable" in restarted.log(), timeout=60)
    assert "delete it to start a new key ring" in restarted.log()
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("c-2", "c"))
    status, kept = cluster.request("GET", SECRET)
    assert kept["data"][KEYRING_FIELD] == secret["data"][KEYRING_FIELD]
    assert bound(cluster, team, "c-2") is None
    # Deleted: a new ring; the pods bound under the old one keep their GPUs, reported.
    cluster.request("DELETE", SECRET)
    wait_for("c-2 bound", lambda: bound(cluster, team, "c-2"), timeout=60)
    wait_for("c-0 reported", lambda: condition(cluster, team, "c-0"))
    wait_for("c-1 reported", lambda: condition(cluster, team, "c-1"))
    adopted = gpuplace_key(cluster, "adopt")
    assert adopted.returncode == 0, adopted.stderr
    assert f"adopting {team}/c-0" in adopted.stdout and f"adopting {team}/c-1" in adopted.stdout


def test_a_key_deleted_under_a_running_leader_is_written_back(
    cluster: LocalCluster, team: str, controller: list[ControllerProcess]
) -> None:
    _node, proc, first = placed(cluster, team, controller, "d", 2)
    before = key_secret(cluster)
    cluster.request("DELETE", SECRET)
    wait_for("the ring written back", lambda: "wrote back the key ring" in proc.log())
    after = key_secret(cluster)
    assert after["data"] == before["data"]
    assert signing_key(cluster) == key_of(first)
    create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("d-1", "d"))
    second = wait_for("d-1 bound", lambda: bound(cluster, team, "d-1"))
    assert key_of(second) == key_of(first)
    assert unverifiable(cluster, team) == [] and condition(cluster, team, "d-0") is None
    # Rendered again empty (a chart re-sync): filled with the same ring.
    status, _ = cluster.request(
        "PUT", SECRET, {**after, "data": None, "metadata": after["metadata"]}
    )
    assert status == 200
    wait_for(
        "filled again",
        lambda: (cluster.request("GET", SECRET)[1].get("data") or {}) == before["data"],
    )
