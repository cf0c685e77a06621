"""`python -m bench.drains`, small: a drain at two binder settings and a ceiling, taking turns on a
cluster of its own, each contender's figures in the table it prints, each drain's leader sampled."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bench.drains import main


@pytest.mark.slow
def test_each_setting_drains_on_its_own_leader_and_is_held_against_the_ceiling(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    before = {k: os.environ.get(k) for k in ("GPUPLACE_BIND_WORKERS",)}
    argv = ["--nodes", "13", "--pods", "100", "--rounds", "1", "--workdir", str(tmp_path)]
    profiles = tmp_path / "profiles"
    argv += ["--profile", str(profiles)]
    assert main([*argv, "--settings", "16,8", "--ceilings", "1x8"]) == 0
    captured = capsys.readouterr()
    rows = {
        cells[2].strip(): cells[3].strip()
        for line in captured.out.splitlines()
        if len(cells := line.split("|")) > 4
    }
    for name in ("drain 16", "drain 8", "ceiling 1x8"):
        assert float(rows[f"{name}: pods/s"].split()[0].replace(",", "")) > 0
        assert f"round 0 {name}: " in captured.err
    assert "drain 8 / ceiling 1x8" in rows
    assert rows["drain 16: binder CPU per pod, first -> last bind"].endswith(" ms")

    def ms(row: str) -> float:
        return float(rows[row].removesuffix(" ms"))

    # the leader's own process alone, beside the binder with any children (it has none)
    binder, own = "binder CPU per pod", "binder's own process CPU per pod"
    window = "first -> last bind"
    assert ms(f"drain 16: {own}, {window}") > 0 and ms(f"drain 16: {binder}, {window}") > 0
    # each drain's leader was started with its setting, in that order
    logs = "".join(p.read_text() for p in tmp_path.rglob("controller.log"))
    started = re.findall(r"starting; .*; (\d+) Bindings in flight from (.*)", logs)
    assert started[-2:] == [("16", "its request loop"), ("8", "its request loop")]
    # each drain's leader was sampled: a profile of collapsed stacks for each drain
    sampled = sorted(profiles.glob("controller-drain-*.txt"))
    assert len(sampled) == 2
    for profile in sampled:
        assert any(line.rpartition(" ")[2].isdigit() for line in profile.read_text().splitlines())
    after = {k: os.environ.get(k) for k in before}
    assert after == before  # the settings do not outlive the bench


@pytest.mark.slow
def test_an_aged_cluster_drains_again_after_more_pods_came_and_went(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--nodes", "13", "--pods", "100", "--rounds", "1", "--workdir", str(tmp_path)]
    assert main([*argv, "--settings", "16", "--ceilings", "1x8", "--age", "150"]) == 0
    captured = capsys.readouterr()
    rows = {
        (cells[1].strip(), cells[2].strip()): cells[3].strip()
        for line in captured.out.splitlines()
        if len(cells := line.split("|")) > 4
    }
    label = "drains 13 nodes x 8, 100 pods"
    for phase in ("fresh cluster", "after 150 more pods"):
        assert float(rows[(f"{label}, {phase}", "drain 16 / ceiling 1x8")].split()[0]) > 0
        assert f"round 0 ({phase}) drain 16: " in captured.err
    # two runs of the minimal client put 200 pods through between the phases
    aging = re.findall(r"aging: ([\d,]+) of 150 pods, ceiling 1x8: ([\d,]+) pods/s", captured.err)
    assert [done for done, _ in aging] == ["100", "200"]
    # what etcd holds at the start of each phase: a database of some size, more writes later
    stored = re.findall(r"etcd's database ([\d,]+) MiB at revision ([\d,]+); ", captured.err)
    assert len(stored) == 2
    assert all(int(size.replace(",", "")) > 0 for size, _ in stored)
    fresh, aged = (int(revision.replace(",", "")) for _, revision in stored)
    assert aged > fresh + 3 * 200  # each aging pod: created, bound, deleted at least
