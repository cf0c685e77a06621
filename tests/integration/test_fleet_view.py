"""Two real control planes seen as one fleet: `gpuplace gpus|status --context east --context
west` reads both at once into one table with a CLUSTER column, agrees with each cluster's own
view, and shows a cluster whose apiserver has stopped as unreachable beside the other's rows.
Each cluster runs its own controller, which places only the pods of its own cluster, on its own
nodes, against its own inventories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.fleet import fleet_kubeconfig
from tests.integration.controllerkit import (
    apply_map,
    create_system_namespaces,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    gpu_uuid,
    map_yaml,
    running_controller,
    statefulset,
    unique,
    wait_for_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def west(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A second control plane of its own: etcd, apiserver, controller manager, kwok."""
    with LocalCluster(tmp_path_factory.mktemp("west")) as local:
        create_system_namespaces(local)
        yield local


def gpuplace(*argv: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "NO_COLOR": "1"},
    ).stdout


def test_one_view_of_two_clusters_each_placed_by_its_own_controller(
    cluster: LocalCluster, west: LocalCluster, tmp_path: Path
) -> None:
    fleet = {"east": cluster, "west": west}
    config = str(fleet_kubeconfig(tmp_path / "fleet.kubeconfig", fleet))
    nodes = {name: gpu_nodes(c, unique(f"fl-{name}"), 1, gpus=4)[0] for name, c in fleet.items()}
    only = [f"--node={n}" for n in nodes.values()]
    with (
        running_controller(cluster, prefix="east"),
        running_controller(west, prefix="west"),
        fresh_namespace(cluster, "fleet") as east_ns,
        fresh_namespace(west, "fleet") as west_ns,
    ):
        namespaces = {"east": east_ns, "west": west_ns}
        # Each cluster's map names its own node only: the other cluster has no such node.
        declared = {"east": [(0, nodes["east"], [1]), (1, nodes["east"], [2, 3])]}
        declared["west"] = [(0, nodes["west"], [0])]
        for name, c in fleet.items():
            ns = namespaces[name]
            apply_map(c, ns, "llm", map_yaml(ns, "llm", declared[name]))
            create_workload(c, statefulset(ns, "web", "llm", len(declared[name])))
        for name, c in fleet.items():
            pods = wait_for_bound(c, namespaces[name], len(declared[name]), f"{name} bound")
            for index, node, devices in declared[name]:
                pod = pods[f"web-{index}"]
                assert pod["spec"]["nodeName"] == node
                uuids = ",".join(gpu_uuid(node, d) for d in devices)
                assert pod["metadata"]["annotations"]["gpuplace.io/devices"] == uuids

        both = json.loads(
            gpuplace(
                "gpus",
                "--kubeconfig",
                config,
                "--context=east",
                "--context=west",
                "-o",
                "json",
                *only,
            )
        )
        assert [(c["cluster"], c["reachable"]) for c in both["clusters"]] == [
            ("east", True),
            ("west", True),
        ]
        for name, c in fleet.items():
            own = json.loads(gpuplace("gpus", f"--kubeconfig={c.kubeconfig}", "-o", "json", *only))
            mine = [
                {k: v for k, v in g.items() if k != "cluster"}
                for g in both["gpus"]
                if g["cluster"] == name
            ]
            assert mine == own["gpus"], name
            assert own["gpus"] and {g["node"] for g in own["gpus"]} == {nodes[name]}
            held = sorted(g["index"] for g in own["gpus"] if g["state"] == "held")
            assert held == sorted(d for _, _, devs in declared[name] for d in devs)

        grid = gpuplace("gpus", "--kubeconfig", config, "--all-contexts", *only).splitlines()
        assert grid[0].split()[:2] == ["CLUSTER", "NODE"]
        assert grid[1].split()[:3] == ["east", nodes["east"], "free"]
        assert grid[2].split()[:3] == ["west", nodes["west"], "llm#0"]

        # `gpuplace plan` reads each cluster directory against the context of its name.
        root = tmp_path / "repo"
        repo = git.Repo.init(root, initial_branch="main")
        for message, moved in (("before", False), ("after", True)):
            for name in fleet:
                ns, (first, *rest) = namespaces[name], declared[name]
                index, node, devices = first
                if moved:  # slot 0 onto the GPU after its own: its running pod would drift
                    first = (index, node, [max(d for _, _, ds in declared[name] for d in ds) + 1])
                directory = root / "clusters" / name
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "llm.yaml").write_text(map_yaml(ns, "llm", [first, *rest]))
                (directory / "kustomization.yaml").write_text(
                    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    "resources: [llm.yaml]\n"
                )
            repo.git.add(A=True)
            repo.index.commit(message)
        repo.close()
        planned = json.loads(
            gpuplace(
                "plan",
                "HEAD~1",
                "HEAD",
                "--repo",
                str(root),
                "--kubeconfig",
                config,
                "--format",
                "json",
            )
        )
        drifting = {
            c["cluster"]: [d["pod"] for d in c["live"]["drifting"]] for c in planned["clusters"]
        }
        assert drifting == {"east": [f"{east_ns}/web-0"], "west": [f"{west_ns}/web-0"]}

        status = gpuplace("status", "--kubeconfig", config, "--context=east", "--context=west")
        rows = [line.split()[:3] for line in status.splitlines()]
        assert ["east", f"{east_ns}/llm", "Valid"] in rows
        assert ["west", f"{west_ns}/llm", "Valid"] in rows

    west.stop_apiserver()
    lines = gpuplace(
        "gpus", "--kubeconfig", config, "--context=east", "--context=west", *only
    ).splitlines()
    assert lines[1].split()[:2] == ["east", nodes["east"]]
    assert lines[2].split() == ["west", "UNREACHABLE"]
    assert any(line.startswith("west: unreachable: ") for line in lines)
