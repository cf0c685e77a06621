"""A controller that sends its Bindings from worker processes (`--bind-processes`), against the
real apiserver: pods bound as declared, signed with the ring's key, and no worker outlives it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import DEVICES_ANNOTATION, INDEX_ANNOTATION, signature_of, verify_binding
from placement.keyring import parse_ring
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    bound_pods,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    gpu_uuid,
    map_yaml,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
)
from tests.integration.test_fencing import bindings_by, lease, no_gpu_held_twice

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

SECRET = "/api/v1/namespaces/gpuplace-system/secrets/gpuplace-binding-key"


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "bproc", wait=True, timeout=180) as name:
        yield name


def bind_processes(pid: int) -> set[int]:
    """The processes that `pid` started with multiprocessing's spawn (not its resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren
        if int(stat.rpartition(")")[2].split()[1]) == pid and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_bind_processes_bind_signed_pods_and_die_with_the_controller(
    cluster: LocalCluster, namespace: str
) -> None:
    nodes = gpu_nodes(cluster, unique("bp"), 2)
    entries = [(i, nodes[i % 2], [i // 2]) for i in range(6)]
    apply_map(cluster, namespace, "llm", map_yaml(namespace, "llm", entries))
    controller = ControllerProcess(cluster, unique("bp"), "--bind-processes=2")
    try:
        create_workload(cluster, statefulset(namespace, "web", "llm", 6))
        pods = wait_for_bound(cluster, namespace, 6, "6 bound pods")
        status, secret = cluster.request("GET", SECRET)
        assert status == 200, secret
        ring = parse_ring(secret["data"], "the binding key Secret")
        assert ring is not None
        for index, node, devices in entries:
            pod = pods[f"web-{index}"]
            annotations = pod["metadata"]["annotations"]
            assert pod["spec"]["nodeName"] == node
            assert annotations[INDEX_ANNOTATION] == str(index)
            assert annotations[DEVICES_ANNOTATION] == ",".join(gpu_uuid(node, d) for d in devices)
            signature = signature_of(annotations)
            assert signature is not None and signature.key_id == ring.signer.id
            meta = pod["metadata"]
            assert verify_binding(ring.signer.secret, meta["uid"], namespace, annotations)
        workers = wait_for(
            "two bind processes",
            lambda: len(found := bind_processes(controller.proc.pid)) == 2 and found,
        )
        # Killed outright, the controller cannot stop them: they notice and exit on their own.
        os.kill(controller.proc.pid, signal.SIGKILL)
        controller.proc.wait(10)
        wait_for("no bind process left", lambda: not any(alive(pid) for pid in workers))
    finally:
        controller.kill()
        print(controller.log()[-4000:])


def test_bind_processes_of_a_leader_paused_past_its_lease_send_nothing_after_it(
    cluster: LocalCluster, namespace: str
) -> None:
    """The whole process group is paused mid-burst, workers with their queued jobs included; on
    resuming, the jobs' deadlines have passed: not one Binding after the standby took over.

    a has one Binding in flight a process: with 256, its processes had every Binding of the 200
    on the wire before the pause could land, and b found nothing left to bind."""
    nodes = gpu_nodes(cluster, unique("bpp"), 25, gpus=8)
    entries = [(i, nodes[i // 8], [i % 8]) for i in range(200)]
    apply_map(cluster, namespace, "big", map_yaml(namespace, "big", entries))
    name = unique("gpuplace-bpp")
    a_id, b_id = unique("a"), unique("b")
    a = ControllerProcess(cluster, a_id, "--bind-processes=2", "--bind-workers=2", lease=name)
    wait_for("a leads", lambda: "leading: model generation" in a.log())
    b = ControllerProcess(cluster, b_id, "--bind-processes=2", lease=name)
    try:
        create_workload(cluster, statefulset(namespace, "big", "big", 200))
        wait_for("a binds", lambda: len(bindings_by(cluster, a_id, namespace)) >= 10, interval=0.05)
        os.killpg(a.proc.pid, signal.SIGSTOP)
        stopped = datetime.now(UTC)
        wait_for("b takes over", lambda: lease(cluster, name)["holderIdentity"] == b_id)
        wait_for("b binds", lambda: len(bindings_by(cluster, b_id, namespace)) >= 1)
        resumed = datetime.now(UTC)
        os.killpg(a.proc.pid, signal.SIGCONT)
        pods = wait_for(
            "all 200 bound",
            lambda: (p := bound_pods(cluster, namespace)) and len(p) == 200 and p,
            timeout=240,
            interval=1.0,
        )
        wait_for("a exits", lambda: not a.alive(), timeout=30)
        time.sleep(1)  # the audit log is written as each request completes
    finally:
        if a.alive():
            os.killpg(a.proc.pid, signal.SIGCONT)
        a.kill()
        b.stop()
        print(a.log()[-3000:])
        print(b.log()[-6000:])
    sent = bindings_by(cluster, a_id, namespace)
    taken_over = datetime.fromisoformat(lease(cluster, name)["acquireTime"])
    assert stopped < taken_over < resumed
    assert sent, "a bound nothing before it was paused"
    late = [t for t in sent if t >= taken_over]
    assert not late, f"{len(late)} Bindings from {a_id} after {b_id} took the lease"
    no_gpu_held_twice(pods)
