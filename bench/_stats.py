"""Pure helpers of the benchmarks: percentiles, Prometheus histograms, /proc readings.

Kept free of I/O (callers pass the text they read) so that tests/unit can check them exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

#: Cumulative bucket counts of one histogram: upper bound ("le", +Inf included) -> count.
Buckets = dict[float, float]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `values`, interpolating linearly between the two nearest
    ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def histogram_buckets(text: str, metric: str, match: Mapping[str, str] | None = None) -> Buckets:
    """The cumulative buckets of histogram `metric` in a Prometheus text exposition, summed over
    every series whose labels include all of `match` (e.g. one webhook name, any operation)."""
    wanted = dict(match or {})
    # Parsing the whole exposition of an apiserver takes seconds; only this metric's lines matter.
    lines = [line for line in text.splitlines() if metric in line]
    buckets: Buckets = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name != f"{metric}_bucket":
                continue
            labels = sample.labels
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def counter_totals(text: str, sample: str, by: Sequence[str]) -> dict[tuple[str, ...], float]:
    """The samples named `sample` (a counter such as apiserver_request_total, or a histogram's
    `_sum`) summed by the label values named in `by` (e.g. verb and resource)."""
    lines = [line for line in text.splitlines() if sample in line]
    totals: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for found in family.samples:
            if found.name != sample:
                continue
            key = tuple(found.labels.get(label, "") for label in by)
            totals[key] = totals.get(key, 0.0) + found.value
    return totals


def counter_delta(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> dict[tuple[str, ...], float]:
    """Increments between two scrapes; keys that did not move are left out."""
    delta = {key: value - before.get(key, 0.0) for key, value in after.items()}
    return {key: value for key, value in delta.items() if value}


def bucket_delta(before: Buckets, after: Buckets) -> Buckets:
    """What was observed between two scrapes of the same cumulative histogram."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def histogram_count(buckets: Buckets) -> float:
    return buckets.get(math.inf, max(buckets.values(), default=0.0))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile estimated from cumulative buckets as Prometheus' histogram_quantile does:
    linear interpolation inside the bucket that holds the rank, the first bucket starting at 0,
    and the highest finite bound when the rank falls into +Inf. None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    total = histogram_count(buckets)
    finite = sorted(b for b in buckets if not math.isinf(b))
    if total <= 0 or not finite:
        return None
    rank = q * total
    for i, bound in enumerate(finite):
        if buckets[bound] >= rank:
            start = finite[i - 1] if i else 0.0
            below = buckets[finite[i - 1]] if i else 0.0
            inside = buckets[bound] - below
            if inside <= 0:
                return start
            return start + (bound - start) * (rank - below) / inside
    return finite[-1]


def share_at_most(bound: float, buckets: Buckets) -> float | None:
    """The exact fraction of observations <= `bound`, which must be one of the bucket bounds."""
    total = histogram_count(buckets)
    if total <= 0:
        return None
    if bound not in buckets:
        raise ValueError(f"{bound} is not a bucket bound of this histogram ({sorted(buckets)})")
    return buckets[bound] / total


def cpu_seconds(stat: str, ticks_per_second: int) -> float:
    """User plus system CPU time from the text of /proc/<pid>/stat."""
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of the whole line
    return (utime + stime) / ticks_per_second


def busy_seconds(proc_stat: str, ticks_per_second: int) -> float:
    """CPU time the whole machine has spent busy (all cores; not idle, not waiting for I/O),
    from the "cpu" line of /proc/stat."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            # guest time is already counted in user and nice
            counted = values[:8]
            return (sum(counted) - idle) / ticks_per_second
    raise ValueError("no cpu line in /proc/stat")


def status_kib(status: str, field: str) -> int:
    """A memory field such as VmHWM (peak RSS) or VmRSS, in KiB, from /proc/<pid>/status."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise ValueError(f"no {field} in /proc/<pid>/status")


def meminfo_kib(meminfo: str, field: str = "MemTotal") -> int:
    return status_kib(meminfo, field)
