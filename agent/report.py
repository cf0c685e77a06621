"""The inventory and check results as people read them (`gpuplace agent --once --print`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from placement.inventory import DeviceCheck, NodeInventory


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
    if inventory.devices:
        rows: list[tuple[str, ...]] = [
            (
                str(d.index),
                d.uuid or "(unknown)",
                d.name or "(unknown)",
                f"{d.memory_mib} MiB",
                d.pci_bus_id or "(unknown)",
                "-" if d.numa_node is None else str(d.numa_node),
                "healthy" if d.healthy else f"UNHEALTHY: {d.health_reason}",
            )
            for d in sorted(inventory.devices, key=lambda d: d.index)
        ]
        header = ("INDEX", "UUID", "NAME", "MEMORY", "PCI BUS ID", "NUMA", "HEALTH")
        lines += _table(header, rows)
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


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        # The last column is free text: no padding after it.
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        return "  ".join([*cells, row[-1]])

    return [line(header), *(line(row) for row in rows)]
