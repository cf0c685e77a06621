"""NvmlProbe reads MIG devices, NVLink peers and PCIe switch peers from the fake
libnvidia-ml.so.1 through pynvml's own ctypes calls, and a driver that supports none of them
reads as "no MIG, no peers" with every GPU healthy."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from placement.inventory import MigInstance, NodeInventory
from tests.integration.agentkit import build_fake_nvml
from tests.unit.agent.test_fakenvml_probe import (
    NODE,
    NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
    ProbeProcess,
    load_fake,
    run_agent,
    write_config,
)

__all__ = ["load_fake"]  # a fixture, used by name

FAKENVML = Path(__file__).resolve().parents[3] / "tests" / "fakenvml"
H100_MIG = FAKENVML / "h100-mig.json"
H200 = FAKENVML / "h200-no-mig.json"
NVLINK_PAIRS = FAKENVML / "nvlink-pairs.json"
EXAMPLE = FAKENVML / "example.json"

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


def fixture_config(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture(scope="module")
def fake_nvml_dir() -> Path:
    try:
        return build_fake_nvml()
    except RuntimeError as error:
        pytest.fail(str(error))


@pytest.fixture
def snapshot(fake_nvml_dir: Path, tmp_path: Path) -> Iterator[Callable[[Path], NodeInventory]]:
    started: list[ProbeProcess] = []

    def take(config: Path) -> NodeInventory:
        process = ProbeProcess(fake_nvml_dir, config, tmp_path)
        started.append(process)
        assert process.hello["ok"], process.hello
        return process.snapshot()

    yield take
    for process in started:
        process.stop()


# -- MIG ---------------------------------------------------------------------------------------
def test_h100_with_mig_lists_its_four_mig_devices(
    snapshot: Callable[[Path], NodeInventory],
) -> None:
    (gpu,) = snapshot(H100_MIG).devices
    assert (gpu.mig_mode, gpu.healthy) == (True, True)
    uuid = "MIG-4f1b6c2a-8d3e-5a7b-9c0d-1e2f3a4b5c6"
    assert gpu.mig_instances == (
        MigInstance(f"{uuid}0", "3g.40gb", 0, 0, 4, 40320),
        MigInstance(f"{uuid}1", "2g.20gb", 1, 4, 2, 20096),
        MigInstance(f"{uuid}2", "1g.10gb", 2, 6, 1, 9856),
        MigInstance(f"{uuid}3", "1g.10gb", 3, 7, 1, 9856),
    )
    assert gpu.memory_mib == 81559  # the GPU's, not an instance's


def test_profile_comes_from_the_profile_info_when_the_name_lacks_it(
    snapshot: Callable[[Path], NodeInventory], tmp_path: Path
) -> None:
    config = fixture_config(H100_MIG)
    for instance in config["devices"][0]["migInstances"]:
        instance["name"] = "NVIDIA H100 80GB HBM3"
    path = tmp_path / "unnamed.json"
    write_config(path, config)
    (gpu,) = snapshot(path).devices
    assert [m.profile for m in gpu.mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


def test_without_mig_monitoring_rights_mig_devices_are_listed_without_placement(
    snapshot: Callable[[Path], NodeInventory], tmp_path: Path
) -> None:
    config = fixture_config(H100_MIG)
    config["devices"][0].update(fail="NO_PERMISSION", failCalls=["nvmlDeviceGetGpuInstanceById"])
    path = tmp_path / "unprivileged.json"
    write_config(path, config)
    (gpu,) = snapshot(path).devices
    assert gpu.healthy
    assert [(m.profile, m.start, m.size) for m in gpu.mig_instances] == [
        ("3g.40gb", 0, 0),
        ("2g.20gb", 0, 0),
        ("1g.10gb", 0, 0),
        ("1g.10gb", 0, 0),
    ]


def test_mig_devices_follow_the_configuration_live(fake_nvml_dir: Path, tmp_path: Path) -> None:
    config = fixture_config(H100_MIG)
    path = tmp_path / "nvml.json"
    write_config(path, config)
    process = ProbeProcess(fake_nvml_dir, path, tmp_path)
    try:
        assert len(process.snapshot().devices[0].mig_instances) == 4
        del config["devices"][0]["migInstances"][1:]
        write_config(path, config)
        (gpu,) = process.snapshot().devices
        assert [m.profile for m in gpu.mig_instances] == ["3g.40gb"]
        config["devices"][0].update(migMode=False, migInstances=[])
        write_config(path, config)
        (gpu,) = process.snapshot().devices
        assert (gpu.mig_mode, gpu.mig_instances, gpu.healthy) == (False, (), True)
    finally:
        process.stop()


def test_a_gpu_that_stops_answering_keeps_its_mig_devices_and_peers(
    fake_nvml_dir: Path, tmp_path: Path
) -> None:
    # Its MIG slots then read as unhealthy, not as missing, while it cannot answer.
    config = fixture_config(NVLINK_PAIRS)
    config["devices"][0].update(
        migMode=True,
        migInstances=[{"uuid": "MIG-00000000-0000-0000-0000-000000000001", "profile": "7g.80gb"}],
    )
    path = tmp_path / "nvml.json"
    write_config(path, config)
    process = ProbeProcess(fake_nvml_dir, path, tmp_path)
    try:
        before = process.snapshot().by_index[0]
        config["devices"][0].update(fail="GPU_IS_LOST", failCalls=["nvmlDeviceGetMemoryInfo"])
        write_config(path, config)
        after = process.snapshot().by_index[0]
    finally:
        process.stop()
    assert not after.healthy and "GPU is lost" in after.health_reason, after
    assert (after.mig_mode, after.mig_instances) == (True, before.mig_instances)
    assert len(after.mig_instances) == 1
    assert (after.nvlink_peers, after.pcie_switch_peers) == (
        before.nvlink_peers,
        before.pcie_switch_peers,
    )
    assert len(after.nvlink_peers) == 1


def test_h200_without_mig_or_nvlink_is_a_plain_healthy_gpu(
    snapshot: Callable[[Path], NodeInventory],
) -> None:
    (gpu,) = snapshot(H200).devices
    assert (gpu.name, gpu.memory_mib, gpu.healthy) == ("NVIDIA H200", 143771, True)
    assert (gpu.mig_mode, gpu.mig_instances) == (False, ())
    assert (gpu.nvlink_peers, gpu.pcie_switch_peers) == ((), ())


def test_a_driver_without_mig_nvlink_or_topology_reads_as_none(
    snapshot: Callable[[Path], NodeInventory],
) -> None:
    # example.json names none of them: every such call answers NOT_SUPPORTED.
    inventory = snapshot(EXAMPLE)
    assert len(inventory.devices) == 4
    for gpu in inventory.devices:
        assert gpu.healthy, gpu
        assert (gpu.mig_mode, gpu.mig_instances, gpu.nvlink_peers, gpu.pcie_switch_peers) == (
            False,
            (),
            (),
            (),
        )


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetTopologyCommonAncestor",
    ],
)
def test_failing_topology_and_mig_queries_never_make_a_gpu_unhealthy(
    snapshot: Callable[[Path], NodeInventory], tmp_path: Path, call: str
) -> None:
    config = fixture_config(NVLINK_PAIRS)
    config["devices"][0].update(
        fail="UNKNOWN",
        failCalls=[call],
        migMode=True,
        migInstances=[{"uuid": "MIG-00000000-0000-0000-0000-000000000001", "profile": "7g.80gb"}],
    )
    path = tmp_path / "failing.json"
    write_config(path, config)
    gpu = snapshot(path).devices[0]
    assert gpu.healthy, gpu
    if call.startswith("nvmlDeviceGetMig"):
        assert gpu.mig_instances == ()
    elif call.startswith("nvmlDeviceGetNvLink"):
        assert gpu.nvlink_peers == ()
    else:
        assert gpu.pcie_switch_peers == ()


# -- NVLink and PCIe ---------------------------------------------------------------------------
def test_nvlink_pairs_and_pcie_switches_name_the_other_gpu_of_each_pair(
    snapshot: Callable[[Path], NodeInventory],
) -> None:
    inventory = snapshot(NVLINK_PAIRS)
    assert len(inventory.devices) == 8
    for gpu in inventory.devices:
        partner = inventory.by_index[gpu.index ^ 1].uuid
        # GPU 0's link to an NVSwitch leads to no GPU of the node and is left out.
        assert gpu.nvlink_peers == (partner,), gpu
        assert gpu.pcie_switch_peers == (partner,), gpu


def test_inactive_links_join_nothing(
    snapshot: Callable[[Path], NodeInventory], tmp_path: Path
) -> None:
    config = fixture_config(NVLINK_PAIRS)
    for link in config["devices"][2]["nvlinks"]:
        link["active"] = False
    path = tmp_path / "down.json"
    write_config(path, config)
    inventory = snapshot(path)
    assert inventory.by_index[2].nvlink_peers == ()
    assert inventory.by_index[3].nvlink_peers == (inventory.by_index[2].uuid,)  # one-sided


# -- what `gpuplace agent --once --print` shows ------------------------------------------------
def test_agent_prints_an_h200_without_mig_or_nvlink_cleanly(fake_nvml_dir: Path) -> None:
    result = run_agent(fake_nvml_dir, H200, "--once", "--print", "--node", NODE)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    header, row = result.stdout.splitlines()[1:3]
    assert header.split()[-5:] == ["MIG", "NVLINK", "PCIE", "SWITCH", "HEALTH"], header
    assert row.split()[-4:] == ["disabled", "none", "none", "healthy"], result.stdout


def test_agent_prints_mig_devices(fake_nvml_dir: Path) -> None:
    result = run_agent(fake_nvml_dir, H100_MIG, "--once", "--print", "--node", NODE)
    assert result.returncode == 0, result.stderr
    assert "enabled, 4 devices" in result.stdout
    assert (
        "0    0    MIG-4f1b6c2a-8d3e-5a7b-9c0d-1e2f3a4b5c60  3g.40gb  0+4        40320 MiB"
        in result.stdout.splitlines()
    ), result.stdout


# -- the C library: MIG and NVLink semantics, configuration errors -----------------------------
def test_mig_call_semantics(load_fake: Callable[[str], ctypes.CDLL]) -> None:
    lib = load_fake(H100_MIG.read_text())
    assert lib.nvmlInit_v2() == NVML_SUCCESS
    gpu, mig, back = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    value = ctypes.c_uint()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(gpu)) == NVML_SUCCESS
    assert lib.nvmlDeviceGetMaxMigDeviceCount(gpu, ctypes.byref(value)) == NVML_SUCCESS
    assert value.value == 7
    assert (
        lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 4, ctypes.byref(mig)) == NVML_ERROR_NOT_FOUND
    )
    assert lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7, ctypes.byref(mig)) == (
        NVML_ERROR_INVALID_ARGUMENT
    )
    assert lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1, ctypes.byref(mig)) == NVML_SUCCESS
    assert lib.nvmlDeviceIsMigDeviceHandle(mig, ctypes.byref(value)) == NVML_SUCCESS
    assert value.value == 1
    assert lib.nvmlDeviceIsMigDeviceHandle(gpu, ctypes.byref(value)) == NVML_SUCCESS
    assert value.value == 0
    assert lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, ctypes.byref(back)) == NVML_SUCCESS
    assert back.value == gpu.value
    name = ctypes.create_string_buffer(96)
    assert lib.nvmlDeviceGetName(mig, name, 96) == NVML_SUCCESS
    assert name.value == b"NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    assert lib.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(value)) == NVML_SUCCESS
    assert value.value == 3
    assert lib.nvmlDeviceGetGpuInstanceId(gpu, ctypes.byref(value)) == NVML_ERROR_INVALID_ARGUMENT
    # A MIG handle is no GPU: the queries that only GPUs answer refuse it.
    assert lib.nvmlDeviceGetIndex(mig, ctypes.byref(value)) == NVML_ERROR_INVALID_ARGUMENT


def test_gpus_without_mig_or_nvlink_answer_not_supported(
    load_fake: Callable[[str], ctypes.CDLL],
) -> None:
    lib = load_fake(
        json.dumps({"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "migMode": False}]})
    )
    assert lib.nvmlInit_v2() == NVML_SUCCESS
    plain, disabled = ctypes.c_void_p(), ctypes.c_void_p()
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(plain)) == NVML_SUCCESS
    assert lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(disabled)) == NVML_SUCCESS
    assert lib.nvmlDeviceGetMigMode(plain, ctypes.byref(current), ctypes.byref(pending)) == (
        NVML_ERROR_NOT_SUPPORTED
    )
    assert lib.nvmlDeviceGetMigMode(disabled, ctypes.byref(current), ctypes.byref(pending)) == (
        NVML_SUCCESS
    )
    assert (current.value, pending.value) == (0, 0)
    assert lib.nvmlDeviceGetMaxMigDeviceCount(disabled, ctypes.byref(current)) == NVML_SUCCESS
    assert current.value == 0
    mig = ctypes.c_void_p()
    assert lib.nvmlDeviceGetMigDeviceHandleByIndex(disabled, 0, ctypes.byref(mig)) == (
        NVML_ERROR_NOT_FOUND
    )
    assert lib.nvmlDeviceGetNvLinkState(plain, 0, ctypes.byref(current)) == NVML_ERROR_NOT_SUPPORTED
    assert lib.nvmlDeviceGetTopologyCommonAncestor(plain, disabled, ctypes.byref(current)) == (
        NVML_ERROR_NOT_SUPPORTED
    )


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            [{"uuid": "GPU-a", "migInstances": [{"uuid": "MIG-a", "profile": "1g.10gb"}]}],
            'devices[0] has migInstances but "migMode" is not true',
        ),
        (
            [{"uuid": "GPU-a", "migMode": True, "migInstances": [{"uuid": "MIG-a"}]}],
            'devices[0].migInstances[0] has no "profile"',
        ),
        (
            [{"uuid": "GPU-a", "migMode": True, "migInstances": [{"uuid": "a", "profile": "1g"}]}],
            'a MIG device\'s uuid starts with "MIG-"',
        ),
        (
            [
                {
                    "uuid": "GPU-a",
                    "migMode": True,
                    "migInstances": [{"uuid": "MIG-a", "profile": "big"}],
                }
            ],
            'profile "big" is not <slices>g.<memory>gb',
        ),
        (
            [
                {
                    "uuid": "GPU-a",
                    "migMode": True,
                    "migInstances": [{"uuid": "MIG-a", "profile": "5g.50gb"}],
                }
            ],
            'give "giProfileId" for profile 5g.50gb',
        ),
        (
            [{"uuid": "GPU-a", "nvlinks": [{"link": 0, "remotePciBusId": "nope"}]}],
            'remotePciBusId "nope" is not domain:bus:device.function',
        ),
        (
            [{"uuid": "GPU-a", "nvlinks": [{"remotePciBusId": "0:1:0.0", "remote": "cpu"}]}],
            'remote must be "gpu" or "switch"',
        ),
    ],
)
def test_invalid_mig_and_nvlink_configuration_is_named(
    load_fake: Callable[[str], ctypes.CDLL],
    capfd: pytest.CaptureFixture[str],
    devices: list[dict[str, Any]],
    message: str,
) -> None:
    lib = load_fake(json.dumps({"devices": devices}))
    assert lib.nvmlInit_v2() == NVML_ERROR_UNKNOWN
    err = capfd.readouterr().err
    assert "config.json:1:" in err and message in err, err


def test_topology_groups_must_name_listed_devices(
    load_fake: Callable[[str], ctypes.CDLL], capfd: pytest.CaptureFixture[str]
) -> None:
    config = {
        "devices": [{"uuid": "GPU-a"}],
        "topology": {"groups": [{"level": "SINGLE", "devices": [0, 1]}]},
    }
    lib = load_fake(json.dumps(config))
    assert lib.nvmlInit_v2() == NVML_ERROR_UNKNOWN
    assert "a device index must be between 0 and 0, got 1" in capfd.readouterr().err
