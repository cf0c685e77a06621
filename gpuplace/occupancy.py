"""`gpuplace gpus`: who holds which GPU, read from a cluster and drawn as a node x GPU grid."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import yaml

from controller.holders import holder_of
from gpuplace.fleet import Reading, unreachable_text
from kubeio.client import Kube
from kubeio.errors import APIForbiddenError, APINotFoundError
from kubeio.paths import CONFIGMAPS, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from kubeio.pod import Pod
from placement.dra import DraSettings, read_claim, slice_devices
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.occupancy import CellState, ClaimedGpu, GpuCell, Holder, occupancy, summary
from placement.types import NodeName

DEFAULT_SCHEDULERS = ("gpuplace", "gpu-scheduler")

_COLOURS = {
    CellState.HELD_TWICE: "31",  # red
    CellState.FREE: "32",  # green
    CellState.SHARED: "36",  # cyan
    CellState.DRIFTED: "33",  # yellow
    CellState.RENUMBERED: "33",
    CellState.UNVERIFIABLE: "33",
    CellState.DEGRADED: "31",  # red
    CellState.MISSING: "31",
}


@dataclass(frozen=True)
class Filters:
    nodes: frozenset[str] = frozenset()
    namespace: str | None = None  # None: every namespace
    map: str | None = None  # a map's name, or namespace/name

    def holder_matches(self, holder: Holder) -> bool:
        if self.namespace is not None and holder.namespace != self.namespace:
            return False
        if self.map is None:
            return True
        if "/" in self.map:
            return f"{holder.namespace}/{holder.map}" == self.map
        return holder.map == self.map

    @property
    def by_holder(self) -> bool:
        return self.namespace is not None or self.map is not None


def read_cells(
    kube: Kube,
    filters: Filters = Filters(),
    schedulers: Sequence[str] = DEFAULT_SCHEDULERS,
    inventory_namespace: str = INVENTORY_NAMESPACE,
) -> list[GpuCell]:
    """One LIST of the inventories and one of the pods per binder schedulerName."""
    inventories: dict[NodeName, NodeInventory] = {}
    for cm in kube.get(CONFIGMAPS.collection(inventory_namespace))["items"]:
        text = (cm.get("data") or {}).get(INVENTORY_KEY)
        if text is None:
            continue
        try:
            inventory = NodeInventory.from_json(text)
        except ValueError:
            continue
        inventories[inventory.node] = inventory
    holders: list[Holder] = []
    claims = read_claims(kube, filters.namespace)
    for name in schedulers:
        items = kube.get(
            PODS.collection(filters.namespace), fieldSelector=f"spec.schedulerName={name}"
        )["items"]
        for obj in items:
            pod = Pod.of(obj)
            holder = holder_of(pod) if not pod.finished else None
            if holder is not None:
                holders.append(holder)
    cells = occupancy(inventories, holders, claims=claims)
    return select(cells, filters)


def read_claims(kube: Kube, namespace: str | None) -> list[ClaimedGpu]:
    """The GPUs that ResourceClaims' allocations name, whoever allocated them, as the DRA
    driver's ResourceSlices name them (one LIST of each); none where the resource API is not
    served or readable (a cluster without DRA)."""
    settings = DraSettings()
    try:
        slices = kube.get(RESOURCE_SLICES.collection())["items"]
        items = kube.get(RESOURCE_CLAIMS.collection(namespace))["items"]
    except (APINotFoundError, APIForbiddenError):
        return []
    by_id = {(settings.driver, d.pool, d.name): d for d in slice_devices(slices, settings)}
    out: list[ClaimedGpu] = []
    for obj in items:
        claim = read_claim(obj)
        for device_id in claim.allocated:
            device = by_id.get(device_id)
            if device is not None:
                gpu = device.parent or device.uuid
                out.append((f"{claim.namespace}/{claim.name}", device.node, gpu))
    return out


def select(cells: Iterable[GpuCell], filters: Filters) -> list[GpuCell]:
    """The cells of the nodes asked for; with a namespace or map filter, only the nodes where a
    matching pod holds a GPU (their other GPUs stay in the picture: free, or held by others)."""
    cells = [c for c in cells if not filters.nodes or c.node in filters.nodes]
    if filters.by_holder:
        wanted = {c.node for c in cells if any(filters.holder_matches(h) for h in c.holders)}
        cells = [c for c in cells if c.node in wanted]
    return cells


def cell_text(cell: GpuCell, filters: Filters) -> str:
    if cell.state in (CellState.DEGRADED, CellState.MISSING) and not cell.holders:
        return cell.state.value.upper()
    if cell.state is CellState.HELD_TWICE:
        return f"{len(cell.claims)} claims !held-twice"
    if not cell.holders:
        return "claim" if cell.claims else "free"
    shown = [f"{h.map}#{h.index}" if filters.holder_matches(h) else "(other)" for h in cell.holders]
    text = "+".join(shown)
    if cell.state not in (CellState.HELD, CellState.SHARED):
        text += f" !{cell.state.value}"
    return text


def grid(cells: Sequence[GpuCell], filters: Filters = Filters(), colour: bool = False) -> str:
    """Nodes down, GPU indices across; a GPU held by a pod that no inventory lists gets a column
    `?` of its own. Then one line per GPU that is not free: its pods, and why when it is not
    simply held."""
    if not cells:
        return "no GPUs: no node inventory (is the agent running?) and no bound pod"
    return _draw([Reading("", list(cells))], filters, colour, fleet=False)


def fleet_grid(
    readings: Sequence[Reading[list[GpuCell]]], filters: Filters = Filters(), colour: bool = False
) -> str:
    """The grid of several clusters in one table, a CLUSTER column first: each cluster's nodes,
    or one row that says it is unreachable (with the reason below the table) or has no GPUs."""
    return _draw(readings, filters, colour, fleet=True)


_Row = list[tuple[str, CellState | None]]


def _draw(
    readings: Sequence[Reading[list[GpuCell]]], filters: Filters, colour: bool, fleet: bool
) -> str:
    every = [c for r in readings for c in r.value or ()]
    indices = sorted({c.index for c in every if c.index is not None})
    columns: list[int | None] = [*indices]
    if any(c.index is None for c in every):
        columns.append(None)
    headers = [*(("CLUSTER",) if fleet else ()), "NODE"]
    headers += [f"GPU{i}" if i is not None else "?" for i in columns]
    table: list[_Row] = []
    for reading in readings:
        lead: _Row = [(reading.cluster, None)] if fleet else []
        if not reading.reachable:
            table.append([*lead, ("UNREACHABLE", CellState.MISSING)] + [("", None)] * len(columns))
            continue
        if not reading.value:
            table.append([*lead, ("(no GPUs)", None)] + [("", None)] * len(columns))
            continue
        table.extend([*lead, *row] for row in _node_rows(reading.value, columns, filters))
    widths = [max(len(h), *(len(r[i][0]) for r in table)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for line in table:
        parts = []
        for (text, state), width in zip(line, widths, strict=True):
            padded = text.ljust(width)
            if colour and state in _COLOURS:
                padded = f"\x1b[{_COLOURS[state]}m{padded}\x1b[0m"
            parts.append(padded)
        out.append("  ".join(parts).rstrip())
    return "\n".join([*out, *_footer(readings, filters, fleet)])


def _footer(readings: Sequence[Reading[list[GpuCell]]], filters: Filters, fleet: bool) -> list[str]:
    """Below the grid: each cluster's counts (or why it was not read), then one line per GPU
    that is not free."""
    out = [""]
    for reading in readings:
        prefix = f"{reading.cluster}: " if fleet else ""
        if not reading.reachable:
            out.append(f"{prefix}{unreachable_text(reading)}")
        elif reading.value or not fleet:
            out.append(prefix + _counts(reading.value or []))
        else:
            out.append(f"{prefix}no GPUs: no node inventory and no bound pod")
    details = [
        (r.cluster, c) for r in readings for c in r.value or () if c.state is not CellState.FREE
    ]
    if details:
        out.append("")
        for cluster, cell in details:
            out.append((f"{cluster}: " if fleet else "") + _detail(cell, filters))
    return out


def _node_rows(
    cells: Sequence[GpuCell], columns: Sequence[int | None], filters: Filters
) -> list[_Row]:
    rows: dict[NodeName, dict[int | None, list[GpuCell]]] = {}
    for cell in cells:
        rows.setdefault(cell.node, {}).setdefault(cell.index, []).append(cell)
    table: list[_Row] = []
    for node in sorted(rows):
        line: _Row = [(node, None)]
        for column in columns:
            here = rows[node].get(column, [])
            if not here:
                line.append(("", None))
                continue
            worst = min((c.state for c in here), key=list(CellState).index)
            line.append((", ".join(cell_text(c, filters) for c in here), worst))
        table.append(line)
    return table


def _counts(cells: Sequence[GpuCell]) -> str:
    counts = summary(cells)
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) + " GPU(s)"


def _detail(cell: GpuCell, filters: Filters) -> str:
    where = f"{cell.node} GPU{cell.index if cell.index is not None else '?'} {cell.uuid}"
    pods = ", ".join(
        f"{h.namespace}/{h.pod} ({h.slot})" if filters.holder_matches(h) else "(other)"
        for h in cell.holders
    )
    why = f": {cell.reason}" if cell.reason else ""
    if not pods and cell.claims and cell.state is not CellState.HELD_TWICE:
        pods = "claim " + ", ".join(cell.claims)
    return f"{where}  {cell.state.value}{why}" + (f"  held by {pods}" if pods else "")


def render(cells: Sequence[GpuCell], output: str, filters: Filters, colour: bool) -> str:
    if output == "text":
        return grid(cells, filters, colour)
    data = {"gpus": [c.to_dict() for c in cells], "summary": summary(cells)}
    if output == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False).rstrip()


def render_fleet(
    readings: Sequence[Reading[list[GpuCell]]], output: str, filters: Filters, colour: bool
) -> str:
    """`render` of several clusters: one grid with a CLUSTER column, or (json, yaml) every GPU
    with its `cluster`, and per cluster whether it was read, why not, and its summary."""
    if output == "text":
        return fleet_grid(readings, filters, colour)
    data = {
        "clusters": [
            {
                "cluster": r.cluster,
                "reachable": r.reachable,
                "error": r.error,
                "summary": summary(r.value or []) if r.reachable else None,
            }
            for r in readings
        ],
        "gpus": [{"cluster": r.cluster, **c.to_dict()} for r in readings for c in r.value or ()],
    }
    if output == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False).rstrip()


def use_colour(stream_is_tty: bool) -> bool:
    """Colours on a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return stream_is_tty and not os.environ.get("NO_COLOR")
