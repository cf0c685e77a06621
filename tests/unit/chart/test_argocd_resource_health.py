"""argocd/health/placementmap.lua and placementpolicy.lua, run by Lua 5.1 (the language of ArgoCD's
gopher-lua) as ArgoCD runs a custom health check without useOpenLibs: base and table libraries
only, the object as the global `obj`. The statuses are the controller's own
(placement.resourcestatus.resource_status, controller.policystatus.PolicyVerdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest

from controller.policystatus import PolicyVerdict
from placement.errors import Diagnostic, Location
from placement.resourcestatus import resource_status
from placement.status import COMPILING, MapStatus, Phase, SlotCounts

HEALTH = Path(__file__).resolve().parents[3] / "argocd" / "health"
MAP_SCRIPT = (HEALTH / "placementmap.lua").read_text()
POLICY_SCRIPT = (HEALTH / "placementpolicy.lua").read_text()
NOW = "2026-12-01T10:00:00Z"

#: ArgoCD opens base, table, package and a safe os for scripts without useOpenLibs; string, math,
#: io and debug are absent, so a script that reaches for them fails here too.
_ABSENT = ("string", "math", "io", "os", "debug", "dofile", "loadfile", "require", "load")


def to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any], script: str = MAP_SCRIPT) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    g = runtime.globals()
    for name in _ABSENT:
        g[name] = None
    g.obj = to_lua(runtime, obj)
    result = runtime.execute(script)
    out = dict(result)
    assert set(out) == {"status", "message"}
    return out["status"], out["message"]


def placement_map(
    status: MapStatus | None, *, generation: int = 2, read: int = 2
) -> dict[str, Any]:
    """A PlacementMap at metadata.generation `generation` whose status the controller wrote after
    reading generation `read`."""
    obj: dict[str, Any] = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementMap",
        "metadata": {"name": "llm-serving", "namespace": "inference", "generation": generation},
        "spec": {"placements": []},
    }
    if status is not None:
        obj["status"] = resource_status(status, read, None, NOW, source_file="maps/llm.yaml")
    return obj


def test_a_valid_map_in_service_is_healthy() -> None:
    status = MapStatus(Phase.VALID, 7, message="4 slots", slots=SlotCounts(4, 4, 4))
    assert health(placement_map(status)) == ("Healthy", "4 of 4 slots served")


def test_an_invalid_map_is_degraded_with_its_located_error() -> None:
    error = Diagnostic(
        Location("placementmap inference/llm-serving", 0, 0, "spec.placements[1].devices[0]"),
        "device 9 is not on gpu-a-01",
    )
    message = f"1 error(s): {error.format()}; version 41 stays in service"
    status = MapStatus(Phase.INVALID, message=message, errors=(error,), serving_version="41")
    assert health(placement_map(status)) == ("Degraded", message)


@pytest.mark.parametrize("phase", [Phase.CONFLICT, Phase.DEGRADED])
def test_a_conflict_or_an_unservable_slot_is_degraded(phase: Phase) -> None:
    message = 'GPU-5c1d0c3e on gpu-a-01 is also claimed by "training/bert" (index 3)'
    assert health(placement_map(MapStatus(phase, message=message))) == ("Degraded", message)


def test_a_map_of_other_content_than_its_configmap_twin_is_degraded() -> None:
    message = "configmap inference/llm-serving declares this map with other content"
    error = Diagnostic(Location("placementmap inference/llm-serving", 0, 0, "spec"), message)
    status = MapStatus(Phase.CONFLICT, message=message, errors=(error,))
    assert health(placement_map(status)) == ("Degraded", message)


def test_drifted_pods_being_evicted_keep_the_map_progressing() -> None:
    status = MapStatus(
        Phase.VALID,
        message="4 slots; 1 pod(s) drifted",
        slots=SlotCounts(4, 4, 4, 0, 1),
        rollout="evict, maxUnavailable 1, 1 down",
    )
    assert health(placement_map(status)) == ("Progressing", "evict, maxUnavailable 1, 1 down")


def test_drifted_pods_under_a_manual_rollout_are_named_on_a_healthy_map() -> None:
    status = MapStatus(
        Phase.VALID,
        slots=SlotCounts(4, 4, 4, 0, 1),
        rollout="manual: delete the drifted pods to move them",
    )
    assert health(placement_map(status)) == (
        "Healthy",
        "4 of 4 slots served; 1 pod(s) drifted; manual: delete the drifted pods to move them",
    )


def test_a_map_being_compiled_is_progressing() -> None:
    status = MapStatus(Phase.VALID, message=COMPILING, slots=SlotCounts(2))
    assert health(placement_map(status)) == ("Progressing", "Compiling")


def test_a_status_of_an_earlier_generation_is_not_this_spec_s_verdict() -> None:
    degraded = MapStatus(Phase.DEGRADED, message="device 9 missing")
    assert health(placement_map(degraded, generation=5, read=4)) == (
        "Progressing",
        "waiting for the controller to read generation 5",
    )
    # Once read, the verdict shows, whatever it is.
    assert health(placement_map(degraded, generation=5, read=5))[0] == "Degraded"


def test_a_map_without_status_is_progressing() -> None:
    assert health(placement_map(None, generation=1)) == (
        "Progressing",
        "waiting for the controller to read generation 1",
    )
    bare = placement_map(None)
    bare["status"] = {}
    assert health(bare)[0] == "Progressing"
    del bare["metadata"]["generation"]
    assert health(bare) == ("Progressing", "waiting for the controller to read generation 0")


def test_a_status_without_conditions_is_progressing() -> None:
    obj = placement_map(None)
    obj["status"] = {"observedGeneration": 2, "phase": "Valid"}
    assert health(obj) == ("Progressing", "waiting for the controller's verdict")


# -- PlacementPolicy ------------------------------------------------------------------------------
def placement_policy(verdict: PolicyVerdict | None, *, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementPolicy",
        "metadata": {"name": "gpuplace-policy", "generation": generation},
        "spec": {},
    }
    if verdict is not None:
        obj["status"] = verdict.resource_status(None, NOW)
    return obj


def test_a_valid_policy_is_healthy() -> None:
    verdict = PolicyVerdict("Valid", "3 grant(s) in force", 3)
    assert health(placement_policy(verdict), POLICY_SCRIPT) == ("Healthy", "3 grant(s) in force")


def test_an_invalid_policy_is_degraded_with_its_message() -> None:
    error = Diagnostic(Location("placementpolicy gpuplace-policy", 0, 0, "spec.grants[0]"), "bad")
    verdict = PolicyVerdict("Invalid", "1 error(s): ...; the last valid policy stays", 3, (error,))
    assert health(placement_policy(verdict), POLICY_SCRIPT) == (
        "Degraded",
        "1 error(s): ...; the last valid policy stays",
    )


def test_a_policy_not_read_yet_is_progressing() -> None:
    stale = PolicyVerdict("Valid", "3 grant(s) in force", 2)
    assert health(placement_policy(stale), POLICY_SCRIPT) == (
        "Progressing",
        "waiting for the controller to read generation 3",
    )
    assert health(placement_policy(None, generation=1), POLICY_SCRIPT) == (
        "Progressing",
        "waiting for the controller to read generation 1",
    )
