"""A label added after creation never makes a pod placeable: the pod-bindings policy refuses
adding, changing or removing gpuplace.io/map on UPDATE (the integration tests apply it to the
real apiserver as a tenant; here: the render carries the rule)."""

from __future__ import annotations

from pathlib import Path

from placement.annotations import MAP_LABEL
from tests.chartkit import SCENARIOS, one, render

POD_BINDINGS = "gpuplace-pod-bindings"


def test_the_policy_refuses_the_map_label_changing_on_update(tmp_path: Path) -> None:
    policy = one(render(SCENARIOS[0], tmp_path), "ValidatingAdmissionPolicy", POD_BINDINGS)
    rules = [
        v
        for v in policy["spec"]["validations"]
        if "request.operation != 'UPDATE'" in v["expression"] and MAP_LABEL in v["expression"]
    ]
    assert len(rules) == 1
    rule = rules[0]
    assert "variables.mapped == variables.wasMapped" in rule["expression"]
    assert f'oldObject.metadata.labels["{MAP_LABEL}"]' in rule["expression"]
    assert rule["reason"] == "Forbidden"
    for word in ("added", "changed", "removed"):
        assert word in rule["messageExpression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "oldObject" in variables["wasMapped"] and MAP_LABEL in variables["wasMapped"]
