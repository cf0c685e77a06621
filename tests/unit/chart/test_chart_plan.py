"""charts/gpuplace: the ClusterRole gpuplace-plan that `gpuplace plan` reads a live cluster with:
get and list only, and off with its switch."""

from __future__ import annotations

from pathlib import Path

from tests.chartkit import Scenario, find, one, render

READ = {"get", "list"}


def test_the_plan_role_reads_what_the_plan_lists_and_writes_nothing(tmp_path: Path) -> None:
    role = one(render(Scenario("default"), tmp_path), "ClusterRole", "gpuplace-plan")
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    for needed in (
        ("", "pods"),
        ("", "nodes"),
        ("", "configmaps"),
        ("gpuplace.io", "placementmaps"),
    ):
        assert granted.get(needed) == READ, needed
    assert all(verbs == READ for verbs in granted.values()), granted
    assert ("", "secrets") not in granted
    assert not any("*" in (group, resource) for group, resource in granted)


def test_the_plan_role_is_left_out_when_switched_off(tmp_path: Path) -> None:
    off = Scenario("plan-role-off", {"plan": {"clusterRole": {"enabled": False}}})
    assert find(render(off, tmp_path), "ClusterRole", "gpuplace-plan") == []
