"""The plan of a pull request as people and tools read it: text (a terminal, a CI log), JSON,
Markdown (the one pull-request comment, found again by MARKER) and SARIF 2.1.0 (each error on its
file, line and column, for code scanning)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gpuplace.prcomment import MARKER
from placement.diff import DriftingPod, change_lines
from placement.errors import Diagnostic
from placement.review import ClusterPlan, RepoPlan

#: Lines of one cluster's section in the comment before the rest is cut.
SECTION_LINES = 150
#: A comment's size limit with room to spare (GitHub refuses bodies over 65,536 characters).
COMMENT_CHARS = 60_000
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/gpuplace/gpuplace/blob/main/docs/reviewing.md"


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


def moving(pods: Iterable[DriftingPod]) -> tuple[int, int]:
    """(pods whose slot moves elsewhere, pods whose slot or map goes away)."""
    pods = list(pods)
    moved = sum(p.reason == "SlotMoved" for p in pods)
    return moved, len(pods) - moved


def summary_line(result: RepoPlan) -> str:
    s = result.summary()
    moved, lost = moving(d for c in result.clusters for d in c.drifting)
    parts = [
        f"{_n(s['clusters'], 'cluster')} ({s['clustersChanged']} changed)",
        f"{_n(s['mapsChanged'], 'map')} changed",
        f"slots {s['slotsAdded']} added, {s['slotsRemoved']} removed, {s['slotsMoved']} moved",
    ]
    if any(c.live for c in result.clusters):
        pods = f"{_n(moved, 'pod')} would move"
        if lost:
            pods += f", {_n(lost, 'pod')} would lose their slot"
        parts.append(pods)
        parts.append(f"{_n(s['slotsWaiting'], 'slot')} would wait")
    parts.append(_n(s["errors"], "error"))
    return "; ".join(parts)


def headline(cluster: ClusterPlan) -> str:
    """A cluster's line in the summary: what changes, what moves, what fails."""
    parts = []
    if cluster.changed:
        parts.append(f"{_n(len(cluster.plan.changes), 'map')} changed")
    moved, lost = moving(cluster.drifting)
    if moved:
        parts.append(f"{_n(moved, 'pod')} would move")
    if lost:
        parts.append(f"{_n(lost, 'pod')} would lose their slot")
    if cluster.waiting:
        parts.append(f"{_n(len(cluster.waiting), 'slot')} would wait")
    errors = len(cluster.errors) + bool(cluster.live_error)
    if errors:
        parts.append(_n(errors, "error"))
    return ", ".join(parts) or "no changes"


def cluster_lines(cluster: ClusterPlan) -> list[str]:
    """A cluster's section: its maps, then its errors and warnings, then the live cluster."""
    lines: list[str] = []
    for change in cluster.plan.changes:
        lines.extend(change_lines(change))
    if cluster.gangs:
        lines.append("Gangs (every slot's pod bound at once, or none):")
        lines.extend(f"    {gang.describe()}" for gang in cluster.gangs)
    shown = {d for change in cluster.plan.changes for d in change.diagnostics}
    errors = [d for d in cluster.errors if d not in shown]
    for label, found in (("Errors", errors), ("Warnings", cluster.warnings)):
        if found:
            lines.append(f"{label}:")
            lines.extend(f"    {d.format()}" for d in found)
    if cluster.live_error:
        lines.append(f"! cluster not read: {cluster.live_error}")
    elif cluster.live:
        lines.append(f"Running pods that would move or drift: {len(cluster.drifting) or 'none'}")
        lines.extend(f"    {d.describe()}" for d in cluster.drifting)
        lines.append(f"Slots that would wait: {len(cluster.waiting) or 'none'}")
        lines.extend(f"    {w.describe()}" for w in cluster.waiting)
    checked = [f"grants of {cluster.policy}"] if cluster.policy else []
    if cluster.inventory:
        checked.append(f"devices against {cluster.inventory}")
    if checked:
        lines.append(f"Checked: {', '.join(checked)}.")
    return lines


def text(result: RepoPlan) -> str:
    out = [f"gpuplace plan: {result.base} -> {result.head}", ""]
    out.extend(f"error: {e}" for e in result.errors)
    for cluster in result.clusters:
        out.append(f"== {cluster.name} ({cluster.directory or '.'}): {headline(cluster)}")
        out.extend(f"  {line}" for line in cluster_lines(cluster))
    out.append("")
    out.append(f"Summary: {summary_line(result)}.")
    return "\n".join(out)


def to_json(result: RepoPlan) -> str:
    return json.dumps(result.to_json(), indent=2)


def _cut(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... {len(lines) - limit} more lines cut (run `gpuplace plan`)"]


def markdown(result: RepoPlan) -> str:
    """The pull request's comment: the counts first, then one collapsed section a cluster that
    changes or fails (unchanged clusters are only counted), cut to fit a comment."""
    status = "fails" if result.failed else ("changes" if result.changed else "no changes")
    icon = {"fails": ":x:", "changes": ":pencil2:", "no changes": ":white_check_mark:"}[status]
    head = [
        MARKER,
        f"### {icon} gpuplace plan: {status}",
        "",
        f"`{result.base}` → `{result.head}`",
        "",
        f"**{summary_line(result)}**",
        "",
    ]
    head.extend(f"- :x: {e}" for e in result.errors)
    shown = [c for c in result.clusters if c.changed or c.failed or c.drifting or c.waiting]
    if shown:
        head += ["| Cluster | Plan |", "|---|---|"]
        head += [f"| `{c.name}` | {headline(c)} |" for c in shown]
        head.append("")
    sections: list[str] = []
    for cluster in shown:
        body = _cut(cluster_lines(cluster), SECTION_LINES)
        sections += [
            "<details>",
            f"<summary><b>{cluster.name}</b> (<code>{cluster.directory or '.'}</code>): "
            f"{headline(cluster)}</summary>",
            "",
            "```diff",
            *(line.replace("```", "'''") for line in body),
            "```",
            "</details>",
            "",
        ]
    hidden = len(result.clusters) - len(shown)
    tail = [f"_{_n(hidden, 'unchanged cluster')} not shown._"] if hidden else []
    out = "\n".join([*head, *sections, *tail])
    if len(out) > COMMENT_CHARS:
        note = "\n\n_The plan is cut here to fit a comment; the job's log has all of it._"
        out = out[: COMMENT_CHARS - len(note)].rsplit("\n", 1)[0]
        if out.count("```") % 2:
            out += "\n```"
        if out.count("<details>") > out.count("</details>"):
            out += "\n</details>"
        out += note
    return out + "\n"


def _errors(result: RepoPlan) -> Iterable[tuple[Diagnostic, str]]:
    seen = set()
    for cluster in result.clusters:
        for level, found in (("error", cluster.errors), ("warning", cluster.warnings)):
            for d in found:
                key = (d.location, d.message)
                if key not in seen:
                    seen.add(key)
                    yield d, level


RULES = {
    "error": ("gpuplace/map-error", "A placement map that the cluster would refuse or not serve"),
    "warning": ("gpuplace/map-warning", "A placement map that works, but not as it may seem"),
}


def sarif(result: RepoPlan, version: str = "unknown") -> str:
    """SARIF 2.1.0: one result per error and warning, located at its file, line and column
    (repository-relative, against %SRCROOT%)."""
    results = []
    for d, level in _errors(result):
        message = d.message + (f" ({d.hint})" if d.hint else "")
        entry: dict[str, Any] = {
            "ruleId": RULES[level][0],
            "level": level,
            "message": {"text": message},
        }
        if d.location.source:
            physical: dict[str, Any] = {
                "artifactLocation": {"uri": d.location.source, "uriBaseId": "%SRCROOT%"}
            }
            if d.location.line > 0:
                physical["region"] = {
                    "startLine": d.location.line,
                    "startColumn": max(d.location.column, 1),
                }
            entry["locations"] = [{"physicalLocation": physical}]
        results.append(entry)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "gpuplace",
                        "version": version,
                        "informationUri": INFORMATION_URI,
                        "rules": [
                            {"id": rule, "shortDescription": {"text": what}}
                            for rule, what in RULES.values()
                        ],
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2)


def render(result: RepoPlan, form: str, version: str = "unknown") -> str:
    if form == "json":
        return to_json(result)
    if form == "markdown":
        return markdown(result)
    if form == "sarif":
        return sarif(result, version)
    return text(result)
