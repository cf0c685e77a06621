"""Several clusters in one view (gpuplace/fleet.py, `gpuplace gpus|status|explain --context a
--context b`): which contexts are read, one reading each where a cluster that cannot be read says
why, and one grid with a CLUSTER column."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
import yaml

from gpuplace import cli, fleet
from gpuplace.occupancy import Filters, fleet_grid, render, render_fleet
from kubeio.client import Kube
from kubeio.errors import APITransportError
from placement.inventory import GpuDevice, NodeInventory
from placement.occupancy import GpuCell, Holder, occupancy
from placement.types import GpuUuid, NodeName


def cells(node: str, count: int, held: int | None = None) -> list[GpuCell]:
    name = NodeName(node)
    devices = tuple(GpuDevice(i, GpuUuid(f"GPU-{node}-{i}"), "H100") for i in range(count))
    holders = (
        [] if held is None else [Holder("ml", "web-0", "llm", 0, name, (f"GPU-{node}-{held}",))]
    )
    return occupancy({name: NodeInventory(name, devices)}, holders)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(path: Path, servers: dict[str, str]) -> Path:
    """A kubeconfig with one context (and cluster) per name, each to its server."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": n, "cluster": {"server": s, "insecure-skip-tls-verify": True}}
                    for n, s in servers.items()
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in servers],
                "current-context": next(iter(servers)),
            }
        )
    )
    return path


def test_contexts_are_the_given_ones_once_each_or_every_one_of_the_kubeconfig(
    tmp_path: Path,
) -> None:
    config = str(kubeconfig(tmp_path / "k", {"a": "https://a", "b": "https://b", "c": "https://c"}))
    assert fleet.contexts_to_read(config, ["b", "a", "b"], all_contexts=False) == ["b", "a"]
    assert fleet.contexts_to_read(config, [], all_contexts=True) == ["a", "b", "c"]
    assert fleet.contexts_to_read(config, [], all_contexts=False) == [None]
    with pytest.raises(ValueError, match="no context"):
        fleet.contexts_to_read(str(tmp_path / "missing"), [], all_contexts=True)


def test_each_cluster_is_read_at_once_and_one_that_fails_does_not_fail_the_others(
    tmp_path: Path,
) -> None:
    config = str(kubeconfig(tmp_path / "k", {"a": "https://a:1", "b": "https://b:2"}))
    both_started = threading.Barrier(2, timeout=30)

    def read(kube: Kube) -> str:
        both_started.wait()  # only returns when the two reads run at the same time
        if kube.host.endswith(":2"):
            raise APITransportError(0, "Transport", "connection refused")
        return kube.host

    readings = fleet.read_all(config, ["a", "b", "nosuch"], read)
    assert [r.cluster for r in readings] == ["a", "b", "nosuch"]
    a, b, nosuch = readings
    assert a.reachable and a.value == "https://a:1"
    assert not b.reachable and "connection refused" in b.error and b.value is None
    assert not nosuch.reachable and "nosuch" in nosuch.error


def test_the_fleet_grid_has_a_cluster_column_and_an_unreachable_row() -> None:
    readings: list[fleet.Reading[list[GpuCell]]] = [
        fleet.Reading("east", cells("gpu-1", 2, held=1)),
        fleet.Reading("west", error="connection refused"),
        fleet.Reading("north", []),
    ]
    lines = fleet_grid(readings).splitlines()
    assert lines[0].split() == ["CLUSTER", "NODE", "GPU0", "GPU1"]
    assert lines[1].split() == ["east", "gpu-1", "free", "llm#0"]
    assert lines[2].split() == ["west", "UNREACHABLE"]
    assert lines[3].split() == ["north", "(no", "GPUs)"]
    assert "east: 1 held, 1 free GPU(s)" in lines
    assert "west: unreachable: connection refused" in lines
    assert "east: gpu-1 GPU1 GPU-gpu-1-1  held  held by ml/web-0 (ml/llm#0)" in lines


def test_fleet_json_is_each_clusters_own_json_with_its_name() -> None:
    east, west = cells("gpu-1", 2, held=0), cells("gpu-1", 4)  # same node name, two clusters
    readings: list[fleet.Reading[list[GpuCell]]] = [
        fleet.Reading("east", east),
        fleet.Reading("west", west),
        fleet.Reading("south", error="timed out"),
    ]
    data = json.loads(render_fleet(readings, "json", Filters(), colour=False))
    assert yaml.safe_load(render_fleet(readings, "yaml", Filters(), colour=False)) == data
    for name, own in (("east", east), ("west", west)):
        alone = json.loads(render(own, "json", Filters(), colour=False))
        mine = [{k: v for k, v in g.items() if k != "cluster"} for g in data["gpus"]]
        assert [g for g, c in zip(mine, data["gpus"], strict=True) if c["cluster"] == name] == (
            alone["gpus"]
        )
        entry = next(c for c in data["clusters"] if c["cluster"] == name)
        assert entry["reachable"] and entry["summary"] == alone["summary"]
    assert data["clusters"][2] == {
        "cluster": "south",
        "reachable": False,
        "error": "timed out",
        "summary": None,
    }


@pytest.mark.parametrize(
    ("argv", "header"),
    [
        (["gpus"], "CLUSTER  NODE"),
        (["status"], "CLUSTER  MAP"),
        (["status", "--gpus"], "CLUSTER  NODE"),
    ],
)
def test_commands_show_every_cluster_that_cannot_be_read_as_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], header: str
) -> None:
    servers = {"a": f"https://127.0.0.1:{closed_port()}", "b": f"https://127.0.0.1:{closed_port()}"}
    config = str(kubeconfig(tmp_path / "k", servers))
    code = cli.main([*argv, "--kubeconfig", config, "--context", "a", "--context", "b"])
    out = capsys.readouterr().out
    assert code == 0
    assert header in out
    rows = [line.split()[:2] for line in out.splitlines()]
    assert ["a", "UNREACHABLE"] in rows and ["b", "UNREACHABLE"] in rows
    assert "a: unreachable: " in out and "b: unreachable: " in out


def test_explain_across_clusters_says_where_it_could_not_look(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    servers = {"a": f"https://127.0.0.1:{closed_port()}", "b": f"https://127.0.0.1:{closed_port()}"}
    config = str(kubeconfig(tmp_path / "k", servers))
    code = cli.main(["explain", "ml/web-0", "--kubeconfig", config, "--all-contexts", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1  # no cluster that answered has the pod
    assert [(c["cluster"], c["reachable"], c["found"]) for c in data["clusters"]] == [
        ("a", False, False),
        ("b", False, False),
    ]


def test_one_context_keeps_the_single_cluster_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One --context is not a fleet: no CLUSTER column, and an unreachable cluster is an error
    as before (the command fails)."""
    config = str(kubeconfig(tmp_path / "k", {"a": f"https://127.0.0.1:{closed_port()}"}))
    with pytest.raises(APITransportError):
        cli.main(["gpus", "--kubeconfig", config, "--context", "a"])
    assert "CLUSTER" not in capsys.readouterr().out
