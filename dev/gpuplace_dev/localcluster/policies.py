"""The chart's ValidatingAdmissionPolicies as `helm template` renders them for the default release
(`gpuplace` in gpuplace-system): the chart is their one source. LocalCluster installs them, so that
every integration test runs under what a release of the chart enforces:

- `gpuplace-agent`: an agent writes only its own node's inventory ConfigMap and heartbeat Lease
  (RBAC cannot narrow `create` by name; a pod-bound token names the pod's node).
- `gpuplace-controller`: outside its namespace the controller updates only ConfigMaps labelled as
  placement maps, and keeps the label (RBAC cannot narrow `update` by label).
- `gpuplace-pod-bindings`: gpuplace.io/* annotations come only through the Binding subresource and
  never change; a map's pods get CUDA_VISIBLE_DEVICES only as the webhook wires it and only the
  binder's schedulerName.
- `gpuplace-gpu-claims` (rendered for `dra` enforcement, `dra_policies`): only gpuplace creates
  claims and claim templates of the DeviceClasses it manages. Not installed by LocalCluster: the
  tests of dra enforcement install it (their controller runs as a cluster administrator, which
  the policy lets through).

The local copies are named with the prefix `localcluster-`, so that `helm install` into a local
cluster creates the chart's own (identical) objects instead of refusing to adopt these.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from typing import Any

import yaml

from gpuplace_dev.localcluster.tools import CHART, helm_binary, helm_env

RELEASE = "gpuplace"
NAMESPACE = "gpuplace-system"
LOCAL_PREFIX = "localcluster-"
AGENT = "gpuplace-agent"
CONTROLLER = "gpuplace-controller"
POD_BINDINGS = "gpuplace-pod-bindings"
GPU_CLAIMS = "gpuplace-gpu-claims"
_TEMPLATES = (
    "agent-validatingadmissionpolicy.yaml",
    "agent-validatingadmissionpolicybinding.yaml",
    "controller-validatingadmissionpolicy.yaml",
    "controller-validatingadmissionpolicybinding.yaml",
    "pod-bindings-validatingadmissionpolicy.yaml",
    "pod-bindings-validatingadmissionpolicybinding.yaml",
)


class PolicyError(RuntimeError):
    """helm could not render the chart's policies."""


_DRA_TEMPLATES = (
    "gpu-claims-validatingadmissionpolicy.yaml",
    "gpu-claims-validatingadmissionpolicybinding.yaml",
)
_DRA_VALUES = ("--set", "global.enforcement.mode=dra")


@functools.cache
def _rendered(
    templates: tuple[str, ...] = _TEMPLATES, values: tuple[str, ...] = ()
) -> tuple[dict[str, Any], ...]:
    argv = [str(helm_binary()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    argv += values
    for template in templates:
        argv += ["--show-only", f"templates/{template}"]
    result = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=120, env=helm_env()
    )
    if result.returncode != 0:
        raise PolicyError(f"helm template of the chart's policies: {result.stderr.strip()}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def chart_policies(*names: str) -> list[dict[str, Any]]:
    """The policies `names` and their bindings, exactly as the chart renders them."""
    return [copy.deepcopy(o) for o in _rendered() if o["metadata"]["name"] in names]


def dra_policies(*names: str) -> list[dict[str, Any]]:
    """The policies `names` and their bindings as the chart renders them in `dra` enforcement."""
    rendered = _rendered(_DRA_TEMPLATES, _DRA_VALUES)
    return [copy.deepcopy(o) for o in rendered if o["metadata"]["name"] in names]


def local_copies(
    *names: str, prefix: str = LOCAL_PREFIX, dra: bool = False
) -> list[dict[str, Any]]:
    """`chart_policies(*names)` (`dra_policies` with `dra`) renamed with `prefix`, without the
    release's labels and annotations (they belong to no release)."""
    out = []
    for obj in dra_policies(*names) if dra else chart_policies(*names):
        spec = obj["spec"]
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            spec["policyName"] = prefix + spec["policyName"]
        out.append(
            {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {"name": prefix + obj["metadata"]["name"]},
                "spec": spec,
            }
        )
    return out
