"""The command that re-places what a failure strands, as the controller suggests it (map status,
Events) and as `gpuplace move` runs it: one spelling, so a suggestion can be pasted as it is."""

from __future__ import annotations

from collections.abc import Iterable


def move_command(node: str | None = None, gpus: Iterable[str] = ()) -> str:
    """`gpuplace move` off `node` and/or off `gpus` (docs/authoring.md)."""
    words = ["gpuplace", "move"]
    if node:
        words += ["--node", node]
    for gpu in gpus:
        words += ["--gpu", gpu]
    return " ".join(words)
