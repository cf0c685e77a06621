"""The local Argo Workflows pieces that need no controller: a Workflow's result as the test tier
reads it, the argoexec image, and the pinned release."""

from __future__ import annotations

import io
import json
import tarfile

from gpuplace_dev.localargowf.binaries import argo_workflows_version, cached
from gpuplace_dev.localargowf.launcher import (
    WorkflowResult,
    argoexec_image,
    argoexec_image_name,
)
from gpuplace_dev.localcluster.images import oci_archive

FAILED = {
    "metadata": {"name": "gpuplace-preflight-llm", "namespace": "maps"},
    "status": {
        "phase": "Failed",
        "message": "child 'gpuplace-preflight-llm-123' failed",
        "startedAt": "2026-12-01T10:00:00Z",
        "finishedAt": "2026-12-01T10:00:09Z",
        "nodes": {
            "a": {"displayName": "gpuplace-preflight-llm", "type": "Steps", "phase": "Failed"},
            "b": {"displayName": "index-0", "type": "Pod", "phase": "Succeeded", "message": ""},
            "c": {
                "displayName": "index-1",
                "type": "Pod",
                "phase": "Failed",
                "message": "llm index 1: device 7 not found on node localhost (4 GPUs)",
            },
        },
    },
}


def test_a_failed_workflow_names_each_failed_step_with_its_message() -> None:
    result = WorkflowResult.from_object(FAILED)
    assert result.finished and result.phase == "Failed"
    assert dict(result.failed_steps) == {
        "index-1": "llm index 1: device 7 not found on node localhost (4 GPUs)"
    }
    assert result.finished_at == "2026-12-01T10:00:09Z"


def test_a_running_or_new_workflow_has_not_finished() -> None:
    running = {"metadata": {"name": "w"}, "status": {"phase": "Running"}}
    assert not WorkflowResult.from_object(running).finished
    assert not WorkflowResult.from_object({"metadata": {"name": "w"}}).finished


def test_the_argoexec_image_runs_argoexec_and_is_named_by_its_release() -> None:
    archive = oci_archive(argoexec_image(b"\x7fELF", "v4.0.5"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    (manifest,) = index["manifests"]
    assert manifest["annotations"]["io.containerd.image.name"] == argoexec_image_name("v4.0.5")
    assert argoexec_image_name("v4.0.5") == "gpuplace.local/argoexec:v4.0.5"


def test_the_cache_directory_is_per_pinned_release() -> None:
    version = argo_workflows_version()
    assert version.startswith("v4.")
    assert cached().root.name == f"argo-workflows-{version}"
