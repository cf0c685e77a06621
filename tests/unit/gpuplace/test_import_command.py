"""`gpuplace import`: which workload a pod belongs to and which rank it carries."""

from __future__ import annotations

import importlib
from typing import Any

from kubeio.pod import Pod

command = importlib.import_module("gpuplace.commands.import")


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Pod:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels or {}}
    meta["annotations"] = annotations or {}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return Pod.of({"metadata": meta, "spec": {"nodeName": "n"}, "status": {}})


def test_workloads_and_ranks() -> None:
    sts = pod("llm-3", {"apps.kubernetes.io/pod-index": "3"}, ("StatefulSet", "llm"))
    assert command.workload_of(sts) == ("StatefulSet", "llm")
    assert command.rank_of(sts)[0] == 3
    deploy = pod("web-5d8f-abcde", {"pod-template-hash": "5d8f"}, ("ReplicaSet", "web-5d8f"))
    assert command.workload_of(deploy) == ("Deployment", "web")
    assert command.rank_of(deploy) == (None, "")
    job = pod(
        "train-2-xyz",
        {"batch.kubernetes.io/job-completion-index": "2"},
        ("Job", "train"),
        {"batch.kubernetes.io/job-completion-index": "2"},
    )
    assert command.workload_of(job) == ("Job", "train") and command.rank_of(job)[0] == 2
    jobset = pod("js-w-0-0", {"jobset.sigs.k8s.io/jobset-name": "js"}, ("Job", "js-w-0"))
    assert command.workload_of(jobset) == ("JobSet", "js")
    bare = pod("solo-7")
    assert command.workload_of(bare) == ("Pod", "solo-7") and command.rank_of(bare)[0] == 7
