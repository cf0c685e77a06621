"""`make demo` end to end: the demo's own checks must all pass (it exits 0 only then)."""

from __future__ import annotations

import sys

import pytest

from tests.e2e.demokit import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]  # the demo runs pods on it


@pytest.mark.slow
def test_demo_runs_every_step_and_every_check_passes() -> None:
    # The sync as `kubectl apply --server-side` of the kustomize build; the ArgoCD tier
    # (tests/e2e_argocd) runs the same scenario through ArgoCD.
    result = run_demo("--no-argocd", timeout=900)
    print(result.stdout[-8000:])
    print(result.stderr[-4000:], file=sys.stderr)
    assert result.returncode == 0
    assert "checks passed" in result.stdout
    for step in (
        "sync of",
        # gpuplace plan before the commits: its prediction, then what happened.
        "the plan says 1 pod would move (inference/llm-serving-1)",
        "the unchanged cluster prod is counted, not shown",
        "the controller marks Drifted exactly the pods the plan named: inference/llm-serving-1",
        "llm-serving-1 now runs on gpu-node-4",
        "exactly the pods the plan predicted moved (inference/llm-serving-1)",
        "gpuplace plan exits 1 with the error at clusters/dev/maps/llm-serving.yaml:",
        "rejected by the validating webhook",
        "the running placement is unchanged",
        "names file, line and column",
        # The real node: what the containers themselves printed.
        "inference/gpu-probe-0's container printed CUDA_VISIBLE_DEVICES=0,1",
        "inference/gpu-probe-1's container printed CUDA_VISIBLE_DEVICES=3",
        "kubectl exec sees the same environment",
        # dra enforcement: the claim's allocation and what the container saw.
        "the claim holds exactly localhost gpu-2, reserved for dra-probe-0",
        "the container saw only GPU",
    ):
        assert step in result.stdout
