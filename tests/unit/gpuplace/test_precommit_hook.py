"""The pre-commit hook gpuplace-validate, run by the real `pre-commit` on a map repository that
uses this tree as its hook repository: a broken map fails the commit, a good one passes, a staged
file without maps is fine. `language: python`: pre-commit installs gpuplace into a virtualenv of
its own (from the package index the first time, then from its cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PRE_COMMIT = Path(sys.executable).with_name("pre-commit")
#: What `pip install` of the hook repository needs of this tree.
PACKAGE = ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml")
PACKAGES = ("placement", "kubeio", "controller", "webhook", "agent", "gpuplace")

pytestmark = pytest.mark.skipif(not PRE_COMMIT.exists(), reason="pre-commit is not installed")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def hook_repository(root: Path) -> tuple[Path, str]:
    """This tree's package and hooks as a committed repository (pre-commit clones a `rev`)."""
    root.mkdir()
    for name in PACKAGE:
        shutil.copy2(REPO / name, root / name)
    for name in PACKAGES:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "hooks")
    return root, git(root, "rev-parse", "HEAD")


def commit(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    git(repo, "add", "-A")
    return subprocess.run(
        [str(PRE_COMMIT), "run", "--hook-stage", "pre-commit"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


@pytest.mark.slow
def test_the_hook_fails_a_broken_map_and_passes_a_good_one(tmp_path: Path) -> None:
    hooks, rev = hook_repository(tmp_path / "hooks")
    maps = tmp_path / "maps"
    shutil.copytree(REPO / "examples" / "gitops", maps)
    (maps / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hooks}\n    rev: {rev}\n    hooks:\n      - id: gpuplace-validate\n"
    )
    git(maps, "init", "-q")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("PYTHONPATH", None)  # the hook runs the gpuplace pre-commit installed, not this tree

    good = commit(maps, env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "gpuplace validate (placement maps)" in good.stdout
    git(maps, "commit", "-qm", "maps")

    llm = maps / "clusters/dev/maps/llm-serving.yaml"
    llm.write_text(llm.read_text().replace("devices: [0, 1]", "devices: [0, 1, 1]"))
    broken = commit(maps, env)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "clusters/dev/maps/llm-serving.yaml:18:23: error:" in broken.stdout
    assert "device 1 listed twice" in broken.stdout

    git(maps, "reset", "-q", "--hard")
    (maps / "clusters/dev/namespaces.yaml").write_text(
        (maps / "clusters/dev/namespaces.yaml").read_text() + "# reviewed\n"
    )
    only_other = commit(maps, env)  # a staged YAML file without maps: nothing to refuse
    assert only_other.returncode == 0, only_other.stdout + only_other.stderr
