"""What a placement map costs the webhook to read: a 1 MiB valid map, and a 550-byte merge-key bomb.

Both go through the webhook's own code path for a ConfigMap admission (`parse_review` of the
AdmissionReview JSON, then `check_configmap`), the same parser `gpuplace validate` and the controller
use. The valid map is 21,746 placements, as much as one ConfigMap holds; the webhook's timeout is
10 s. The bomb chains `<<: [*a, *a, *a, *a]` twelve levels deep (4**11 entries if merges are
copied). Each repeat runs in a fresh interpreter so that peak RSS is that of one admission.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

from bench import Measurement, below, run_worker
from bench._kube import admission_review
from placement.annotations import PLACEMENT_MAP_LABEL
from webhook.mapcheck import check_configmap
from webhook.review import parse_review

NAME = "map input"
PLACEMENTS = 21_746
TARGET_BIG_S = 3.0  # "well inside" the webhook's 10 s timeout
TARGET_BOMB_MS = 50.0
TARGET_RSS_MIB = 150.0


def big_map(placements: int) -> str:
    header = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        "metadata: {name: big, namespace: bench}\nspec:\n  placements:\n"
    )
    return header + "".join(
        f"  - {{index: {i}, node: g-{i // 8:04d}, devices: [{i % 8}]}}\n" for i in range(placements)
    )


def merge_bomb(levels: int = 12) -> str:
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        "metadata: {name: bomb, namespace: bench}",
        "a0: &a0 {x: 1, y: 2}",
    ]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 4) + "]}")
    return "\n".join([*lines, "spec: {placements: []}", ""])


def review(name: str, text: str) -> bytes:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "bench", "labels": {PLACEMENT_MAP_LABEL: "true"}},
        "data": {"placement.yaml": text},
    }
    body = admission_review("ConfigMap", "configmaps", configmap)
    return json.dumps(body).encode()


def admit(body: bytes) -> tuple[float, float, bool, str]:
    start, cpu = time.perf_counter(), time.process_time()
    verdict = check_configmap(parse_review(json.loads(body)))
    return (
        time.perf_counter() - start,
        time.process_time() - cpu,
        verdict.allowed,
        verdict.message,
    )


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(kind: str, placements: int) -> dict[str, Any]:
    body = review(kind, big_map(placements) if kind == "big" else merge_bomb())
    before = _rss_mib()
    seconds, cpu_seconds, allowed, message = admit(body)
    if allowed != (kind == "big"):
        raise RuntimeError(f"{kind}: unexpected verdict: {message[:300]}")
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "bytes": len(body),
        "message_chars": len(message),
        "peak_rss_mib": _rss_mib(),
        "rss_growth_mib": _rss_mib() - before,
    }


def run(repeats: int, small: bool = False) -> list[Measurement]:
    placements = PLACEMENTS // 10 if small else PLACEMENTS
    big = [
        run_worker("bench.mapinput", "--worker", "big", f"--placements={placements}")
        for _ in range(repeats)
    ]
    bomb = [run_worker("bench.mapinput", "--worker", "bomb") for _ in range(repeats)]

    def samples(runs: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
        return [float(r[key]) * scale for r in runs]

    size = big[0]["bytes"] / 2**20
    label = f"map input {placements:,} placements ({size:.2f} MiB)"
    return [
        below(label, "webhook validation", samples(big, "seconds"), "s", TARGET_BIG_S),
        # CPU time is what the admission costs whatever else the machine runs at the time.
        below(label, "webhook validation (CPU)", samples(big, "cpu_seconds"), "s", TARGET_BIG_S),
        below(label, "peak RSS", samples(big, "peak_rss_mib"), "MiB"),
        below(
            "map input merge-key bomb",
            "refused in",
            samples(bomb, "seconds", 1000),
            "ms",
            TARGET_BOMB_MS,
        ),
        below(
            "map input merge-key bomb",
            "peak RSS",
            samples(bomb, "peak_rss_mib"),
            "MiB",
            TARGET_RSS_MIB,
        ),
        below(
            "map input merge-key bomb",
            "message",
            samples(bomb, "message_chars"),
            "chars",
            detail=True,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mapinput")
    parser.add_argument("--worker", choices=["big", "bomb"], help="run one admission, print JSON")
    parser.add_argument("--placements", type=int, default=PLACEMENTS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.placements)))
        return 0
    for m in run(3):
        print(f"{m.benchmark} {m.metric}: {m.value:.3f} {m.unit} {m.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
