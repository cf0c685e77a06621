"""The users' flow with ArgoCD itself: git commit -> ApplicationSet -> Application sync -> pods
placed as declared (`make e2e-argocd`).

Runs `gpuplace demo --argocd`: the local control plane with a real node, Redis and ArgoCD's
application-controller, repo-server and applicationset-controller (built from the argo-cd Go module
by hack/build-argocd.sh), and a file:// git repository made from examples/gitops that holds
gpuplace too (its chart and argocd/): the app of apps installs the chart from the image built here,
then the ApplicationSet syncs the maps, and the in-cluster controller places the pods. The demo checks every claim it prints
and exits non-zero on the first that fails; this test also asserts that each step happened and
that the Application's sync and health status was shown at each one.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.e2e.demokit import run_demo

pytestmark = pytest.mark.argocd

APP = "Application gpuplace-maps-dev"


def test_git_commits_reach_the_cluster_through_argocd() -> None:
    result = run_demo("--argocd", timeout=1200)
    print(result.stdout)
    print(result.stderr[-4000:], file=sys.stderr)
    out = result.stdout
    assert result.returncode == 0
    assert re.search(r"All \d+ checks passed", out)

    # Each step, in order, with the Application status ArgoCD reported there.
    steps = [
        "ok  ArgoCD components running, destination cluster dev registered",
        # the app of apps installs gpuplace before any map
        "kubectl apply -f argocd/root.yaml",
        "Application gpuplace: sync Synced @ ",
        "ok  the ApplicationSet gpuplace-placement-maps (wave 0) was applied only once Application "
        "gpuplace (wave -10) was Healthy",
        "ok  controller (2 replicas), webhook (2 replicas) and the agent DaemonSet are Ready",
        "ok  every one runs on localhost from the image built here",
        "ok  the agent pod published localhost's inventory (fake NVML)",
        "ok  the ApplicationSet generated Application gpuplace-maps-dev",
        # the first commit syncs, the maps are validated, and the Lua check turns them Healthy
        "ok  every map is Valid",
        f"{APP}: sync Synced @ ",
        "health Healthy, last sync Succeeded",
        "ok  inference/llm-serving-1 on gpu-node-2, GPUs 0,1",
        # a commit moving a slot syncs and takes effect
        "ok  gpuplace diff shows the moved slot",
        "ok  llm-serving-1 now runs on gpu-node-4 with CUDA_VISIBLE_DEVICES=2",
        # an invalid map: ArgoCD's apply is refused by the webhook with the located message
        f"{APP}: sync OutOfSync @ ",
        'admission webhook "placementmaps.gpuplace.io" denied the request',
        "placement.yaml:15:20: error: spec.placements[0].devices[1]: device 2 listed twice",
        "ok  gpuplace-maps-dev shows the failed sync and the webhook's message (OutOfSync)",
        "ok  the running placement is unchanged",
        "ok  llm-serving still serves its last valid version",
        # a map naming a missing GPU syncs, and the health check reports it Degraded
        "health Degraded, last sync Succeeded",
        "ConfigMap inference/embeddings: Degraded",
        "ok  the Lua health check marks inference/embeddings Degraded, the other maps Healthy",
        "ok  the map's status names the missing GPU",
        # the maps become PlacementMap custom resources through ArgoCD: nothing moves
        "$ gpuplace migrate clusters/dev",
        "ok  no pod was rebound: same pods, nodes and GPUs",
        "ok  no pod drifted",
        "ok  the webhook refused the sync, naming the object and the field path",
        "ok  the apiserver refused the unknown field",
        "ok  the PlacementMap health check reads the conditions: embeddings Degraded, "
        "llm-serving Healthy",
        # a values commit: ArgoCD rolls gpuplace over to dra enforcement
        "sets global.enforcement.mode: dra",
        "ok  ArgoCD rolled the controller and the webhook over to --enforcement=dra",
        "ok  the claim holds exactly localhost gpu-2, reserved for dra-probe-0",
    ]
    position = 0
    for step in steps:
        found = out.find(step, position)
        assert found >= 0, f"missing, or out of order: {step!r}"
        position = found + len(step)
