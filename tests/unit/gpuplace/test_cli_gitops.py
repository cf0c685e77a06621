"""`gpuplace validate`, `diff` and `render` on the example GitOps repository and copies of it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import git
import pytest
import yaml

from gpuplace.cli import main
from gpuplace.commands._tree import read_paths
from gpuplace_dev.localcluster import find_binaries
from placement.compile import Compiler
from placement.inventory import GpuDevice, NodeInventory
from placement.model import Model
from placement.snapshot import load_snapshot
from placement.status import Phase
from placement.types import GpuUuid, MapKey, NodeName

ROOT = Path(__file__).resolve().parents[3]
GITOPS = ROOT / "examples" / "gitops"
DEV = GITOPS / "clusters" / "dev"
LLM = "clusters/dev/maps/llm-serving.yaml"
LEGACY = "clusters/dev/maps/webhook-test.yaml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def line_of(path: Path, needle: str) -> tuple[int, int]:
    """1-based line and column where `needle` first appears in the file."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return number, line.index(needle) + 1
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.fixture
def gitops(tmp_path: Path) -> Path:
    copy = tmp_path / "gitops"
    shutil.copytree(GITOPS, copy)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# -- validate -------------------------------------------------------------------------------------
def test_the_examples_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(GITOPS))
    assert code == 0, out
    assert out.startswith("OK: ")
    assert "error" not in out and "warning" not in out


def test_a_broken_copy_fails_with_the_right_lines(
    gitops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(gitops / LLM, "devices: [0, 1]", "devices: [0, 0]")
    edit(gitops / LEGACY, "1=node2:2", "1=node2:two")
    code, out, _ = run(capsys, "validate", str(gitops))
    assert code == 1

    llm_line, llm_col = line_of(gitops / LLM, "devices: [0, 0]")
    legacy_line, legacy_col = line_of(gitops / LEGACY, "1=node2:two")
    llm = (gitops / LLM).as_posix()
    legacy = (gitops / LEGACY).as_posix()
    assert out.splitlines() == [
        f"{llm}:{llm_line}:{llm_col + 13}: error: spec.placements[1].devices[1]: device 0 listed "
        f"twice in this entry (first at line {llm_line}, column {llm_col + 10})",
        f"{legacy}:{legacy_line}:{legacy_col + 8}: error: spec.map: device 'two' is neither an "
        "index nor a GPU UUID (expected '<index>=<node>:<device>[,<device>...]', e.g. "
        "'0=node1:0,1')",
        "Found 2 errors in 2 files (5 valid maps (16 slots) in 15 files).",
    ]


def test_json_output(gitops: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(gitops / LLM, "index: 1\n", "index: 0\n")
    code, out, _ = run(capsys, "validate", "--format", "json", str(gitops / "clusters" / "dev"))
    assert code == 1
    report = json.loads(out)
    assert report["valid"] is False
    (error,) = report["errors"]
    first_line = line_of(gitops / LLM, "- index: 0")[0]
    assert error["message"] == f"duplicate index 0 (first at line {first_line}, column 7)"
    assert {m["map"] for m in report["maps"]} == {
        "inference/embeddings",
        "ml-training/trainer",
        "research/notebooks",
        "legacy/webhook-test",
    }


def test_a_conflict_across_maps_fails(gitops: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # llm-serving index 1 holds gpu-node-2 GPUs 0 and 1; embeddings index 0 now wants GPU 1 too.
    edit(
        gitops / "clusters/dev/maps/embeddings.yaml",
        "node: gpu-node-4\n      devices: [GPU-00000004-0000-4000-8000-000000000000]",
        "node: gpu-node-2\n      devices: [1]",
    )
    code, out, _ = run(capsys, "validate", str(gitops))
    assert code == 1
    (message, summary) = out.splitlines()
    # Reported at the map later in key order, naming the other map and entry.
    line, column = line_of(gitops / LLM, "- index: 1")
    assert message.startswith(f"{(gitops / LLM).as_posix()}:{line}:{column + 2}: error: ")
    assert (
        "device 1 on node gpu-node-2 of exclusive map inference/llm-serving index 1 "
        f"({(gitops / LLM).as_posix()}:{line}:{column + 2}) is also claimed by exclusive map "
        "inference/embeddings index 0"
    ) in message
    assert summary.startswith("Found 1 error in 1 file")


def test_missing_paths_and_empty_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "validate", str(tmp_path / "nope"))
    assert code == 1
    assert f"{tmp_path / 'nope'}: error: no such file or directory" in out
    code, out, _ = run(capsys, "validate", str(tmp_path))
    assert code == 1
    assert "error: no PlacementMap found" in out


# -- diff -------------------------------------------------------------------------------------------
ACTOR = git.Actor("Reviewer", "reviewer@example.com")


def commit(repo: git.Repo, message: str) -> str:
    repo.git.add(A=True)
    return repo.index.commit(message, author=ACTOR, committer=ACTOR).hexsha


@pytest.fixture
def repo(gitops: Path) -> Iterator[git.Repo]:
    with git.Repo.init(gitops) as repository:
        commit(repository, "maps")
        yield repository


def test_diff_reports_a_moved_slot(repo: git.Repo, capsys: pytest.CaptureFixture[str]) -> None:
    top = Path(str(repo.working_tree_dir))
    edit(
        top / LLM,
        "node: gpu-node-1\n      devices: [2, 3]",
        "node: gpu-node-3\n      devices: [2, 3]",
    )
    commit(repo, "move llm-serving 0")
    code, out, _ = run(capsys, "diff", "HEAD~1", "HEAD", "--repo", str(top))
    assert code == 0, out
    assert (
        "~ map clusters/dev: inference/llm-serving (clusters/dev/maps/llm-serving.yaml): changed"
        in out
    )
    assert "    ~ index 0 moved: gpu-node-1 devices 2,3 -> gpu-node-3 devices 2,3" in out
    assert out.rstrip().endswith(
        "Plan: maps 1 changed; slots 0 added, 0 removed, 1 moved, 0 changed."
    )


def test_diff_against_the_working_tree_shows_a_map_turning_invalid(
    repo: git.Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    top = Path(str(repo.working_tree_dir))
    edit(top / LEGACY, "2=node3:0,1,2", "2=node3:0,1,2,2")
    (top / "clusters/dev/maps/extra.yaml").write_text(
        (top / LLM)
        .read_text()
        .replace("name: llm-serving", "name: extra")
        .replace("gpu-node-1", "gpu-node-9")
        .replace("gpu-node-2", "gpu-node-8")
    )
    code, out, _ = run(capsys, "diff", "HEAD", "--repo", str(top), "--path", "clusters/dev")
    assert code == 1
    line, column = line_of(top / LEGACY, "2=node3:0,1,2,2")
    assert (
        "! map clusters/dev: legacy/webhook-test (clusters/dev/maps/webhook-test.yaml): turns "
        "invalid; the controller keeps serving its last valid version (3 slots)"
    ) in out
    assert (
        f"    clusters/dev/maps/webhook-test.yaml:{line}:{column + 14}: error: spec.map: device 2 "
        f"listed twice in this entry (first at line {line}, column {column + 12})"
    ) in out
    # Untracked files are part of the working tree; the kustomization does not generate it yet.
    assert (
        "+ map clusters/dev: inference/extra (clusters/dev/maps/extra.yaml): added, 2 slots" in out
    )
    assert "Warnings in working tree" in out

    code, out, _ = run(capsys, "diff", "HEAD", "--repo", str(top), "--format", "json")
    report = json.loads(out)
    assert (report["from"]["rev"], report["to"]["rev"], report["valid"]) == ("HEAD", None, False)
    assert {(m["map"], m["kind"]) for m in report["maps"]} == {
        ("legacy/webhook-test", "invalid"),
        ("inference/extra", "added"),
    }


def test_diff_refuses_unknown_revisions_and_non_repositories(
    repo: git.Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "diff", "no-such-rev", "--repo", str(repo.working_tree_dir))
    assert (code, err.strip()) == (2, "gpuplace diff: error: unknown revision 'no-such-rev'")
    outside = tmp_path / "plain"
    outside.mkdir()
    code, _, err = run(capsys, "diff", "HEAD", "--repo", str(outside))
    assert code == 2
    assert "is not in a git repository" in err


# -- render ------------------------------------------------------------------------------------------
def test_render_prints_the_source_configmaps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", str(DEV))
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    by_name = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs}
    assert set(by_name) == {
        ("inference", "embeddings"),
        ("inference", "llm-serving"),
        ("legacy", "webhook-test"),
        ("ml-training", "trainer"),
        ("research", "notebooks"),
    }
    for (_, name), doc in by_name.items():
        assert (doc["apiVersion"], doc["kind"]) == ("v1", "ConfigMap")
        assert doc["metadata"]["labels"] == {"gpuplace.io/placement-map": "true"}
        # The data is the file, byte for byte, so errors point at the lines in git.
        assert doc["data"] == {"placement.yaml": (DEV / "maps" / f"{name}.yaml").read_text()}


def test_render_prints_nothing_for_an_invalid_map(
    gitops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(gitops / LLM, "index: 1", "index: -1")
    code, out, err = run(capsys, "render", str(gitops / "clusters" / "dev"))
    assert (code, out) == (1, "")
    assert "index -1 is negative" in err
    assert err.rstrip().endswith("Nothing rendered: 1 error.")


def test_render_wants_one_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "render", str(GITOPS))
    assert (code, out) == (1, "")
    assert "render one cluster at a time" in err


def kubectl() -> str:
    """The pinned kubectl (built with the control plane when missing)."""
    return str(find_binaries().kubectl)


def test_the_kustomization_generates_what_render_prints(capsys: pytest.CaptureFixture[str]) -> None:
    built = subprocess.run(
        [str(kubectl()), "kustomize", str(DEV)], capture_output=True, text=True, check=True
    ).stdout
    generated = [d for d in yaml.safe_load_all(built) if d["kind"] == "ConfigMap"]
    code, out, _ = run(capsys, "render", str(DEV))
    assert code == 0
    rendered = list(yaml.safe_load_all(out))

    def key(doc: dict[str, dict[str, str]]) -> tuple[str, str]:
        return doc["metadata"]["namespace"], doc["metadata"]["name"]

    assert sorted(generated, key=key) == sorted(rendered, key=key)


# -- the dev maps on the demo's cluster ---------------------------------------------------------
def demo_cluster() -> Compiler:
    """What `gpuplace demo` creates: gpu-node-1..4 labelled gpu-node-name=node1..4, 4 H100s each
    (NUMA node = index // 2), UUIDs GPU-<node:08x>-0000-4000-8000-<index:012x>."""
    compiler = Compiler()
    for n in range(1, 5):
        name = NodeName(f"gpu-node-{n}")
        compiler.set_node(name, {"gpu-node-name": f"node{n}"})
        compiler.set_inventory(
            NodeInventory(
                name,
                tuple(
                    GpuDevice(
                        i,
                        GpuUuid(f"GPU-{n:08x}-0000-4000-8000-{i:012x}"),
                        "NVIDIA H100 80GB HBM3",
                        81559,
                        f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                        numa_node=i // 2,
                    )
                    for i in range(4)
                ),
            )
        )
    return compiler


def compile_dev(root: Path) -> tuple[Model, dict[MapKey, Phase]]:
    files, _ = read_paths([str(root / "clusters" / "dev")])
    compiler = demo_cluster()
    for entry in load_snapshot(files).maps.values():
        compiler.set_map(entry.map)
    model, reports = compiler.build()
    return model, {key: report.phase for key, report in reports.items()}


def test_the_dev_maps_fit_the_demo_cluster_and_leave_room_for_the_demo_move(
    gitops: Path,
) -> None:
    model, phases = compile_dev(gitops)
    assert set(phases.values()) == {Phase.VALID}, phases
    used = {
        (s.node, i) for m in model.maps.values() for s in m.slots.values() for i in s.device_indices
    }
    assert ("gpu-node-4", 2) not in used
    # The demo moves llm-serving index 1 to gpu-node-4 GPU 2.
    edit(
        gitops / LLM,
        "node: gpu-node-2\n      devices: [0, 1]",
        "node: gpu-node-4\n      devices: [2]",
    )
    model, phases = compile_dev(gitops)
    assert set(phases.values()) == {Phase.VALID}, phases
    moved = model.slot(MapKey("inference", "llm-serving"), 1)
    assert moved is not None
    assert (moved.node, moved.device_indices) == ("gpu-node-4", (2,))
