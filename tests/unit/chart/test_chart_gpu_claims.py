"""The chart's gpu-claims admission policy (dra enforcement): only gpuplace creates claims and
claim templates of the DeviceClasses it manages (docs/trust.md, one owner per GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chartkit import SCENARIOS, find, one, render

GPU_CLAIMS = "gpuplace-gpu-claims"
CONTROLLER = "system:serviceaccount:gpuplace-system:gpuplace-controller"


def dra() -> Any:
    return next(s for s in SCENARIOS if s.name == "dra")


def variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_dra_enforcement_ships_the_policy_on_by_default(tmp_path: Path) -> None:
    objects = render(dra(), tmp_path)
    policy = one(objects, "ValidatingAdmissionPolicy", GPU_CLAIMS)
    binding = one(objects, "ValidatingAdmissionPolicyBinding", GPU_CLAIMS)
    assert binding["spec"] == {"policyName": GPU_CLAIMS, "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"] and rule["operations"] == ["CREATE"]
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"
    cel = variables(policy)
    assert cel["classes"] == '["gpu.nvidia.com"]'
    # Templates: the controller alone; claims: also kube-controller-manager's generator.
    assert cel["allowed"] == (
        f'variables.template ? ["{CONTROLLER}"] : ["{CONTROLLER}", '
        '"system:serviceaccount:kube-system:resource-claim-controller", '
        '"system:kube-controller-manager"]'
    )
    assert "firstAvailable" in cel["managed"] and "exactly" in cel["managed"]
    for kept in (policy, binding):
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_policy_covers_every_managed_class_and_can_be_switched_off(tmp_path: Path) -> None:
    classes = ["gpu.nvidia.com", "mig.nvidia.com"]
    objects = render(
        dra(),
        tmp_path,
        "--set-json",
        f"global.enforcement.dra.claimPolicy.deviceClasses={classes}".replace("'", '"'),
    )
    cel = variables(one(objects, "ValidatingAdmissionPolicy", GPU_CLAIMS))
    assert cel["classes"] == '["gpu.nvidia.com","mig.nvidia.com"]'
    off = render(dra(), tmp_path, "--set", "global.enforcement.dra.claimPolicy.enabled=false")
    assert not find(off, "ValidatingAdmissionPolicy", GPU_CLAIMS)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.name == "default"], ids=str)
def test_env_enforcement_ships_no_claim_policy(scenario: Any, tmp_path: Path) -> None:
    objects = render(scenario, tmp_path)
    assert not find(objects, "ValidatingAdmissionPolicy", GPU_CLAIMS)
    assert not find(objects, "ValidatingAdmissionPolicyBinding", GPU_CLAIMS)
