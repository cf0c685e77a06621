"""Reading map files from disk for `validate`, `render` and `diff` (the working tree)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from placement.errors import Diagnostic, Location
from placement.snapshot import is_yaml_path


def walk_yaml(root: Path) -> Iterator[Path]:
    """YAML files under `root`, sorted, skipping hidden directories such as `.git`."""
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if is_yaml_path(name):
                yield Path(directory) / name


def read_text(path: Path, shown: str) -> str | Diagnostic:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        return Diagnostic(Location(shown, 1, 1), f"not UTF-8 text (byte {exc.start}): {exc.reason}")
    except OSError as exc:
        return Diagnostic(Location(shown, 0, 0), f"cannot read: {exc.strerror or exc}")


def read_paths(paths: Iterable[str]) -> tuple[dict[str, str], list[Diagnostic]]:
    """The text of every file named, and of every YAML file under every directory named, keyed
    by its path as the user would write it ('/'-separated); plus what could not be read."""
    files: dict[str, str] = {}
    problems: list[Diagnostic] = []
    for given in paths:
        root = Path(given)
        if root.is_dir():
            candidates = list(walk_yaml(root))
        elif root.exists():
            candidates = [root]
        else:
            problems.append(Diagnostic(Location(given), "no such file or directory"))
            continue
        for path in candidates:
            shown = path.as_posix()
            text = read_text(path, shown)
            if isinstance(text, Diagnostic):
                problems.append(text)
            else:
                files[shown] = text
    return files, problems
