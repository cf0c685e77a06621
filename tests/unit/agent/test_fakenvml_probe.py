"""NvmlProbe against the fake libnvidia-ml.so.1, through pynvml's own loader and ctypes calls.

The loader reads LD_LIBRARY_PATH only at process start, so the probe runs in a child process
(tests/fakenvml/probe_driver.py) started with the variable set; this process never loads NVML.
Tests of the C library's configuration parsing load private copies of it with ctypes instead,
so each test gets fresh library state.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.nvml import sysfs_numa_node
from agent.probe import MemoryProbe
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, NodeName
from tests.integration.agentkit import build_fake_nvml

ROOT = Path(__file__).resolve().parents[3]
FAKENVML = ROOT / "tests" / "fakenvml"
DRIVER = FAKENVML / "probe_driver.py"
NODE = NodeName("gpu-a-01")

U0 = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00"
U1 = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e01"
U2 = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e02"
U3 = "GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e03"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999


def four_gpus() -> dict[str, Any]:
    return {
        "driverVersion": "535.161.08",
        "cudaDriverVersion": 12020,
        "devices": [
            {
                "index": 0,
                "uuid": U0,
                "name": "NVIDIA H100 80GB HBM3",
                "memoryTotalMiB": 81559,
                "memoryUsedMiB": 1024,
                "pciBusId": "00000000:18:00.0",
                "numaNode": 0,
            },
            {
                "index": 1,
                "uuid": U1,
                "name": "NVIDIA A100-SXM4-40GB",
                "memoryTotalMiB": 40960,
                "pciBusId": "0000:3b:00.0",  # short domain, lower case: NVML normalizes
                "numaNode": 1,
            },
            {
                "index": 2,
                "uuid": U2,
                "name": "NVIDIA L4",
                "memoryTotalMiB": 23034,
                "memoryReservedMiB": 512,
                "pciBusId": "00000000:AF:00.0",
                # no numaNode: NVML says NOT_SUPPORTED and the probe asks sysfs
            },
            {
                "index": 3,
                "uuid": U3,
                "name": "NVIDIA H100 80GB HBM3",
                "memoryTotalMiB": 81559,
                "pciBusId": "00000000:DB:00.0",
                "numaNode": 1,
            },
        ],
    }


def expected_devices() -> tuple[GpuDevice, ...]:
    return (
        GpuDevice(0, GpuUuid(U0), "NVIDIA H100 80GB HBM3", 81559, "00000000:18:00.0", numa_node=0),
        GpuDevice(1, GpuUuid(U1), "NVIDIA A100-SXM4-40GB", 40960, "00000000:3B:00.0", numa_node=1),
        GpuDevice(2, GpuUuid(U2), "NVIDIA L4", 23034, "00000000:AF:00.0", numa_node=None),
        GpuDevice(3, GpuUuid(U3), "NVIDIA H100 80GB HBM3", 81559, "00000000:DB:00.0", numa_node=1),
    )


def write_config(path: Path, config: dict[str, Any] | str) -> None:
    """Replaces the file atomically, as README.md asks of anything that rewrites it live."""
    text = config if isinstance(config, str) else json.dumps(config, indent=2)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="session")
def fake_nvml_dir() -> Path:
    try:
        return build_fake_nvml()
    except RuntimeError as error:
        pytest.fail(str(error))


class ProbeProcess:
    """An NvmlProbe in a child process whose loader finds the fake library by name."""

    def __init__(self, library_dir: Path, config: Path | None, workdir: Path, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "GPUPLACE_FAKE_NVML_CONFIG"}
        env["LD_LIBRARY_PATH"] = str(library_dir)
        if config is not None:
            env["GPUPLACE_FAKE_NVML_CONFIG"] = str(config)
        self.stderr_path = workdir / f"driver-{id(self)}.stderr"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), "--sysfs", str(workdir / "sys"), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=workdir,
        )
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            pytest.fail(f"probe driver exited {self.proc.returncode}: {self.stderr()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _send(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        assert reply["ok"], reply
        return reply

    def snapshot(self, node: str = NODE) -> NodeInventory:
        return NodeInventory.from_json(self._send(cmd="snapshot", node=node)["inventory"])

    def wait(self, seconds: float) -> bool:
        return bool(self._send(cmd="wait", seconds=seconds)["event"])

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def stop(self) -> None:
        running = self.proc.poll() is None
        if self.proc.stdin is not None:
            # Closed even when the driver has exited already: left to the garbage collector, the
            # pipe would warn (ResourceWarning) in whichever test runs then.
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        if running:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


StartProbe = Callable[..., ProbeProcess]


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    write_config(path, four_gpus())
    return path


@pytest.fixture
def start_probe(fake_nvml_dir: Path, config_path: Path, tmp_path: Path) -> Iterator[StartProbe]:
    started: list[ProbeProcess] = []

    def start(
        *extra: str, library_dir: Path | None = None, config: Path | None = config_path
    ) -> ProbeProcess:
        process = ProbeProcess(library_dir or fake_nvml_dir, config, tmp_path, *extra)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def started(process: ProbeProcess) -> ProbeProcess:
    assert process.hello["ok"], process.hello
    return process


# -- every field, through pynvml ---------------------------------------------------------------
def test_pynvml_finds_the_fake_library_through_the_search_path(
    start_probe: StartProbe, fake_nvml_dir: Path
) -> None:
    probe = started(start_probe())
    loaded = Path(probe.hello["library"])
    assert loaded.resolve() == (fake_nvml_dir / "libnvidia-ml.so.1").resolve()


def test_every_field_matches_the_json(start_probe: StartProbe) -> None:
    probe = started(start_probe())
    inventory = probe.snapshot()
    assert inventory == NodeInventory(NODE, expected_devices(), "535.161.08", "12.2")
    assert probe.hello["driverVersion"] == "535.161.08"
    assert probe.hello["cudaDriverVersion"] == "12.2"


def test_numa_node_falls_back_to_sysfs_when_nvml_cannot_tell(
    start_probe: StartProbe, tmp_path: Path
) -> None:
    device_dir = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:af:00.0"
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text("1\n")
    inventory = started(start_probe()).snapshot()
    assert inventory.by_index[2].numa_node == 1  # from sysfs
    assert inventory.by_index[1].numa_node == 1  # from NVML


@pytest.mark.parametrize(
    ("content", "expected"), [("0\n", 0), ("3", 3), ("-1\n", None), ("junk", None), (None, None)]
)
def test_sysfs_numa_node(tmp_path: Path, content: str | None, expected: int | None) -> None:
    device_dir = tmp_path / "bus" / "pci" / "devices" / "0000:17:00.0"
    device_dir.mkdir(parents=True)
    if content is not None:
        (device_dir / "numa_node").write_text(content)
    assert sysfs_numa_node(tmp_path, "00000000:17:00.0") == expected
    assert sysfs_numa_node(tmp_path, "not-a-bus-id") is None


def test_cuda_version_given_as_text(start_probe: StartProbe, config_path: Path) -> None:
    config = four_gpus()
    config["cudaDriverVersion"] = "12.4"
    write_config(config_path, config)
    assert started(start_probe()).snapshot().cuda_driver_version == "12.4"


def test_memory_probe_reports_like_the_nvml_probe(start_probe: StartProbe) -> None:
    from_nvml = started(start_probe()).snapshot()
    in_memory = MemoryProbe(
        expected_devices(), driver_version="535.161.08", cuda_driver_version="12.2"
    )
    assert in_memory.snapshot(NODE) == from_nvml
    assert in_memory.snapshot(NODE).to_json() == from_nvml.to_json()


def test_memory_probe_wakes_a_waiter_when_a_device_turns_unhealthy() -> None:
    probe = MemoryProbe(expected_devices())
    assert probe.wait(0) is False
    probe.mark_unhealthy(1, "XID 79 (GPU has fallen off the bus)")
    assert probe.wait(30) is True
    device = probe.snapshot(NODE).by_index[1]
    assert not device.healthy
    assert device.health_reason == "XID 79 (GPU has fallen off the bus)"
    with pytest.raises(KeyError, match="no device with index 9"):
        probe.mark_unhealthy(9, "gone")


# -- health --------------------------------------------------------------------------------------
def test_device_that_nvml_cannot_query_is_unhealthy(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["devices"][2]["fail"] = "GPU_IS_LOST"
    write_config(config_path, config)
    inventory = started(start_probe()).snapshot()
    lost = inventory.by_index[2]
    assert not lost.healthy
    assert lost.health_reason == (
        "NVML cannot query the device (nvmlDeviceGetHandleByIndex: GPU is lost)"
    )
    assert lost.uuid == ""  # never read: the GPU was lost before the agent started
    assert [d.healthy for d in inventory.devices] == [True, True, False, True]


def test_failing_call_is_named_and_what_was_read_before_it_is_kept(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["devices"][1]["fail"] = "NVML_ERROR_UNKNOWN"
    config["devices"][1]["failCalls"] = ["nvmlDeviceGetMemoryInfo"]
    write_config(config_path, config)
    device = started(start_probe()).snapshot().by_index[1]
    assert (device.uuid, device.name, device.healthy) == (U1, "NVIDIA A100-SXM4-40GB", False)
    assert device.health_reason == (
        "NVML cannot query the device (nvmlDeviceGetMemoryInfo: Unknown Error)"
    )


def test_gpu_lost_while_running_keeps_its_identity_and_recovers(
    start_probe: StartProbe, config_path: Path
) -> None:
    probe = started(start_probe())
    assert all(d.healthy for d in probe.snapshot().devices)

    config = four_gpus()
    config["devices"][3]["fail"] = "GPU_IS_LOST"
    write_config(config_path, config)
    lost = probe.snapshot().by_index[3]
    # Known from the reading before the failure, so maps naming it by UUID see it unhealthy.
    assert lost == GpuDevice(
        3,
        GpuUuid(U3),
        "NVIDIA H100 80GB HBM3",
        81559,
        "00000000:DB:00.0",
        healthy=False,
        health_reason="NVML cannot query the device (nvmlDeviceGetHandleByIndex: GPU is lost)",
        numa_node=1,
    )

    write_config(config_path, four_gpus())
    assert probe.snapshot().by_index[3].healthy  # failing queries are not sticky


def test_critical_xid_in_the_file_marks_the_device_unhealthy(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["devices"][0]["xid"] = 79
    write_config(config_path, config)
    inventory = started(start_probe()).snapshot()
    assert not inventory.by_index[0].healthy
    assert inventory.by_index[0].health_reason == "XID 79 (GPU has fallen off the bus)"
    assert all(d.healthy for d in inventory.devices[1:])


def test_critical_xid_while_running_wakes_the_waiter_and_sticks(
    start_probe: StartProbe, config_path: Path
) -> None:
    probe = started(start_probe())
    assert all(d.healthy for d in probe.snapshot().devices)

    config = four_gpus()
    config["devices"][1]["xid"] = 48
    write_config(config_path, config)
    assert probe.wait(120) is True
    inventory = probe.snapshot()
    assert not inventory.by_index[1].healthy
    assert inventory.by_index[1].health_reason == "XID 48 (double-bit ECC error)"
    assert [d.healthy for d in inventory.devices] == [True, False, True, True]

    # The driver does not repeat an XID; the device stays out of service until the agent restarts.
    write_config(config_path, four_gpus())
    assert not probe.snapshot().by_index[1].healthy


def test_a_device_clean_for_the_recovery_time_comes_back(
    start_probe: StartProbe, config_path: Path
) -> None:
    probe = started(start_probe("--xid-recovery-seconds", "1"))
    config = four_gpus()
    config["devices"][1]["xid"] = 48
    write_config(config_path, config)
    assert probe.wait(120) is True
    assert not probe.snapshot().by_index[1].healthy
    write_config(config_path, four_gpus())  # no further XID
    deadline = time.monotonic() + 30
    while not probe.snapshot().by_index[1].healthy:
        assert time.monotonic() < deadline, "the device never came back"
        time.sleep(0.2)


def test_application_xid_does_not_mark_the_device_unhealthy(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["devices"][2]["xid"] = 13  # graphics engine exception: the program's fault
    write_config(config_path, config)
    probe = started(start_probe())
    assert all(d.healthy for d in probe.snapshot().devices)
    assert probe.wait(0) is False


def test_without_event_sets_health_comes_from_queries_only(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["eventSets"] = False
    config["devices"][0]["xid"] = 79
    config["devices"][1]["fail"] = "GPU_IS_LOST"
    write_config(config_path, config)
    probe = started(start_probe())
    assert [d.healthy for d in probe.snapshot().devices] == [True, False, True, True]
    assert probe.wait(0) is False
    assert "event sets are not available" in probe.stderr()


def test_device_without_xid_events_is_still_probed(
    start_probe: StartProbe, config_path: Path
) -> None:
    config = four_gpus()
    config["devices"][0]["events"] = False
    config["devices"][0]["xid"] = 79
    write_config(config_path, config)
    probe = started(start_probe())
    assert [d.healthy for d in probe.snapshot().devices] == [True, True, True, True]
    assert "GPU 0 does not report XID events" in probe.stderr()


def test_devices_added_and_removed_while_running(
    start_probe: StartProbe, config_path: Path
) -> None:
    probe = started(start_probe())
    config = four_gpus()
    del config["devices"][2:]
    write_config(config_path, config)
    assert [d.uuid for d in probe.snapshot().devices] == [U0, U1]
    write_config(config_path, four_gpus())
    assert probe.snapshot().devices == expected_devices()


def test_broken_rewrite_keeps_the_previous_devices(
    start_probe: StartProbe, config_path: Path
) -> None:
    probe = started(start_probe())
    write_config(config_path, '{"devices": [\n  {"uuid": "GPU-x",}\n]}')
    assert probe.snapshot().devices == expected_devices()
    assert (
        f"fakenvml: {config_path}:2:20: unexpected '}}' in object, expected a quoted key "
        "(keeping the previous configuration)"
    ) in probe.stderr()


# -- no NVML -----------------------------------------------------------------------------------
def test_missing_library_raises_a_clear_error(start_probe: StartProbe, tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    hello = start_probe(library_dir=empty).hello
    assert hello == {
        "ok": False,
        "error": "NvmlUnavailableError",
        "message": "NVML is not available on this node: libnvidia-ml.so.1 cannot be loaded; "
        "install the NVIDIA driver on this node and give the agent the NVIDIA container runtime "
        "(or mount libnvidia-ml.so.1 into it), or pass --publish-empty to publish an empty "
        "inventory",
    }


@pytest.mark.parametrize("cause", ["initError", "no config"])
def test_driver_not_loaded_is_nvml_unavailable(
    start_probe: StartProbe, config_path: Path, cause: str
) -> None:
    if cause == "initError":
        write_config(config_path, {"initError": "DRIVER_NOT_LOADED"})
        hello = start_probe().hello
    else:
        hello = start_probe(config=None).hello
    assert hello["error"] == "NvmlUnavailableError"
    assert "libnvidia-ml.so.1 was loaded but the NVIDIA driver is not running" in hello["message"]


def test_other_init_failures_are_probe_errors(start_probe: StartProbe, config_path: Path) -> None:
    write_config(config_path, {"initError": "LIB_RM_VERSION_MISMATCH"})
    hello = start_probe().hello
    assert hello["error"] == "ProbeError"
    assert hello["message"].startswith("NVML initialization failed: RM has detected")


# -- the agent command ---------------------------------------------------------------------------
def run_agent(
    fake_nvml_dir: Path, config: Path | None, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("GPUPLACE_FAKE_NVML_CONFIG", "NODE_NAME")
    }
    env["LD_LIBRARY_PATH"] = str(fake_nvml_dir)
    if config is not None:
        env["GPUPLACE_FAKE_NVML_CONFIG"] = str(config)
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", "agent", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: llm, namespace: inference}
spec:
  placements:
    - {index: 0, node: gpu-a-01, devices: [0, 1]}
    - {index: 1, node: gpu-a-01, devices: [%s]}
    - {index: 2, node: gpu-b-01, devices: [0]}
"""


def test_agent_once_print_json(fake_nvml_dir: Path, config_path: Path) -> None:
    result = run_agent(
        fake_nvml_dir, config_path, "--once", "--print", "--node", NODE, "--output", "json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["checks"] == []
    inventory = NodeInventory.from_json(json.dumps(data["inventory"]))
    assert inventory.devices[:2] == expected_devices()[:2]
    assert inventory.driver_version == "535.161.08"


def test_agent_once_print_checks_map_files(
    fake_nvml_dir: Path, config_path: Path, tmp_path: Path
) -> None:
    map_file = tmp_path / "llm.yaml"
    map_file.write_text(MAP % "7")
    result = run_agent(
        fake_nvml_dir, config_path, "--once", "--print", "--node", NODE, "--map", str(map_file)
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"node {NODE}: 4 GPUs, driver 535.161.08, CUDA 12.2"
    assert "checks: 2 entries on this node, 1 failing" in lines
    assert any(
        line.startswith("inference/llm  1      DeviceMissing  device 7 not found on node gpu-a-01")
        for line in lines
    ), result.stdout

    map_file.write_text(MAP % "3")
    fixed = run_agent(
        fake_nvml_dir, config_path, "--once", "--print", "--node", NODE, "--map", str(map_file)
    )
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "checks: 2 entries on this node, 0 failing" in fixed.stdout


def test_agent_reports_an_invalid_map_file_like_a_compiler(
    fake_nvml_dir: Path, config_path: Path, tmp_path: Path
) -> None:
    map_file = tmp_path / "bad.yaml"
    map_file.write_text(MAP % "not-a-device")
    result = run_agent(fake_nvml_dir, config_path, "--once", "--print", "--map", str(map_file))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"{map_file}:7:")


def test_agent_without_nvml_exits_with_a_clear_message(
    fake_nvml_dir: Path, config_path: Path, tmp_path: Path
) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    result = run_agent(empty, config_path, "--once", "--print", "--node", NODE)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        "gpuplace agent: error: NVML is not available on this node: libnvidia-ml.so.1 cannot be "
        "loaded;"
    )

    empty_ok = run_agent(empty, config_path, "--once", "--print", "--node", NODE, "--publish-empty")
    assert empty_ok.returncode == 0, empty_ok.stderr
    assert empty_ok.stdout.startswith(f"node {NODE}: 0 GPUs, driver unknown, CUDA unknown")
    assert "the inventory is empty (--publish-empty)" in empty_ok.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--map", "maps.yaml"), "--map needs --print"),
        (("--model-namespace", "gpuplace-inventory"), "the model must live elsewhere"),
        (("--print",), "--print needs --once"),
        (("--once", "--print", "--interval", "0"), "--interval must be a positive number"),
        (("--once", "--print", "--metrics-address", "nope"), "--metrics-address must be HOST:PORT"),
    ],
)
def test_agent_rejects_unusable_flags(
    fake_nvml_dir: Path, config_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = run_agent(fake_nvml_dir, config_path, "--node", NODE, *args)
    assert result.returncode == 2
    assert message in result.stderr


# -- the C library itself: configuration parsing and NVML semantics -------------------------------
_copies = itertools.count()


@pytest.fixture
def load_fake(
    fake_nvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], ctypes.CDLL]:
    """A private copy of the library per call: dlopen shares one instance per file, and each
    test needs fresh state (nothing initialized, nothing loaded)."""

    def load(config_text: str) -> ctypes.CDLL:
        config = tmp_path / "config.json"
        config.write_text(config_text)
        monkeypatch.setenv("GPUPLACE_FAKE_NVML_CONFIG", str(config))
        copy = tmp_path / f"libfakenvml-{next(_copies)}.so"
        shutil.copy(fake_nvml_dir / "libnvidia-ml.so.1", copy)
        lib = ctypes.CDLL(str(copy))
        lib.nvmlErrorString.restype = ctypes.c_char_p
        return lib

    return load


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ('{"devices": [{"uuid": "a"},]}', "1:28", "unexpected ']', expected a value"),
        ('{"devices": [{"name": "x"}]}', "1:14", 'devices[0] has no "uuid"'),
        (
            '{"devices": [\n {"uuid": "a", "memoryTotalMib": 1}]}',
            "2:16",
            'unknown key "memoryTotalMib" in devices[0]',
        ),
        (
            '{"devices": [{"uuid": "a"}, {"uuid": "a"}]}',
            "1:29",
            "uuid a is also used by devices[0]",
        ),
        ('{"devices": [{"uuid": "a", "index": 1}]}', "1:37", "index 1 is at position 0"),
        ('{"devices": [{"uuid": "a", "pciBusId": "17:00"}]}', "1:40", "is not domain:bus"),
        ('{"devices": [{"uuid": "a", "fail": "LOST"}]}', "1:36", "must be an NVML error name"),
        (
            '{"devices": [{"uuid": "a", "memoryTotalMiB": 1.5}]}',
            "1:46",
            "memoryTotalMiB must be an integer, got a fraction",
        ),
        ('{"cudaDriverVersion": "twelve"}', "1:23", 'must look like "12.4"'),
        ('{"driverVersion": "1", "driverVersion": "2"}', "1:24", 'duplicate key "driverVersion"'),
        ('{"driverVersion": "\\x"}', "1:21", "invalid escape \\'x'"),
        ('{"driverVersion": "\\ud800"}', "1:26", "unpaired surrogate"),
        ('{"driverVersion": "a\tb"}', "1:21", "control character"),
        ("[" * 40, "1:34", "nested deeper than 32 levels"),
        ('{"devices": []} x', "1:17", "unexpected 'x' after the document"),
        ("[]", "1:1", "the configuration must be a JSON object"),
        ("", "1:1", "unexpected end of file, expected a value"),
        ('{"devices": [{"uuid": "a", "xid": tru}]}', "1:35", "unexpected 't', expected a value"),
        ('{"devices": [{"uuid": "a", "events": 1}]}', "1:38", "events must be true or false"),
    ],
)
def test_invalid_configuration_is_reported_with_its_location(
    load_fake: Callable[[str], ctypes.CDLL],
    capfd: pytest.CaptureFixture[str],
    text: str,
    where: str,
    message: str,
) -> None:
    lib = load_fake(text)
    assert lib.nvmlInit_v2() == NVML_ERROR_UNKNOWN
    err = capfd.readouterr().err
    assert err.startswith("fakenvml: "), err
    assert f"config.json:{where}: " in err, err
    assert message in err, err


def test_strings_decode_json_escapes(load_fake: Callable[[str], ctypes.CDLL]) -> None:
    name = 'NVIDIA \u00e9 \U0001f600 "quoted" \\ /'
    config = json.dumps({"devices": [{"uuid": "GPU-a", "name": name}]}, ensure_ascii=True)
    lib = load_fake("\ufeff" + config)  # a byte order mark is tolerated
    assert lib.nvmlInit_v2() == NVML_SUCCESS
    handle = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == NVML_SUCCESS
    buffer = ctypes.create_string_buffer(96)
    assert lib.nvmlDeviceGetName(handle, buffer, 96) == NVML_SUCCESS
    assert buffer.value.decode() == name


def test_nvml_call_semantics(load_fake: Callable[[str], ctypes.CDLL]) -> None:
    lib = load_fake(json.dumps(four_gpus()))
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == NVML_ERROR_UNINITIALIZED
    assert lib.nvmlShutdown() == NVML_ERROR_UNINITIALIZED
    assert lib.nvmlInit_v2() == NVML_SUCCESS
    assert lib.nvmlInitWithFlags(0) == NVML_SUCCESS  # reference-counted
    assert lib.nvmlShutdown() == NVML_SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == NVML_SUCCESS
    assert count.value == 4

    handle = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByUUID(U2.encode(), ctypes.byref(handle)) == NVML_SUCCESS
    index = ctypes.c_uint()
    assert lib.nvmlDeviceGetIndex(handle, ctypes.byref(index)) == NVML_SUCCESS
    assert index.value == 2
    by_pci = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByPciBusId_v2(b"0000:af:00.0", ctypes.byref(by_pci)) == 0
    assert by_pci.value == handle.value

    small = ctypes.create_string_buffer(8)
    assert lib.nvmlDeviceGetUUID(handle, small, 8) == NVML_ERROR_INSUFFICIENT_SIZE

    class MemoryV2(ctypes.Structure):
        _fields_ = [
            ("version", ctypes.c_uint),
            ("total", ctypes.c_ulonglong),
            ("reserved", ctypes.c_ulonglong),
            ("free", ctypes.c_ulonglong),
            ("used", ctypes.c_ulonglong),
        ]

    memory = MemoryV2(version=1)
    assert lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory)) == (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )
    memory.version = ctypes.sizeof(MemoryV2) | (2 << 24)
    assert lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory)) == NVML_SUCCESS
    mib = 1024 * 1024
    assert (memory.total, memory.reserved, memory.used) == (23034 * mib, 512 * mib, 0)
    assert memory.free == (23034 - 512) * mib

    assert lib.nvmlErrorString(NVML_ERROR_GPU_IS_LOST) == b"GPU is lost"
    assert lib.nvmlErrorString(NVML_ERROR_DRIVER_NOT_LOADED) == b"Driver Not Loaded"
    assert lib.nvmlShutdown() == NVML_SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == NVML_ERROR_UNINITIALIZED
