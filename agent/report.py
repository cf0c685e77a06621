"""The inventory and check results as people read them (`gpuplace agent --once --print`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from placement.inventory import DeviceCheck, GpuDevice, NodeInventory
from placement.types import GpuUuid


def render_json(inventory: NodeInventory, checks: Sequence[DeviceCheck]) -> str:
    """The inventory exactly as the agent publishes it, and the check results."""
    data = {
        "inventory": json.loads(inventory.to_json()),
        "checks": [check.to_json() for check in checks],
    }
    return json.dumps(data, indent=2, sort_keys=True)


def render_text(
    inventory: NodeInventory, checks: Sequence[DeviceCheck], *, maps_checked: bool
) -> str:
    count = len(inventory.devices)
    lines = [
        f"node {inventory.node}: {count} GPU{'' if count == 1 else 's'}, "
        f"driver {inventory.driver_version or 'unknown'}, "
        f"CUDA {inventory.cuda_driver_version or 'unknown'}"
    ]
    devices = sorted(inventory.devices, key=lambda d: d.index)
    if devices:
        index_of = {d.uuid: d.index for d in devices}
        rows: list[tuple[str, ...]] = [
            (
                str(d.index),
                d.uuid or "(unknown)",
                d.name or "(unknown)",
                f"{d.memory_mib} MiB",
                d.pci_bus_id or "(unknown)",
                "-" if d.numa_node is None else str(d.numa_node),
                _mig(d),
                _peers(d.nvlink_peers, index_of),
                _peers(d.pcie_switch_peers, index_of),
                "healthy" if d.healthy else f"UNHEALTHY: {d.health_reason}",
            )
            for d in devices
        ]
        header = (
            "INDEX", "UUID", "NAME", "MEMORY", "PCI BUS ID", "NUMA", "MIG", "NVLINK",
            "PCIE SWITCH", "HEALTH",
        )  # fmt: skip
        lines += _table(header, rows)
    instances = [(d, m) for d in devices for m in d.mig_instances]
    if instances:
        lines.append("")
        rows = [
            (
                str(d.index),
                str(m.index),
                m.uuid,
                m.profile or "(unknown)",
                f"{m.start}+{m.size}" if m.size else "(unknown)",
                f"{m.memory_mib} MiB",
            )
            for d, m in instances
        ]
        lines += _table(("GPU", "MIG", "UUID", "PROFILE", "PLACEMENT", "MEMORY"), rows)
    lines.append("")
    if not maps_checked:
        lines.append("checks: none (pass --map FILE to check PlacementMaps against this node)")
    elif not checks:
        lines.append(f"checks: no entry of the given maps targets node {inventory.node}")
    else:
        failed = sum(1 for c in checks if not c.ok)
        lines.append(f"checks: {len(checks)} entries on this node, {failed} failing")
        rows = [
            (c.map, str(c.index), "ok" if c.ok else c.reason, c.message)
            for c in sorted(checks, key=lambda c: (c.map, c.index))
        ]
        lines += _table(("MAP", "INDEX", "RESULT", "MESSAGE"), rows)
    return "\n".join(lines)


def _mig(device: GpuDevice) -> str:
    if not device.mig_mode:
        return "disabled"
    count = len(device.mig_instances)
    return f"enabled, {count} device{'' if count == 1 else 's'}"


def _peers(peers: Sequence[GpuUuid], index_of: dict[GpuUuid, int]) -> str:
    """Peers by index ("1,3"), which is how people read a node's topology; "none" without."""
    if not peers:
        return "none"
    return ",".join(str(index_of[p]) if p in index_of else p for p in peers)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        # The last column is free text: no padding after it.
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        return "  ".join([*cells, row[-1]])

    return [line(header), *(line(row) for row in rows)]
