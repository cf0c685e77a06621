"""A pod's unrelated fields cost the controller nothing to hold (controller/trim.py): pending pods
of the binder's schedulerName and no map label (they skip the webhook) carrying 100 KB of
annotations each leave the controller's memory within a few MiB of the same pods without them.

Two controllers run side by side on the real apiserver, each serving a schedulerName of its own,
so each caches one set of 1,000 pods: plain ones, and the same with 100 KB of annotations. The
pods exist before the controllers start (the list a restart makes), and each controller has
written its verdict on every one of its pods before its resident memory is read."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from controller.trim import POD_SHAPE, trim_pod
from gpuplace_dev.localcluster import LocalCluster
from kubeio.informer import Informer
from kubeio.paths import PODS as PODS_PATH
from placement.annotations import JOB_COMPLETION_INDEX
from tests.integration.controllerkit import (
    ControllerProcess,
    fresh_namespace,
    pending_reason,
    pod_body,
    solo_controller,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]

PODS = 1000
ANNOTATION_BYTES = 100 * 1024
#: The margin: the fat pods' controller may hold at most this much more than the plain one's.
MARGIN_MIB = 16


def rss_mib(proc: ControllerProcess) -> float:
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def create_pods(cluster: LocalCluster, namespace: str, scheduler: str, fat: bool) -> list[str]:
    names = [f"p-{i}" for i in range(PODS)]

    # Distinct text per pod, so nothing is shared between them anywhere.
    def annotations(i: int) -> dict[str, str]:
        return {f"example.com/blob-{k}": f"{i}-" + "x" * (ANNOTATION_BYTES // 4) for k in range(4)}

    def one(i: int) -> None:
        meta = {"annotations": annotations(i)} if fat else {}
        spec = {"schedulerName": scheduler, "containers": [{"name": "c", "image": "busybox"}]}
        status, resp = cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            pod_body(namespace, names[i], spec, **meta),
        )
        assert status == 201, resp

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(PODS)))
    return names


@pytest.fixture
def two_namespaces(cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    with (
        fresh_namespace(cluster, "trim-plain") as plain,
        fresh_namespace(cluster, "trim-fat") as fat,
    ):
        yield plain, fat


def test_unrelated_annotations_cost_the_controller_nothing(
    cluster: LocalCluster, two_namespaces: tuple[str, str]
) -> None:
    plain_ns, fat_ns = two_namespaces
    plain_name, fat_name = unique("plain"), unique("fat")
    plain_pods = create_pods(cluster, plain_ns, plain_name, fat=False)
    fat_pods = create_pods(cluster, fat_ns, fat_name, fat=True)
    procs = [
        solo_controller(cluster, "trim", f"--scheduler-name={plain_name}", "--no-legacy"),
        solo_controller(cluster, "trim", f"--scheduler-name={fat_name}", "--no-legacy"),
    ]
    try:
        for proc, namespace, names in zip(
            procs, (plain_ns, fat_ns), (plain_pods, fat_pods), strict=True
        ):
            for name in names:
                wait_for(
                    lambda ns=namespace, n=name, p=proc: f"pod {ns}/{n} judged\n{p.log()[-3000:]}",
                    lambda ns=namespace, n=name: pending_reason(cluster, ns, n) == "NoPlacement",
                    timeout=300,
                )
        plain_mib, fat_mib = (rss_mib(p) for p in procs)
        print(
            f"controller RSS with {PODS} pending pods: {plain_mib:.1f} MiB without annotations, "
            f"{fat_mib:.1f} MiB with {ANNOTATION_BYTES // 1024} KB of annotations each "
            f"({fat_mib - plain_mib:+.1f} MiB; the annotations total {PODS * ANNOTATION_BYTES >> 20} MiB)"
        )
        assert all(p.alive() for p in procs)
        assert fat_mib - plain_mib < MARGIN_MIB
    finally:
        for proc in procs:
            proc.stop()


def test_pods_decoded_by_their_shape_are_cached_as_whole_pods_trimmed(
    cluster: LocalCluster, two_namespaces: tuple[str, str]
) -> None:
    """The pod informer's shape (controller/trim.py POD_SHAPE) builds only the fields the trim
    reads: what it caches, listed and watched, is what trimming the whole pods caches."""
    namespace = two_namespaces[0]
    scheduler = unique("shape")
    spec = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "c",
                "image": "busybox",
                "env": [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}],
            }
        ],
        "initContainers": [{"name": "i", "image": "busybox"}],
    }
    meta = {"labels": {"team": "a"},
            "annotations": {JOB_COMPLETION_INDEX: "1", "example.com/other": "x" * 1000}}  # fmt: skip
    status, resp = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(namespace, "listed", spec, **meta)
    )
    assert status == 201, resp
    path = PODS_PATH.collection(namespace)
    trim = partial(trim_pod, legacy=True)
    informers = [
        Informer(cluster.kube, path, name="shaped", transform=trim, shape=POD_SHAPE),
        Informer(cluster.kube, path, name="whole", transform=trim),
    ]
    for informer in informers:
        informer.start()
    try:
        for informer in informers:
            assert informer.wait_synced(60)
        status, resp = cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            pod_body(namespace, "watched", spec, **meta),
        )
        assert status == 201, resp
        wait_for(
            "both informers to see the watched pod",
            lambda: all(i.get(namespace, "watched") is not None for i in informers),
            timeout=60,
        )
        shaped, whole = (dict(i.store) for i in informers)
        assert set(shaped) == {(namespace, "listed"), (namespace, "watched")}
        assert shaped == whole
        listed = shaped[(namespace, "listed")]
        assert listed["metadata"]["annotations"] == {JOB_COMPLETION_INDEX: "1"}
        assert listed["spec"]["containers"][0]["env"] == spec["containers"][0]["env"]
    finally:
        for informer in informers:
            informer.stop()
