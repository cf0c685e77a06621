"""`python -m bench.placement --budget S`, small: a budget spent before the first repeat leaves
the repeat out and still prints the table, the ceiling search's figures in it and the repeat's
reading "not run"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.placement import main


@pytest.mark.slow
def test_a_spent_budget_leaves_the_repeat_out_and_the_table_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--nodes", "13", "--pods", "100", "--repeats", "1", "--workdir", str(tmp_path)]
    assert main([*argv, "--budget", "0"]) == 0
    captured = capsys.readouterr()
    rows = {
        cells[2].strip(): (cells[3].strip(), cells[5].strip())
        for line in captured.out.splitlines()
        if len(cells := line.split("|")) > 5
    }
    searched = [v for k, (v, _) in rows.items() if k.startswith("ceiling search: 1 process x ")]
    assert len(searched) == 4 and all(v.endswith(" pods/s") for v in searched)
    assert rows["gpuplace drain / ceiling"] == ("not run", "")
    assert rows["creates/s through the webhook / without it"] == ("not run", "")
    assert "budget of 0 s spent: repeat 1 and what follows not run" in captured.err
    assert "gpuplace burst:" not in captured.err
