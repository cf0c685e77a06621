"""`gpuplace preflight`: the Argo Workflow built from a map (gpuplace/preflight.py) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplace.cli import build_parser, main
from gpuplace.preflight import (
    MAP_PATH,
    NVML_DIR,
    PreflightSettings,
    bounded_name,
    build_workflow,
    workflow_manifest,
)
from placement.maps import PlacementMap
from placement.validate import parse_map

MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm-serving
  namespace: inference
spec:
  sharing: exclusive
  placements:
    - index: 0
      node: gpu-a-01
      devices: [0, 1]
    - index: 1
      node: gpu-a-02
      devices: [GPU-5c1d0c3e-8c6a-4f4e-9a1b-2f6e7d8c9b0a]
    - index: 2
      node: gpu-b-01
      count: 2
      require: {product: "NVIDIA H100 80GB HBM3", minMemoryMiB: 80000}
"""

LEGACY = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: webhook-test, namespace: legacy}
spec:
  map: |
    0=node1:0,1
    1=node2:2
    2=node3:0,1,2
"""


def parsed(text: str = MAP) -> PlacementMap:
    return parse_map(text, "map.yaml")


def manifest(text: str = MAP, **settings: Any) -> dict[str, Any]:
    return workflow_manifest(parsed(text), PreflightSettings(**settings))


def steps(wf: dict[str, Any]) -> list[dict[str, Any]]:
    (entry,) = [t for t in wf["spec"]["templates"] if t["name"] == wf["spec"]["entrypoint"]]
    (group,) = entry["steps"]  # one parallel group: every entry is checked in one run
    return list(group)


def check_template(wf: dict[str, Any]) -> dict[str, Any]:
    (template,) = [t for t in wf["spec"]["templates"] if "container" in t]
    return template


def arguments(step: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in step["arguments"]["parameters"]}


def substitute(value: Any, params: dict[str, str]) -> Any:
    """What Argo does with {{inputs.parameters.x}} before it runs a step."""
    text = json.dumps(value)
    for name, param in params.items():
        placeholder = "{{inputs.parameters." + name + "}}"
        text = text.replace(placeholder, json.dumps(param)[1:-1])
    return json.loads(text)


def test_one_step_per_entry_on_its_node() -> None:
    wf = manifest()
    assert (wf["apiVersion"], wf["kind"]) == ("argoproj.io/v1alpha1", "Workflow")
    assert list(wf)[:2] == ["apiVersion", "kind"]
    assert wf["metadata"]["name"] == "gpuplace-preflight-llm-serving"
    assert wf["metadata"]["namespace"] == "inference"
    assert [s["name"] for s in steps(wf)] == ["index-0", "index-1", "index-2"]
    assert [arguments(s)["node"] for s in steps(wf)] == ["gpu-a-01", "gpu-a-02", "gpu-b-01"]
    assert [arguments(s)["cuda-visible-devices"] for s in steps(wf)] == [
        "0,1",
        "GPU-5c1d0c3e-8c6a-4f4e-9a1b-2f6e7d8c9b0a",
        "",  # `count` entries: the controller picks the devices
    ]
    declared = {p["name"] for p in check_template(wf)["inputs"]["parameters"]}
    assert all(set(arguments(s)) == declared for s in steps(wf))


def test_each_step_checks_exactly_its_own_entry() -> None:
    pmap = parsed()
    for step in steps(manifest()):
        entry = parse_map(arguments(step)["entry"], "entry.yaml")
        (slot,) = entry.slots
        assert entry.key == pmap.key and entry.sharing == pmap.sharing
        assert slot == pmap.by_index[int(step["name"].removeprefix("index-"))]


def test_legacy_maps_get_the_same_steps() -> None:
    wf = manifest(LEGACY)
    assert [arguments(s)["node"] for s in steps(wf)] == ["node1", "node2", "node3"]
    assert [arguments(s)["cuda-visible-devices"] for s in steps(wf)] == ["0,1", "2", "0,1,2"]
    entry = parse_map(arguments(steps(wf)[2])["entry"], "entry.yaml")
    assert entry.slots[0].devices == (0, 1, 2)


def test_steps_land_on_the_node_by_name_or_by_alias_label() -> None:
    template = substitute(check_template(manifest()), {"node": "node1"})
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]},
        {"matchExpressions": [{"key": "gpu-node-name", "operator": "In", "values": ["node1"]}]},
    ]
    custom = check_template(manifest(alias_label="example.com/gpu-host"))
    custom_terms = custom["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert (
        custom_terms["nodeSelectorTerms"][1]["matchExpressions"][0]["key"] == "example.com/gpu-host"
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in template[
        "tolerations"
    ]


def test_steps_see_the_gpus_without_requesting_them() -> None:
    template = check_template(manifest())
    container = template["container"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # NVML numbers devices as the host does
    assert env["CUDA_VISIBLE_DEVICES"] == "{{inputs.parameters.cuda-visible-devices}}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (artifact,) = template["inputs"]["artifacts"]
    assert artifact["path"] == MAP_PATH
    assert artifact["raw"]["data"] == "{{inputs.parameters.entry}}"


def test_steps_run_the_agent_check_with_flags_the_agent_accepts() -> None:
    wf = manifest()
    container = check_template(wf)["container"]
    assert container["command"] == ["gpuplace"]
    for step in steps(wf):
        args = substitute(container["args"], arguments(step))
        parsed_args = build_parser().parse_args(args)
        assert parsed_args.command == "agent"
        assert parsed_args.once and parsed_args.print_only
        assert parsed_args.maps == [MAP_PATH]
        assert parsed_args.node == arguments(step)["node"]


def test_argocd_presync_hook_annotations() -> None:
    annotations = manifest()["metadata"]["annotations"]
    assert annotations["argocd.argoproj.io/hook"] == "PreSync"
    assert annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"
    plain = manifest(argocd_hook=False)["metadata"]["annotations"]
    assert not any(k.startswith("argocd.argoproj.io/") for k in plain)


def test_settings_reach_the_workflow() -> None:
    wf = manifest(
        image="registry.example/gpuplace:1.2.3",
        namespace="ci",
        name="check-llm",
        service_account="preflight",
        runtime_class="nvidia",
        tolerations=("dedicated", "nvidia.com/gpu"),
        timeout_seconds=120,
        parallelism=4,
    )
    assert (wf["metadata"]["name"], wf["metadata"]["namespace"]) == ("check-llm", "ci")
    spec = wf["spec"]
    assert spec["serviceAccountName"] == "preflight"
    assert json.loads(spec["podSpecPatch"]) == {"runtimeClassName": "nvidia"}
    assert (spec["activeDeadlineSeconds"], spec["parallelism"]) == (120, 4)
    assert check_template(wf)["container"]["image"] == "registry.example/gpuplace:1.2.3"
    assert [t["key"] for t in check_template(wf)["tolerations"]] == ["dedicated", "nvidia.com/gpu"]
    assert "podSpecPatch" not in manifest()["spec"]


def test_a_failed_step_keeps_the_end_of_its_output_as_its_message() -> None:
    # The kubelet's fallback puts the failed checks (the last lines of --print) in the container's
    # termination message, which Argo shows as the step's message.
    container = check_template(manifest())["container"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_nvml_from_the_host_is_mounted_read_only_and_on_the_library_path() -> None:
    wf = manifest(nvml_host_path="/usr/lib/nvidia", env=(("GPUPLACE_X", "1"),))
    template = check_template(wf)
    assert template["volumes"] == [
        {"name": "nvml", "hostPath": {"path": "/usr/lib/nvidia", "type": "Directory"}}
    ]
    container = template["container"]
    assert container["volumeMounts"] == [{"name": "nvml", "mountPath": NVML_DIR, "readOnly": True}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LD_LIBRARY_PATH"] == NVML_DIR
    assert env["GPUPLACE_X"] == "1"
    single = check_template(
        manifest(nvml_host_path="/usr/lib/libnvidia-ml.so.1", nvml_host_path_type="File")
    )
    assert single["container"]["volumeMounts"][0]["mountPath"] == f"{NVML_DIR}/libnvidia-ml.so.1"
    # Without a host path the NVIDIA runtime provides the library: no volume, no library path.
    plain = check_template(manifest())
    assert "volumes" not in plain and "volumeMounts" not in plain["container"]
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in plain["container"]["env"]}


def test_long_map_names_keep_names_valid_and_distinct() -> None:
    a, b = "gpuplace-preflight-" + "a" * 60, "gpuplace-preflight-" + "a" * 59 + "b"
    assert len(bounded_name(a)) <= 63 and len(bounded_name(b)) <= 63
    assert bounded_name(a) != bounded_name(b)
    assert bounded_name("short") == "short"
    wf = build_workflow(parse_map(MAP.replace("llm-serving", "x" * 63), "m.yaml"))
    assert len(wf.metadata.name) <= 63


# ------------------------------------------------------------------------------- the command


def write(tmp_path: Path, text: str, name: str = "map.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_command_prints_the_workflow_as_yaml_or_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MAP)
    assert main(["preflight", path, "--image", "img:1"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == manifest(image="img:1")
    assert main(["preflight", path, "-o", "json", "--image", "img:1", "--no-argocd-hook"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == manifest(image="img:1", argocd_hook=False)


def test_command_reports_invalid_maps_like_a_compiler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MAP.replace("devices: [0, 1]", "devices: [0, 0]"))
    assert main(["preflight", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:11:" in captured.err and "listed twice" in captured.err


def test_command_needs_exactly_one_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two = write(tmp_path, MAP + "---\n" + LEGACY)
    assert main(["preflight", two]) == 1
    assert "2 PlacementMaps in this file (llm-serving, webhook-test)" in capsys.readouterr().err
    assert main(["preflight", two, "--select", "webhook-test"]) == 0
    assert (
        yaml.safe_load(capsys.readouterr().out)["metadata"]["name"]
        == "gpuplace-preflight-webhook-test"
    )
    assert main(["preflight", two, "--select", "nope"]) == 1
    assert (
        "no PlacementMap named 'nope' (found: llm-serving, webhook-test)" in capsys.readouterr().err
    )
    none = write(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "none.yaml")
    assert main(["preflight", none]) == 1
    assert "no PlacementMap in this file" in capsys.readouterr().err
    assert main(["preflight", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read the file" in capsys.readouterr().err


def test_command_passes_the_nvml_mount_and_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MAP)
    argv = ["preflight", path, "--image", "img:1", "--nvml-host-path", "/opt/nv", "--env", "A=b=c"]
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == manifest(image="img:1", nvml_host_path="/opt/nv", env=(("A", "b=c"),))
    assert main(["preflight", path, "--env", "NOVALUE"]) == 2
    assert "--env takes NAME=VALUE, got 'NOVALUE'" in capsys.readouterr().err


def test_command_rejects_unusable_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MAP)
    assert main(["preflight", path, "--timeout", "0"]) == 2
    assert "--timeout must be a positive" in capsys.readouterr().err
    assert main(["preflight", path, "--parallelism", "-1"]) == 2


def test_command_without_the_workflows_sdk_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MAP)
    # None in sys.modules makes `import argo_workflows...` fail as if it were not installed.
    for name in [m for m in sys.modules if m.partition(".")[0] == "argo_workflows"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "argo_workflows", None)
    monkeypatch.delitem(sys.modules, "gpuplace.preflight")
    assert main(["preflight", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "gpuplace preflight: error: the argo-workflows Python SDK is not installed" in (
        captured.err
    )
    assert "pip install 'gpuplace[workflows]'" in captured.err


@pytest.mark.slow
def test_components_and_the_cli_import_without_the_workflows_sdk() -> None:
    script = """
import importlib, pkgutil, sys
sys.modules["argo_workflows"] = None
for package in ("placement", "kubeio", "controller", "webhook", "agent"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
from gpuplace.cli import build_parser
build_parser()
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
