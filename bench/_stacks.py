"""`python -m bench._stacks FILE... [--top N]`: where a py-spy profile (--format raw) spends time.

Prints the functions with the most samples on top of the stack (self) and anywhere in it
(inclusive), as shares of all samples: enough to find the biggest cost without a flame-graph viewer.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path


def parse(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """Collapsed stacks: "frame;frame;... count", root first."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def summarize(
    stacks: Counter[tuple[str, ...]],
) -> tuple[int, Counter[str], Counter[str]]:
    total = sum(stacks.values())
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        own[stack[-1]] += count
        for frame in set(stack):
            inclusive[frame] += count
    return total, own, inclusive


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._stacks", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    stacks: Counter[tuple[str, ...]] = Counter()
    for file in args.files:
        stacks.update(parse(file.read_text().splitlines()))
    total, own, inclusive = summarize(stacks)
    print(f"{total} samples")
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"\n{title}:")
        for frame, count in counter.most_common(args.top):
            print(f"{100 * count / total:6.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
