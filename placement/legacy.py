"""The `gpu-scheduling-map` text of earlier tools: `<index>=<node>:<device>,<device>` one per line.

Blank lines and `#` comments are allowed. Devices are NVML indices or GPU UUIDs. Every error names
its line and column within the text; callers add the offset of the text inside its file.

One rule wherever the text appears (pod annotation or a PlacementMap's `spec.map`): a GPU that
several lines name is shared by exactly those lines' pods, as the earlier tools did (their own
example gives GPU 3 of one node to lines 3 and 4); against every other map and pod it stays
exclusive. Only a PlacementMap that says `sharing: exclusive` explicitly refuses such text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from placement.annotations import name_ordinal
from placement.errors import Diagnostic, Location, PlacementError, oversized
from placement.types import (
    GPU_UUID_RE,
    MAX_DEVICE_INDEX,
    MAX_INDEX,
    DeviceRef,
    GpuUuid,
    is_node_ref,
)

FORMAT_HINT = "expected '<index>=<node>:<device>[,<device>...]', e.g. '0=node1:0,1'"


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    index: int
    node: str
    devices: tuple[DeviceRef, ...]
    line: int  # 1-based, inside the text
    column: int
    device_columns: tuple[int, ...]
    node_column: int


def _is_number(token: str) -> bool:
    return token.isdecimal() and token.isascii()


def parse_device(token: str) -> DeviceRef | None:
    if _is_number(token):
        # Long digit strings are out of range anyway; int() refuses over 4300 digits.
        return int(token) if len(token) <= 9 else MAX_DEVICE_INDEX + 1
    if GPU_UUID_RE.match(token):
        return GpuUuid(token)
    return None


class _LineError(Exception):
    """The first problem of one line: its 1-based column within the line, what, what to do."""

    def __init__(self, column: int, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.column = column
        self.message = message
        self.hint = hint


#: Kubernetes caps all annotations of one object together at 256 KiB.
MAX_LEGACY_BYTES = 256 * 1024


def parse_legacy(
    text: str,
    source: str,
    *,
    line_offset: int = 0,
    column_offset: int = 0,
    path: str = "",
    max_bytes: int | None = MAX_LEGACY_BYTES,
) -> tuple[LegacyEntry, ...]:
    """Parses the whole text; raises PlacementError listing every malformed line. A pod's
    annotation longer than all of its annotations may be together (`max_bytes`; None for the
    `spec.map` of a PlacementMap, bounded by its file) is refused before it is read."""
    size = None if max_bytes is None else oversized(text, max_bytes)
    if size is not None:
        raise PlacementError.single(
            Location(source, 1 + line_offset, 1 + column_offset, path),
            f"the annotation is {size} bytes, more than a pod's annotations may hold together "
            f"({max_bytes} bytes)",
            hint="declare large layouts in a PlacementMap",
        )
    entries: list[LegacyEntry] = []
    errors: list[Diagnostic] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0]
        if not content.strip():
            continue
        try:
            entries.append(_parse_line(content, lineno, line_offset, column_offset))
        except _LineError as exc:
            loc = Location(source, lineno + line_offset, exc.column + column_offset, path)
            errors.append(Diagnostic(loc, exc.message, hint=exc.hint))
    if errors:
        raise PlacementError(tuple(errors))
    return tuple(entries)


@dataclass(frozen=True, slots=True)
class PodLine:
    """A pod's own gpu-scheduling-map text, read for that pod: every line, the pod's index (its
    name's `-<n>` suffix; None without one) and the line for that index (None without one)."""

    entries: tuple[LegacyEntry, ...]
    index: int | None
    entry: LegacyEntry | None


def pod_line(text: str, pod_name: str, source: str) -> PodLine:
    """Parses a pod's annotation once for everything that reads it (binder, webhook, CLI)."""
    entries = parse_legacy(text, source)
    index = name_ordinal(pod_name)
    entry = None if index is None else next((e for e in entries if e.index == index), None)
    return PodLine(entries, index, entry)


#: At most this many other lines naming the pod's node are read for sharing (`own_line`).
MAX_PARTNER_LINES = 64
_INDEX_RE = re.compile(r"^[ \t]*(\d+)[ \t]*=", re.MULTILINE)


def own_line(
    text: str, pod_name: str, source: str, *, max_partners: int = MAX_PARTNER_LINES
) -> PodLine:
    """A pod's annotation read for admission at a cost that does not grow with the text: nothing
    is parsed for a name without a `-<n>` suffix; otherwise only the pod's own line (its errors
    located as `pod_line` locates them) and at most `max_partners` other lines naming the same
    node (for the GPUs they share) are parsed, found by a scan in C. The other lines are read
    in full, with every error, by the binder (`pod_line`) before the pod is bound."""
    index = name_ordinal(pod_name)
    if index is None:
        return PodLine((), None, None)
    size = oversized(text, MAX_LEGACY_BYTES)
    if size is not None:
        parse_legacy(text, source)  # raises the located error for the size
    # splitlines' line breaks, as parse_legacy counts lines, each made one "\n".
    flat = "\n".join(text.splitlines())

    def read(match: re.Match[str]) -> LegacyEntry:
        lineno = flat.count("\n", 0, match.start()) + 1
        end = flat.find("\n", match.start())
        raw = flat[match.start() : end if end >= 0 else len(flat)]
        try:
            return _parse_line(raw.split("#", 1)[0], lineno, 0, 0)
        except _LineError as exc:
            loc = Location(source, lineno, exc.column)
            raise PlacementError((Diagnostic(loc, exc.message, hint=exc.hint),)) from None

    mine = re.compile(rf"^[ \t]*0*{index}[ \t]*=", re.MULTILINE).search(flat)
    if mine is None:
        return PodLine((), index, None)
    entry = read(mine)
    partners = re.compile(rf"^[ \t]*\d+[ \t]*=[ \t]*{re.escape(entry.node)}[ \t]*:", re.MULTILINE)
    entries = {entry.line: entry}
    for found in partners.finditer(flat):
        if len(entries) > max_partners:
            break
        try:
            other = read(found)
        except PlacementError:
            continue  # the binder reports it, located, before the pod is bound
        entries.setdefault(other.line, other)
    return PodLine(tuple(entries[k] for k in sorted(entries)), index, entry)


def declared_indices(text: str) -> list[int]:
    """The indices the text's lines declare, sorted, found by a scan (for a message)."""
    return sorted({int(i) for i in _INDEX_RE.findall(text) if len(i) <= 9})


def _parse_line(content: str, lineno: int, line_offset: int, column_offset: int) -> LegacyEntry:
    """One `<index>=<node>:<devices>` line (comment removed); raises _LineError."""
    stripped = content.strip()
    col = len(content) - len(content.lstrip()) + 1
    index_text, eq, rest = stripped.partition("=")
    if not eq:
        raise _LineError(col, f"missing '=' in {stripped!r}", FORMAT_HINT)
    index = _parse_index(index_text.strip(), col)
    rest_col = col + len(index_text) + 1
    node_text, colon, devices_text = rest.partition(":")
    node = node_text.strip()
    node_col = rest_col + (len(node_text) - len(node_text.lstrip()))
    if not colon:
        raise _LineError(
            rest_col, f"missing ':' between node and devices in {stripped!r}", FORMAT_HINT
        )
    if not node:
        raise _LineError(rest_col, "empty node name", FORMAT_HINT)
    if not is_node_ref(node):
        raise _LineError(node_col, f"node {node!r} is not a valid node name or label value")
    dev_col = rest_col + len(node_text) + 1
    if not devices_text.strip():
        raise _LineError(dev_col, f"no devices listed for index {index}", FORMAT_HINT)
    devices, columns = _parse_devices(
        devices_text, dev_col, line=lineno + line_offset, column_offset=column_offset
    )
    return LegacyEntry(index, node, devices, lineno, col, columns, node_col)


def _parse_index(index_str: str, col: int) -> int:
    if not _is_number(index_str):
        raise _LineError(col, f"index {index_str!r} is not a non-negative integer", FORMAT_HINT)
    if len(index_str) > 9 or int(index_str) > MAX_INDEX:
        raise _LineError(col, f"index {index_str} is larger than {MAX_INDEX}")
    return int(index_str)


def _parse_devices(
    text: str, col: int, *, line: int, column_offset: int
) -> tuple[tuple[DeviceRef, ...], tuple[int, ...]]:
    """The comma-separated devices starting at column `col`, with the column of each; `line` and
    `column_offset` place the first mention of a device listed twice in the whole file."""
    devices: list[DeviceRef] = []
    columns: list[int] = []
    offset = col
    for token in text.split(","):
        tok = token.strip()
        tok_col = offset + (len(token) - len(token.lstrip()))
        offset += len(token) + 1
        device = parse_device(tok)
        if device is None:
            what = (
                "empty device" if not tok else f"device {tok!r} is neither an index nor a GPU UUID"
            )
            raise _LineError(tok_col, what, FORMAT_HINT)
        if isinstance(device, int) and device > MAX_DEVICE_INDEX:
            raise _LineError(tok_col, f"device index {tok} is larger than {MAX_DEVICE_INDEX}")
        if device in devices:
            first = columns[devices.index(device)]
            raise _LineError(
                tok_col,
                f"device {tok} listed twice in this entry (first at "
                f"line {line}, column {first + column_offset})",
            )
        devices.append(device)
        columns.append(tok_col)
    return tuple(devices), tuple(columns)


def render_legacy(entries: list[tuple[int, str, tuple[DeviceRef, ...]]]) -> str:
    return "".join(f"{i}={node}:{','.join(str(d) for d in devs)}\n" for i, node, devs in entries)


@dataclass(frozen=True, slots=True)
class SharedGpu:
    """One GPU that several lines of one legacy text name: the earlier tools ran those lines' pods
    on it together, so gpuplace shares it among exactly those slots."""

    node: str
    device: DeviceRef
    entries: tuple[LegacyEntry, ...]  # in line order, two or more

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(e.index for e in self.entries)

    def describe(self, *, line_offset: int = 0) -> str:
        lines = _and(str(e.line + line_offset) for e in self.entries)
        return (
            f"GPU {self.device} on node {self.node} is listed by lines {lines} (indices "
            f"{_and(str(i) for i in self.indices)}): their pods share it, as the earlier tools "
            "did; every other map and pod is kept off it"
        )


def shared_gpus(entries: Iterable[LegacyEntry]) -> tuple[SharedGpu, ...]:
    """The GPUs named by more than one line (same node text, same device), in line order."""
    by_gpu: dict[tuple[str, DeviceRef], list[LegacyEntry]] = {}
    for entry in entries:
        for device in entry.devices:
            by_gpu.setdefault((entry.node, device), []).append(entry)
    shared = [SharedGpu(n, d, tuple(es)) for (n, d), es in by_gpu.items() if len(es) > 1]
    return tuple(sorted(shared, key=lambda s: (s.entries[0].line, s.entries[1].line)))


def _and(items: Iterable[str]) -> str:
    words = list(items)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
