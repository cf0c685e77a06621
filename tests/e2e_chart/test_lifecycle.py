"""The installed chart's lifecycle with pods running on the real node: `helm upgrade` to a new image
tag and to changed values, `helm uninstall` and `helm install` again. No pod is rebound, no GPU is
given twice, admission is answered throughout an upgrade (its longest gap is measured), and while
gpuplace is uninstalled a pod labelled for a map is refused with a message."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpuplace_dev.localcluster import LocalCluster, chart
from placement.annotations import DEVICES_ANNOTATION, MAP_LABEL
from tests.e2e_chart.conftest import Installed
from tests.integration.controllerkit import map_yaml, pending_reason, placement_configmap, wait_for
from tests.integration.test_real_node import admit, probe_pod, wait_running

NEXT_TAG = "0.1.0-next"


def apply(cluster: LocalCluster, obj: dict[str, Any], check: bool = True) -> str:
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=check)
    return result.stdout + result.stderr


def running_pod(cluster: LocalCluster, ns: str, name: str, map_name: str) -> dict[str, Any]:
    admit(cluster, ns, name, map_name)
    return wait_running(cluster, ns, name)


def map_with_a_running_pod(
    cluster: LocalCluster, ns: str, name: str, gpus: list[int]
) -> dict[str, Any]:
    """Map `name` with slot i on GPU gpus[i] of the real node, and its pod `name`-0 running."""
    entries = [(i, "localhost", [gpu]) for i, gpu in enumerate(gpus)]
    apply(cluster, placement_configmap(ns, name, map_yaml(ns, name, entries)))
    return running_pod(cluster, ns, f"{name}-0", name)


@dataclass
class AdmissionProbe:
    """Asks the apiserver to admit (dry run) a pod labelled for a map every 0.2 s: what the
    webhook answers while the chart changes under it."""

    cluster: LocalCluster
    namespace: str
    answered: list[float] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = probe_pod("admission-probe", self.namespace, labels={MAP_LABEL: "m"})
        path = f"/api/v1/namespaces/{self.namespace}/pods?dryRun=All"
        while not self._stop.wait(0.2):
            status, response = self.cluster.request("POST", path, body)
            if status == 201 and response["spec"].get("schedulerName") == "gpuplace":
                self.answered.append(time.monotonic())
            else:
                self.refused.append(f"{status}: {str(response)[:300]}")

    def __enter__(self) -> AdmissionProbe:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def longest_gap(self) -> float:
        times = self.answered
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def test_helm_upgrade_to_a_new_tag_and_values_rebinds_nothing(
    installed: Installed, ns: str
) -> None:
    cluster = installed.cluster
    before = map_with_a_running_pod(cluster, ns, "m", [0, 1])
    chart.import_image(cluster, installed.image, f"gpuplace.local/gpuplace:{NEXT_TAG}")
    changed = {
        "global": {"image": {"tag": NEXT_TAG}},
        "controller": {"podAnnotations": {"example.com/revision": "2"}},
        "webhook": {"podAnnotations": {"example.com/revision": "2"}},
        "agent": {"intervalSeconds": 3},
    }
    with AdmissionProbe(cluster, ns) as probe:
        started = time.monotonic()
        chart.install(cluster, installed.image, installed.nvml, values=[changed], verb="upgrade")
        took = time.monotonic() - started
        time.sleep(2)

    def upgraded() -> bool:
        # The rollouts are done; replaced pods may still be terminating.
        live = [
            p for p in chart.component_pods(cluster) if not p["metadata"].get("deletionTimestamp")
        ]
        images = {p["spec"]["containers"][0]["image"] for p in live}
        return len(live) == 5 and images == {f"gpuplace.local/gpuplace:{NEXT_TAG}"}

    wait_for("only pods of the new tag left", upgraded, timeout=60)
    gap = probe.longest_gap()
    print(
        f"helm upgrade: rolled out in {took:.1f}s; {len(probe.answered)} admissions answered, "
        f"{len(probe.refused)} refused; longest gap between answers {gap:.2f}s"
    )
    assert probe.refused == []
    assert gap < 5.0, gap
    # The running pod: the same object, not restarted, its binding as it was.
    after = wait_running(cluster, ns, "m-0")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    # The new leader holds m-0's GPU: slot 1 gets GPU 1; another map that names GPU 0 conflicts.
    second = running_pod(cluster, ns, "m-1", "m")
    assert second["metadata"]["annotations"][DEVICES_ANNOTATION] == chart.real_node_uuid(1)
    apply(cluster, placement_configmap(ns, "other", map_yaml(ns, "other", [(0, "localhost", [0])])))
    admit(cluster, ns, "other-0", "other")
    wait_for(
        "other-0 waits: its map conflicts with m's slot 0",
        lambda: pending_reason(cluster, ns, "other-0") == "SlotConflict",
    )


def test_uninstall_and_install_keep_running_pods_and_refuse_map_pods_meanwhile(
    installed: Installed, ns: str
) -> None:
    cluster = installed.cluster
    before = map_with_a_running_pod(cluster, ns, "u", [2, 3])

    chart.uninstall(cluster)
    wait_for("the release's pods gone", lambda: chart.component_pods(cluster) == [], timeout=60)
    refused = apply(cluster, probe_pod("u-1", ns, labels={MAP_LABEL: "u"}), check=False)
    assert "gpuplace is not installed or its webhook is not running" in refused, refused
    assert wait_running(cluster, ns, "u-0")["metadata"]["uid"] == before["metadata"]["uid"]

    chart.install(cluster, installed.image, installed.nvml)
    after = running_pod(cluster, ns, "u-1", "u")
    assert after["metadata"]["annotations"][DEVICES_ANNOTATION] == chart.real_node_uuid(3)
    kept = wait_running(cluster, ns, "u-0")
    assert kept["metadata"]["annotations"] == before["metadata"]["annotations"]
    # The reinstalled controller verifies u-0 with the kept key: nothing reported unverifiable.
    for pod in chart.component_pods(cluster):
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] == "controller":
            log = cluster.kubectl("-n", chart.NAMESPACE, "logs", pod["metadata"]["name"]).stdout
            assert "unverifiable binding" not in log
