#!/usr/bin/env python3
"""Moves each tests/unit/test_*.py left in the flat folder into tests/unit/<package>/, by the
package it tests, with `git mv`, and rewrites what named the old paths.

    .venv/bin/python hack/group-unit-tests.py            # move and rewrite
    .venv/bin/python hack/group-unit-tests.py --dry-run  # print the moves only

Idempotent: a file already in a package folder stays where it is, so it can be re-run after new
tests land in the flat folder. A file not in PACKAGE_OF goes by its name's prefix, then by the
gpuplace package it imports most (placement, the pure core, last). Rewritten afterwards, in every
tracked text file: `tests.unit.test_x` imports, `tests/unit/test_x.py` paths, and, in a moved
file, `Path(__file__).resolve().parents[n]` (one level deeper); then ruff sorts the imports and
formats the Python files it changed (longer module paths).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "tests" / "unit"

#: The folders under tests/unit and the code each one's tests are about.
PACKAGES = {
    "placement": "placement/: the pure core (compile, validate, bind, gate, annotations, keyring)",
    "controller": "controller/: binder, caches, reconcilers, DRA, metrics, web view",
    "webhook": "webhook/: admission, map checks, TLS, processes",
    "agent": "agent/: node checks and the NVML probe (with the fake libnvidia-ml)",
    "kubeio": "kubeio/: the apiserver client, request loop, informers, leases, pod reader",
    "gpuplace": "gpuplace/: the CLI and its commands, packaging",
    "bench": "bench/: the benchmarks' own logic",
    "chart": "charts/gpuplace, argocd/ and the kustomizations, as rendered",
    "dev": "dev/ (gpuplace_dev): local cluster, local ArgoCD, docs reference",
}

PACKAGE_OF = {
    # placement
    "test_binding_plan": "placement",
    "test_compile": "placement",
    "test_conflicts": "placement",
    "test_crds": "placement",
    "test_devices": "placement",
    "test_diff": "placement",
    "test_drift": "placement",
    "test_fallback": "placement",
    "test_gate": "placement",
    "test_grants": "placement",
    "test_indexing": "placement",
    "test_inventory_topology": "placement",
    "test_keyring": "placement",
    "test_legacy": "placement",
    "test_legacy_sharing": "placement",
    "test_mig_slots": "placement",
    "test_mig_validate": "placement",
    "test_model_read": "placement",
    "test_nodes": "placement",
    "test_nvlink_choices": "placement",
    "test_occupancy": "placement",
    "test_pci_refs": "placement",
    "test_policy_schema": "placement",
    "test_properties": "placement",
    "test_provenance_limits": "placement",
    "test_reasons": "placement",
    "test_restore": "placement",
    "test_signature": "placement",
    "test_taint_health": "placement",
    "test_toleration_grants": "placement",
    "test_validate_rules": "placement",
    "test_wake": "placement",
    "test_yaml_limits": "placement",
    # controller
    "test_binder": "controller",
    "test_controller_health": "controller",
    "test_controller_status": "controller",
    "test_dra": "controller",
    "test_dra_gate": "controller",
    "test_dra_taints": "controller",
    "test_freeslots": "controller",
    "test_gpu_metrics": "controller",
    "test_heap": "controller",
    "test_leadership_end": "controller",
    "test_pending_report": "controller",
    "test_provenance": "controller",
    "test_queue": "controller",
    "test_reconcilers": "controller",
    "test_renumber": "controller",
    "test_resource_maps": "controller",
    "test_rollout": "controller",
    "test_slotcache": "controller",
    "test_trustreport": "controller",
    "test_webview": "controller",
    # agent
    "test_fakenvml_probe": "agent",
    "test_fakenvml_topology": "agent",
    # kubeio
    "test_informer": "kubeio",
    "test_leader": "kubeio",
    "test_pod_view": "kubeio",
    # gpuplace (the CLI)
    "test_completion": "gpuplace",
    "test_key_command": "gpuplace",
    "test_mapviews": "gpuplace",
    "test_packaging": "gpuplace",
    "test_plan": "gpuplace",
    "test_prcomment": "gpuplace",
    "test_precommit_hook": "gpuplace",
    "test_preflight": "gpuplace",
    # chart, argocd/, kustomize
    "test_alerts": "chart",
    "test_kustomize": "chart",
    # dev/
    "test_docs_reference": "dev",
}

#: Name prefixes, for files not in PACKAGE_OF (first match wins).
PREFIXES = (
    ("test_bench_", "bench"),
    ("test_kubeio_", "kubeio"),
    ("test_webhook_", "webhook"),
    ("test_agent_", "agent"),
    ("test_controller_", "controller"),
    ("test_chart", "chart"),
    ("test_argocd", "chart"),
    ("test_cli_", "gpuplace"),
    ("test_localcluster", "dev"),
    ("test_localargocd", "dev"),
)

_IMPORT = re.compile(r"^(?:from|import) (\w+)", re.MULTILINE)
_COMPONENTS = ("bench", "controller", "webhook", "agent", "kubeio", "gpuplace")


def package_of(path: Path) -> str:
    stem = path.stem
    if stem in PACKAGE_OF:
        return PACKAGE_OF[stem]
    for prefix, package in PREFIXES:
        if stem.startswith(prefix):
            return package
    imported = Counter(_IMPORT.findall(path.read_text()))
    if imported["gpuplace_dev"]:
        return "dev"
    ranked = sorted(_COMPONENTS, key=lambda name: -imported[name])
    return ranked[0] if imported[ranked[0]] else "placement"


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in names:
        path = ROOT / name.decode()
        if name and path.is_file() and not path.is_symlink():
            files.append(path)
    return files


def rewrite(moves: dict[str, str]) -> list[Path]:
    """Rewrites `tests.unit.<stem>` and `tests/unit/<stem>.py` to their package folder for every
    stem in `moves`, in every tracked text file; returns the files changed."""
    if not moves:
        return []
    stems = "|".join(sorted(moves, key=len, reverse=True))
    dotted = re.compile(rf"\btests\.unit\.({stems})\b")
    slashed = re.compile(rf"\btests/unit/({stems})\.py\b")
    changed = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        new = dotted.sub(lambda m: f"tests.unit.{moves[m[1]]}.{m[1]}", text)
        new = slashed.sub(lambda m: f"tests/unit/{moves[m[1]]}/{m[1]}.py", new)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


_PARENTS = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?\.parents)\[(\d+)\]")


def deepen(path: Path) -> None:
    """A moved file is one folder deeper: `Path(__file__).parents[n]` becomes `parents[n + 1]`."""
    text = path.read_text()
    new = _PARENTS.sub(lambda m: f"{m[1]}[{int(m[2]) + 1}]", text)
    if new != text:
        path.write_text(new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    moves = {path.stem: package_of(path) for path in sorted(UNIT.glob("test_*.py"))}
    for stem, package in moves.items():
        print(f"tests/unit/{stem}.py -> tests/unit/{package}/{stem}.py")
    if args.dry_run:
        return 0
    for package in sorted(set(moves.values())):
        folder = UNIT / package
        folder.mkdir(exist_ok=True)
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text(f'"""Unit tests of {PACKAGES[package]}."""\n')
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for stem, package in moves.items():
        source, target = UNIT / f"{stem}.py", UNIT / package / f"{stem}.py"
        subprocess.run(["git", "mv", str(source), str(target)], cwd=ROOT, check=True)
        deepen(target)
    # Every grouped file, so that a file written against the flat layout (a branch that landed
    # after an earlier run) has its references to files moved then rewritten too.
    placed = {path.stem: path.parent.name for path in sorted(UNIT.glob("*/test_*.py"))}
    changed = rewrite(placed)
    for path in changed:
        print(f"rewrote {path.relative_to(ROOT)}")
    python = [str(p) for p in changed if p.suffix == ".py"]
    if python:
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run(
            [*ruff, "check", "--quiet", "--fix", "--select", "I001", *python], cwd=ROOT, check=True
        )
        subprocess.run([*ruff, "format", "--quiet", *python], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
