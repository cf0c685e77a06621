"""argocd/health/configmap.lua, run by Lua 5.1 (the language of ArgoCD's gopher-lua) the way ArgoCD
runs a health check: the object as the global `obj`, the script's return value a table with
`status` and `message`. Statuses are written by the controller's own codec (placement.status)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.errors import Diagnostic, Location
from placement.status import MapStatus, Phase, SlotCounts, data_hash

HEALTH = Path(__file__).resolve().parents[3] / "argocd" / "health"
SCRIPT = (HEALTH / "configmap.lua").read_text()
APPLICATION_SCRIPT = (HEALTH / "application.lua").read_text()

#: What ArgoCD's VM offers a script with useOpenLibs (base, table, string, math); we also remove
#: what a health check has no business using, so a script that reaches for it fails here.
_REMOVED_GLOBALS = (
    "io",
    "os",
    "debug",
    "dofile",
    "loadfile",
    "require",
    "package",
    "load",
    "loadstring",
)


def to_lua(runtime: Any, value: Any) -> Any:
    """Like ArgoCD's decodeValue: maps and lists become tables, scalars stay scalars."""
    if isinstance(value, dict):
        return runtime.table_from({k: to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any], script: str = SCRIPT) -> dict[str, Any]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    g = runtime.globals()
    for name in _REMOVED_GLOBALS:
        g[name] = None
    g.obj = to_lua(runtime, obj)
    result = runtime.execute(script)
    assert lua51.lua_type(result) == "table"
    out = dict(result)
    assert set(out) <= {"status", "message"}
    return out


def configmap(status: str | None = None, *, labelled: bool = True) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "llm-serving", "namespace": "inference"}
    if labelled:
        metadata["labels"] = {"gpuplace.io/placement-map": "true"}
    if status is not None:
        metadata["annotations"] = {"gpuplace.io/status": status}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {"placement.yaml": "..."},
    }


def test_valid_map_is_healthy() -> None:
    status = MapStatus(
        Phase.VALID, observed_generation=7, message="4 slots, 4 bound", slots=SlotCounts(4, 4, 4)
    )
    assert health(configmap(status.to_json())) == {
        "status": "Healthy",
        "message": "4 slots, 4 bound",
    }


def test_invalid_map_is_degraded_with_the_located_error() -> None:
    error = Diagnostic(
        Location("inference/llm-serving", 9, 17, "spec.placements[1].devices[0]"), "device 9 is …"
    )
    status = MapStatus(Phase.INVALID, errors=(error,), serving_version="41")
    assert health(configmap(status.to_json())) == {
        "status": "Degraded",
        "message": "Invalid: inference/llm-serving:9:17: device 9 is …",
    }


@pytest.mark.parametrize("phase", [Phase.CONFLICT, Phase.DEGRADED, Phase.INVALID])
def test_problem_phases_are_degraded_with_the_message(phase: Phase) -> None:
    message = 'GPU-5c1d0c3e on gpu-a-01 is also claimed by "training/bert" (index 3)'
    result = health(configmap(MapStatus(phase, message=message).to_json()))
    assert result == {"status": "Degraded", "message": f"{phase.value}: {message}"}


def test_placement_map_without_status_is_progressing() -> None:
    result = health(configmap())
    assert result["status"] == "Progressing"
    assert "gpuplace controller" in result["message"]
    assert health(configmap(""))["status"] == "Progressing"


def test_other_configmaps_are_healthy() -> None:
    assert health(configmap(labelled=False)) == {"status": "Healthy"}
    assert health({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}) == {
        "status": "Healthy"
    }
    # A stray status on a ConfigMap that is not a placement map changes nothing.
    invalid = MapStatus(Phase.INVALID, message="x").to_json()
    assert health(configmap(invalid, labelled=False)) == {"status": "Healthy"}
    other = configmap(invalid)
    other["metadata"]["labels"]["gpuplace.io/placement-map"] = "false"
    assert health(other) == {"status": "Healthy"}


@pytest.mark.parametrize(
    "text", ["{", "not json", '{"phase": "Valid"', '["Valid"]', '{"phase": "Valid"} x']
)
def test_unreadable_status_is_degraded_and_says_why(text: str) -> None:
    result = health(configmap(text))
    assert result["status"] == "Degraded"
    assert "gpuplace.io/status" in result["message"]


def test_unknown_phase_is_unknown() -> None:
    result = health(configmap(json.dumps({"phase": "Pending", "message": ""})))
    assert result == {"status": "Unknown", "message": "unknown gpuplace.io/status phase Pending"}


def test_status_written_by_any_json_encoder_is_read() -> None:
    status = {
        "message": "ok",
        "phase": "Valid",
        "errors": [],
        "slots": {"total": 2},
        "observedGeneration": 1.5e3,
    }
    pretty = json.dumps(status, indent=4, ensure_ascii=False)
    assert health(configmap(pretty)) == {"status": "Healthy", "message": "ok"}


@given(st.text(min_size=1, max_size=200))
def test_any_message_survives_the_json_round_trip(message: str) -> None:
    status = MapStatus(Phase.CONFLICT, message=message).to_json()  # ensure_ascii: \uXXXX escapes
    expected = "Conflict: " + message
    # What a JSON decoder makes of it: escaped surrogate pairs join, lone surrogates (no UTF-8
    # form) become U+FFFD.
    joined = json.loads(json.dumps(expected))
    expected = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in joined)
    assert health(configmap(status)) == {"status": "Degraded", "message": expected}


def _lua_data_hash(text: str) -> str:
    """The script's own data_hash, called from Lua on the same bytes."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False, encoding=None)
    source = SCRIPT.split("local function decode_json", 1)[0] + "\nreturn data_hash"
    function = runtime.execute(source.encode())
    result = function(text.encode())
    return bytes(result).decode()


@given(st.text(max_size=300))
def test_the_script_fingerprints_text_exactly_like_the_controller(text: str) -> None:
    assert _lua_data_hash(text) == data_hash(text)


@pytest.mark.parametrize("size", [4095, 4096, 4097, 8192, 12_289, 100_000])
def test_a_text_of_several_blocks_is_fingerprinted_like_the_script_does(size: int) -> None:
    """The controller sums its fingerprint a block of 4,096 bytes at a time: texts around and
    across that size (multi-byte characters, control bytes) give the script's digits."""
    rng = random.Random(size)
    text = "".join(rng.choice("ab\n é€\U0001f600\x00\x7f") for _ in range(size))
    assert _lua_data_hash(text) == data_hash(text)


def _observed(text: str, status: MapStatus) -> dict[str, Any]:
    obj = configmap(replace(status, observed_data_hash=data_hash(text)).to_json())
    obj["data"] = {"placement.yaml": text}
    return obj


def test_a_status_of_other_content_is_progressing_until_the_controller_saw_this_one() -> None:
    valid = MapStatus(Phase.VALID, message="2 slots")
    seen = _observed("version: 1\n", valid)
    assert health(seen) == {"status": "Healthy", "message": "2 slots"}
    synced = {**seen, "data": {"placement.yaml": "version: 2\n"}}  # a sync wrote new text
    result = health(synced)
    assert result["status"] == "Progressing"
    assert "validate this version" in result["message"]
    # The previous verdict was Degraded: still Progressing, not Degraded, for the new text.
    degraded = _observed("version: 1\n", MapStatus(Phase.DEGRADED, message="device 9 missing"))
    assert health({**degraded, "data": {"placement.yaml": "v2"}})["status"] == "Progressing"
    assert health({**degraded, "data": {}})["status"] == "Progressing"


def test_drifted_pods_keep_a_valid_map_progressing() -> None:
    drifted = MapStatus(
        Phase.VALID,
        message="4 slots; 1 pod(s) drifted",
        slots=SlotCounts(4, 4, 4, 0, 1),
        rollout="manual: delete the drifted pods to move them",
    )
    result = health(_observed("x", drifted))
    assert result["status"] == "Progressing"
    assert result["message"].startswith("1 pod(s) drifted")
    assert "rollout manual" in result["message"]
    done = replace(drifted, slots=SlotCounts(4, 4, 4, 0, 0), rollout="")
    assert health(_observed("x", done))["status"] == "Healthy"


def test_status_round_trips_with_drift_provenance_and_fingerprint() -> None:
    status = MapStatus(
        Phase.VALID,
        slots=SlotCounts(3, 3, 2, 0, 1),
        observed_data_hash=data_hash("a"),
        revision="abc",
        rollout="evict, maxUnavailable 1",
    )
    assert MapStatus.from_json(status.to_json()) == status


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, ("Progressing", "waiting for the Application's own health")),
        ({}, ("Progressing", "waiting for the Application's own health")),
        ({"health": {"status": "Healthy"}}, ("Healthy", "")),
        (
            {"health": {"status": "Progressing", "message": "1 of 2 pods"}},
            ("Progressing", "1 of 2 pods"),
        ),
        ({"health": {"status": "Degraded", "message": "crash loop"}}, ("Degraded", "crash loop")),
        ({"health": {"status": "Missing"}}, ("Missing", "")),
    ],
)
def test_an_application_is_as_healthy_as_what_it_deployed(
    status: dict[str, Any] | None, expected: tuple[str, str]
) -> None:
    app: dict[str, Any] = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application"}
    if status is not None:
        app["status"] = status
    out = health(app, APPLICATION_SCRIPT)
    assert (out["status"], out.get("message")) == expected
