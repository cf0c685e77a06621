"""Runs `agent.nvml.NvmlProbe` in a process of its own, one JSON command a line on stdin.

The dynamic loader reads LD_LIBRARY_PATH only when a process starts, so a test that wants pynvml to
find the fake library by its name starts this script with the variable set. Every reply is one
JSON object a line on stdout:

    (at start)                            {"ok": true, "driverVersion", "cudaDriverVersion", "library"}
                                          or {"ok": false, "error": <class>, "message"}, then exit 3
    {"cmd": "snapshot", "node": "n1"}     {"ok": true, "inventory": "<inventory.json text>"}
    {"cmd": "wait", "seconds": 5}         {"ok": true, "event": <bool>}
    {"cmd": "close"}                      {"ok": true}, then exit 0

Usage: python probe_driver.py [--sysfs DIR]   (DIR replaces /sys for the NUMA fallback)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agent.nvml import NvmlProbe
from agent.probe import ProbeError
from placement.types import NodeName


def reply(**data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def loaded_library() -> str:
    """The file the loader mapped for libnvidia-ml.so.1: proves which library pynvml found."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libnvidia-ml.so" in line:
            return line.split(maxsplit=5)[-1]
    return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sysfs", default="/sys")
    parser.add_argument("--xid-recovery-seconds", type=float, default=0.0)
    args = parser.parse_args()
    try:
        probe = NvmlProbe(sysfs=Path(args.sysfs), xid_recovery_seconds=args.xid_recovery_seconds)
    except ProbeError as exc:
        reply(ok=False, error=type(exc).__name__, message=str(exc))
        return 3
    reply(
        ok=True,
        driverVersion=probe.driver_version,
        cudaDriverVersion=probe.cuda_driver_version,
        library=loaded_library(),
    )
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["cmd"] == "snapshot":
                reply(ok=True, inventory=probe.snapshot(NodeName(command["node"])).to_json())
            elif command["cmd"] == "wait":
                reply(ok=True, event=probe.wait(float(command["seconds"])))
            elif command["cmd"] == "close":
                probe.close()
                reply(ok=True)
                return 0
            else:
                reply(ok=False, error="UnknownCommand", message=command["cmd"])
        except ProbeError as exc:
            reply(ok=False, error=type(exc).__name__, message=str(exc))
    probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
