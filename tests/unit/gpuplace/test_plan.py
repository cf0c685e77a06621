"""`gpuplace plan` on a git repository laid out like examples/gitops: the summary, the sections,
the formats (text, Markdown, SARIF), the offline checks and the exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuplace import planreport
from gpuplace.cli import main
from gpuplace.commands.plan import contexts_for
from gpuplace.prcomment import MARKER
from placement.diff import RunningPod, drifting_pods
from placement.inventorycheck import waiting_slots
from placement.occupancy import CellState, GpuCell, Holder
from placement.review import RepoPlan, Revision, plan_cluster, with_live
from placement.types import NodeName

REPO = Path(__file__).resolve().parents[3]
LLM = "clusters/dev/maps/llm-serving.yaml"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "maps"
    shutil.copytree(REPO / "examples" / "gitops", root)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def change(repo: Path, path: str, old: str, new: str, message: str = "change") -> None:
    file = repo / path
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new, 1))
    git(repo, "commit", "-qam", message)


def plan(
    repo: Path, capsys: pytest.CaptureFixture[str], *args: str, fmt: str = "text"
) -> tuple[int, str]:
    code = main(["plan", "main~1", "main", "--repo", str(repo), "--format", fmt, *args])
    return code, capsys.readouterr().out


def move_slot(repo: Path) -> None:
    change(
        repo,
        LLM,
        "node: gpu-node-2\n      devices: [0, 1]",
        "node: gpu-node-3\n      devices: [0, 1]",
    )


def test_a_moved_slot_is_planned_in_its_cluster_and_the_unchanged_one_is_hidden(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    move_slot(repo)
    code, out = plan(repo, capsys, "--detailed-exitcode")
    assert code == 2
    assert "== dev (clusters/dev): 1 map changed" in out
    assert "~ index 1 moved: gpu-node-2 devices 0,1 -> gpu-node-3 devices 0,1" in out
    assert "== prod (clusters/prod): no changes" in out
    assert (
        "Summary: 2 clusters (1 changed); 1 map changed; slots 0 added, 0 removed, 1 moved" in out
    )

    code, md = plan(repo, capsys, fmt="markdown")
    assert code == 0  # changes, but no --detailed-exitcode
    assert md.startswith(MARKER + "\n")
    summary_at, section_at = md.index("1 moved"), md.index("<details>")
    assert summary_at < section_at
    assert md.count("<details>") == 1
    assert "<b>dev</b>" in md
    assert "<b>prod</b>" not in md
    assert "_1 unchanged cluster not shown._" in md


def test_no_change_exits_0_even_with_detailed_exitcode(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "README.md").write_text("notes\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "docs")
    code, md = plan(repo, capsys, "--detailed-exitcode", fmt="markdown")
    assert code == 0
    assert "gpuplace plan: no changes" in md
    assert "<details>" not in md
    assert "_2 unchanged clusters not shown._" in md


def test_a_broken_map_is_an_error_at_its_file_line_and_column(
    repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    change(repo, LLM, "devices: [0, 1]", "devices: [0, 1, 1]")
    sarif_file = tmp_path / "plan.sarif"
    code, out = plan(repo, capsys, "--detailed-exitcode", "--out", f"sarif={sarif_file}")
    assert code == 1
    assert f"{LLM}:18:23: error: spec.placements[1].devices[2]: device 1 listed twice" in out
    assert "1 error" in out

    log = json.loads(sarif_file.read_text())
    assert log["version"] == "2.1.0"
    (result,) = log["runs"][0]["results"]
    assert result["level"] == "error"
    assert result["ruleId"] == "gpuplace/map-error"
    assert "device 1 listed twice" in result["message"]["text"]
    physical = result["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == LLM
    assert physical["region"] == {"startLine": 18, "startColumn": 23}


def inventory(*gpus: tuple[str, int, str]) -> str:
    cells = [
        {"node": n, "index": i, "uuid": f"GPU-{n}-{i}", "product": p, "state": "free"}
        for n, i, p in gpus
    ]
    return json.dumps({"gpus": cells, "summary": {}})


def test_declared_devices_are_checked_against_the_committed_inventory(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = [(f"gpu-node-{n}", i, "NVIDIA H100 80GB HBM3") for n in range(1, 5) for i in range(4)]
    (repo / "clusters/dev/inventory.json").write_text(inventory(*gpus[:-1]))  # no GPU 3 on node 4
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "inventory")
    change(repo, LLM, "devices: [0, 1]", "devices: [0, 7]")
    code, out = plan(repo, capsys)
    assert code == 1
    assert (
        f"{LLM}:16:7: error: spec.placements[1]: map inference/llm-serving index 1: node "
        "gpu-node-2 has no GPU 7"
    ) in out
    assert "Checked: devices against clusters/dev/inventory.json." in out
    # The base already declared GPU 3 of gpu-node-4 (notebooks): the snapshot lacks it too.
    assert "gpu-node-4 has no GPU 3" in out


def test_a_map_outside_the_committed_policy_is_refused_at_its_slot(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = """apiVersion: gpuplace.io/v1alpha1
kind: PlacementPolicy
metadata:
  name: gpuplace-policy
spec:
  grants:
    - namespaces: [inference]
      nodes: [gpu-a-01]
"""
    (repo / "clusters/prod/policy.yaml").write_text(policy)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "policy")
    code, out = plan(repo, capsys)
    assert code == 1
    assert (
        "llm-serving.yaml:13:7: error: spec.placements[4]: index 4: namespace inference may not place on node gpu-a-02"
        in out
    )
    assert "clusters/prod/maps/llm-serving.yaml:12:7: error" not in out  # gpu-a-01 is granted
    assert "Checked: grants of clusters/prod/policy.yaml." in out


def test_a_pod_on_a_moved_slot_would_move() -> None:
    base = {LLM: (REPO / "examples/gitops" / LLM).read_text()}
    head = {LLM: base[LLM].replace("node: gpu-node-2", "node: gpu-node-3")}
    cluster = plan_cluster("clusters/dev", base, head)
    pods = [
        RunningPod("inference", "llm-serving-0", "llm-serving", 0),
        RunningPod("inference", "llm-serving-1", "llm-serving", 1),
    ]
    live = with_live(cluster, drifting_pods(cluster.plan, pods))
    result = RepoPlan(Revision("main", "a"), Revision("pr", "b"), (live,))
    assert "1 pod would move" in planreport.summary_line(result)
    text = planreport.text(result)
    assert "inference/llm-serving-1 (SlotMoved)" in text
    assert "llm-serving-0" not in text
    assert result.summary()["podsDrifting"] == 1


def cell(node: str, index: int, *holders: Holder) -> GpuCell:
    state = CellState.HELD if holders else CellState.FREE
    return GpuCell(NodeName(node), index, f"GPU-{node}-{index}", "H100", state, holders)


def test_a_moved_slot_waits_on_a_gpu_another_pod_holds() -> None:
    base = {LLM: (REPO / "examples/gitops" / LLM).read_text()}
    head = {LLM: base[LLM].replace("node: gpu-node-2", "node: gpu-node-3")}
    cluster = plan_cluster("clusters/dev", base, head)
    other = Holder("ml-training", "trainer-0", "trainer", 1, NodeName("gpu-node-3"))
    cells = [cell("gpu-node-3", 0, other), cell("gpu-node-3", 1)]
    (waiting,) = waiting_slots(cluster.plan, cells)
    assert waiting.reason.value == "DeviceBusy"
    assert "ml-training/trainer-0" in waiting.detail
    assert waiting_slots(cluster.plan, [cell("gpu-node-3", 0), cell("gpu-node-3", 1)]) == []
    (missing,) = waiting_slots(cluster.plan, [cell("gpu-node-3", 0)])
    assert missing.reason.value == "DeviceMissing"


def test_live_contexts_must_name_their_cluster_when_several_are_planned(repo: Path) -> None:
    cluster = plan_cluster("clusters/dev", {}, {})
    other = plan_cluster("clusters/prod", {}, {})
    assert contexts_for([cluster], "kc", []) == {"clusters/dev": None}
    assert contexts_for([cluster, other], None, ["dev=kind-dev"]) == {"clusters/dev": "kind-dev"}
    with pytest.raises(ValueError, match="name each one's context"):
        contexts_for([cluster, other], "kc", [])
    with pytest.raises(ValueError, match="no cluster directory"):
        contexts_for([cluster], None, ["staging=x"])


def test_each_cluster_reads_the_kubeconfig_context_of_its_own_name(repo: Path) -> None:
    """A fleet names contexts after its cluster directories: no --context needed; one given
    with CLUSTER= still wins."""
    dev = plan_cluster("clusters/dev", {}, {})
    prod = plan_cluster("clusters/prod", {}, {})
    both = ["dev", "prod", "other"]
    assert contexts_for([dev, prod], "kc", [], both) == {
        "clusters/dev": "dev",
        "clusters/prod": "prod",
    }
    assert contexts_for([dev, prod], "kc", ["prod=other"], both) == {
        "clusters/dev": "dev",
        "clusters/prod": "other",
    }
    # A bare context serves the one cluster that has no context of its name.
    assert contexts_for([dev, prod], "kc", ["other"], ["dev"]) == {
        "clusters/dev": "dev",
        "clusters/prod": "other",
    }
    # As with --context dev=...: the cluster without a context is planned offline only.
    assert contexts_for([dev, prod], "kc", [], ["dev"]) == {"clusters/dev": "dev"}
    with pytest.raises(ValueError, match="name each one's context"):
        contexts_for([dev, prod], "kc", [], ["staging"])


def test_an_unreadable_revision_is_an_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "nope", "--repo", str(repo), "--detailed-exitcode"])
    assert code == 1
    assert "error: unknown revision 'nope'" in capsys.readouterr().out
