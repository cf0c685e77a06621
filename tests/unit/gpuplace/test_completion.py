"""`gpuplace completion bash|zsh`: the scripts load in their shells and complete this command line.

zsh is installed by `make unit`/`make test` (hack/ensure-apt.sh); a missing shell fails here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuplace.cli import build_parser
from gpuplace.commands.completion import bash_script, zsh_script

ROOT = build_parser()

#: (words on the line, the index of the word being completed, candidates that must be offered)
CASES = [
    (["gpuplace", ""], 1, {"gpus", "status", "explain", "completion", "--version"}),
    (["gpuplace", "gpus", "-o", ""], 3, {"text", "json", "yaml"}),
    (["gpuplace", "status", "--"], 2, {"--gpus", "--context", "--output", "--node"}),
    (["gpuplace", "key", ""], 2, {"list", "rotate", "adopt"}),
    (["gpuplace", "completion", ""], 2, {"bash", "zsh"}),
]
IDS = [" ".join(words).strip() or "gpuplace" for words, _, _ in CASES]


def run(shell: str, script: str) -> list[str]:
    result = subprocess.run(
        [shell, "-f", "-c", script] if shell == "zsh" else [shell, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize(("words", "cword", "wanted"), CASES, ids=IDS)
def test_bash_completes(words: list[str], cword: int, wanted: set[str]) -> None:
    quoted = " ".join(f"'{w}'" for w in words)
    offered = run(
        "bash",
        f"{bash_script(ROOT)}\nCOMP_WORDS=({quoted}); COMP_CWORD={cword}; _gpuplace; "
        'printf "%s\\n" "${COMPREPLY[@]}"',
    )
    assert wanted <= set(offered), offered


@pytest.mark.parametrize(("words", "cword", "wanted"), CASES, ids=IDS)
def test_zsh_registers_and_completes(words: list[str], cword: int, wanted: set[str]) -> None:
    quoted = " ".join(f"'{w}'" for w in words)
    # zsh's completion system calls `_bash_complete -F _gpuplace` (bashcompinit); its compadd
    # (which filters by the typed prefix) is replaced by one that prints what it is given.
    offered = run(
        "zsh",
        f"{zsh_script(ROOT)}\n"
        'print -r -- "registered: $_comps[gpuplace]"\n'
        'compadd() { print -rl -- "${matches[@]}" }\n'
        f"words=({quoted}); CURRENT={cword + 1}; _bash_complete -F _gpuplace",
    )
    assert offered[:4] == ["registered:", "_bash_complete", "-F", "_gpuplace"]
    assert wanted <= set(offered[4:]), offered


@pytest.mark.slow
def test_the_command_prints_the_script_for_the_installed_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuplace", "completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == bash_script(build_parser())
    version = subprocess.run(
        [sys.executable, "-m", "gpuplace", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert version.stdout.startswith("gpuplace ") and version.stdout.strip() != "gpuplace"
