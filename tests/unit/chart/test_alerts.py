"""The chart's alert rules and dashboard (global.prometheusRule, global.grafanaDashboard), as the
chart renders them (not a copy): `promtool check rules` and `promtool test rules` with a scenario
per alert, and every dashboard query parsed by promtool. promtool is Debian's prometheus package,
installed by `make unit`/`make test`; a missing promtool fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chartkit import Scenario, one, render

CONTROLLER = 'job="gpuplace-controller"'
WEBHOOK = 'job="gpuplace-webhook"'
MONITORING = Scenario(
    "alerts",
    {"global": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}},
)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found is not None, "promtool not found: make unit installs Debian's prometheus"
    return found


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(MONITORING, tmp_path_factory.mktemp("alerts"))


@pytest.fixture(scope="module")
def rules_file(objects: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    rule = one(objects, "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_nothing_is_rendered_by_default(tmp_path: Path) -> None:
    kinds = {o["kind"] for o in render(Scenario("default"), tmp_path)}
    assert "PrometheusRule" not in kinds
    names = {o["metadata"]["name"] for o in render(Scenario("default"), tmp_path)}
    assert "gpuplace-dashboard" not in names


def test_the_rules_pass_promtool_check(rules_file: Path) -> None:
    result = run_promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


#: (alert, input series, minute at which it must fire, its labels, its summary as rendered)
SCENARIOS: list[tuple[str, list[dict[str, str]], int, dict[str, str], str]] = [
    (
        "GpuplaceNoLeader",
        [series("gpuplace_leader", f'{CONTROLLER}, instance="a"', "1 1 0x10")],
        10,
        {"severity": "critical"},
        "No gpuplace controller replica leads in gpuplace-system",
    ),
    (
        "GpuplaceSlotsBlocked",
        [series("gpuplace_slots", f'{CONTROLLER}, state="blocked"', "2x30")],
        20,
        {"severity": "warning"},
        "2 placement slot(s) blocked for 15m",
    ),
    (
        "GpuplacePodsDrifted",
        [series("gpuplace_drifted_pods", CONTROLLER, "1x40")],
        35,
        {"severity": "warning"},
        "1 bound pod(s) no longer where their map places them",
    ),
    (
        "GpuplaceHeldGpuDegraded",
        [
            series(
                "gpuplace_gpu_info",
                f'{CONTROLLER}, Hostname="n1", gpu="3", UUID="GPU-3", healthy="false"',
                "1x10",
            ),
            series(
                "gpuplace_gpu_holder",
                f'{CONTROLLER}, Hostname="n1", gpu="3", UUID="GPU-3", namespace="ml", '
                'pod="web-3", map="llm", index="3"',
                "1x10",
            ),
        ],
        8,
        {
            "severity": "critical",
            "Hostname": "n1",
            "gpu": "3",
            "UUID": "GPU-3",
            "namespace": "ml",
            "pod": "web-3",
            "map": "llm",
            "index": "3",
        },
        "GPU 3 of n1 is unhealthy and held by ml/web-3",
    ),
    (
        "GpuplaceDeclaredGpuDegraded",
        [
            series(
                "gpuplace_gpu_info",
                f'{CONTROLLER}, Hostname="n1", gpu="2", UUID="GPU-2", healthy="false"',
                "1x10",
            ),
            series(
                "gpuplace_gpu_declared",
                f'{CONTROLLER}, Hostname="n1", gpu="2", UUID="GPU-2", namespace="ml", '
                'map="llm", index="2"',
                "1x10",
            ),
        ],
        8,
        {
            "severity": "warning",
            "Hostname": "n1",
            "gpu": "2",
            "UUID": "GPU-2",
            "namespace": "ml",
            "map": "llm",
            "index": "2",
        },
        "GPU 2 of n1, declared by ml/llm index 2, is unhealthy",
    ),
    (
        "GpuplaceBindingsUnverifiable",
        [series("gpuplace_unverifiable_bindings", CONTROLLER, "1x10")],
        8,
        {"severity": "critical"},
        "1 pod(s) bound under a binding key the ring no longer holds",
    ),
    (
        "GpuplaceForgedBindings",
        [series("gpuplace_unverified_bindings_total", CONTROLLER, "0 0 1 1 1")],
        3,
        {"severity": "warning"},
        "Pods carry gpuplace.io/* binding annotations the binder did not sign",
    ),
    (
        "GpuplaceWebhookErrors",
        [
            series(
                "gpuplace_webhook_decisions_total",
                f'{WEBHOOK}, operation="CREATE", result="malformed"',
                "0+1x20",
            )
        ],
        12,
        {"severity": "warning"},
        "The gpuplace webhook fails admission calls",
    ),
]

#: Healthy series: no alert may fire on them.
HEALTHY = [
    series("gpuplace_leader", f'{CONTROLLER}, instance="a"', "1x30"),
    series("gpuplace_leader", f'{CONTROLLER}, instance="b"', "0x30"),
    series("gpuplace_slots", f'{CONTROLLER}, state="blocked"', "0x30"),
    series("gpuplace_drifted_pods", CONTROLLER, "0x30"),
    series("gpuplace_unverifiable_bindings", CONTROLLER, "0x30"),
    series("gpuplace_unverified_bindings_total", CONTROLLER, "0x30"),
    series(
        "gpuplace_gpu_info",
        f'{CONTROLLER}, Hostname="n1", gpu="0", UUID="GPU-0", healthy="true"',
        "1x30",
    ),
    series(
        "gpuplace_gpu_holder",
        f'{CONTROLLER}, Hostname="n1", gpu="0", UUID="GPU-0", namespace="ml", pod="w-0", '
        'map="llm", index="0"',
        "1x30",
    ),
    series(
        "gpuplace_gpu_declared",
        f'{CONTROLLER}, Hostname="n1", gpu="0", UUID="GPU-0", namespace="ml", map="llm", index="0"',
        "1x30",
    ),
    series(
        "gpuplace_webhook_decisions_total",
        f'{WEBHOOK}, operation="CREATE", result="patched"',
        "0+5x30",
    ),
]


def test_each_alert_fires_on_its_condition_and_none_on_a_healthy_cluster(
    rules_file: Path, tmp_path: Path
) -> None:
    rule = yaml.safe_load(rules_file.read_text())["groups"][0]["rules"]
    descriptions = {r["alert"]: r["annotations"]["description"] for r in rule}
    tests: list[dict[str, Any]] = []
    for alert, inputs, minute, labels, summary in SCENARIOS:
        tests.append(
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": f"{minute}m",
                        "alertname": alert,
                        "exp_alerts": [
                            {
                                "exp_labels": {"alertname": alert, **labels},
                                "exp_annotations": {
                                    "summary": summary,
                                    "description": descriptions[alert],
                                },
                            }
                        ],
                    }
                ],
            }
        )
    tests.append(
        {
            "interval": "1m",
            "input_series": HEALTHY,
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": r["alert"], "exp_alerts": []} for r in rule
            ],
        }
    )
    assert {r["alert"] for r in rule} == {s[0] for s in SCENARIOS}
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "tests": tests}))
    result = run_promtool("test", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(objects, "ConfigMap", "gpuplace-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    data: dict[str, Any] = json.loads(cm["data"]["gpuplace.json"])
    return data


def dashboard_queries(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in data["panels"] for t in p["targets"]]


def test_the_dashboard_is_grafana_json_whose_queries_parse(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    data = dashboard(objects)
    assert data["uid"] == "gpuplace" and data["schemaVersion"] >= 30
    assert [v["name"] for v in data["templating"]["list"]] == ["datasource", "cluster"]
    cluster = data["templating"]["list"][1]
    # Every cluster by default; a single cluster without the label matches ".*" too.
    assert cluster["includeAll"] and cluster["multi"] and cluster["allValue"] == ".*"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
    for title, expr in dashboard_queries(data):
        # Every series selected by the Cluster variable, and no aggregation merges two clusters.
        selectors = re.findall(r"gpuplace_\w+(\{[^}]*\})?", expr)
        assert selectors and all('cluster=~"$cluster"' in sel for sel in selectors), title
        groups = re.findall(r"\b(?:sum|max|count|min|avg)\b( by \(([^)]*)\))?", expr)
        assert all("cluster" in labels for _, labels in groups), (title, expr)
    titles = " ".join(p["title"] for p in data["panels"]).lower()
    for topic in ("holds", "wait", "drift", "degraded", "bind latency", "webhook", "leader"):
        assert topic in titles, topic
    # promtool parses PromQL only inside rule files: each query as a recording rule.
    records = [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, (_title, expr) in enumerate(dashboard_queries(data))
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


FLEET = Scenario(
    "alerts-fleet",
    {
        "global": {
            "cluster": "east",
            "prometheusRule": {"enabled": True},
            "serviceMonitor": {"enabled": True},
        }
    },
)


def with_cluster(inputs: list[dict[str, str]], cluster: str) -> list[dict[str, str]]:
    return [
        {**s, "series": s["series"].replace("{", f'{{cluster="{cluster}", ', 1)} for s in inputs
    ]


def test_in_a_fleet_every_series_is_labelled_and_every_alert_names_its_cluster(
    tmp_path: Path,
) -> None:
    """global.cluster: the ServiceMonitors add the label `cluster`; the rules select that
    cluster's series only (one Prometheus may scrape several clusters) and keep the label, and
    each summary ends with the cluster."""
    objects = render(FLEET, tmp_path)
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["relabelings"][-1] == {
            "action": "replace",
            "targetLabel": "cluster",
            "replacement": "east",
        }
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": one(objects, "PrometheusRule")["spec"]["groups"]}))
    assert run_promtool("check", "rules", str(rules)).returncode == 0
    tests: list[dict[str, Any]] = []
    for alert, inputs, minute, labels, summary in SCENARIOS:
        east = {"alertname": alert, **labels, "cluster": "east"}
        tests.append(
            {
                "interval": "1m",
                # The same trouble in another cluster scraped by the same Prometheus: not ours.
                "input_series": with_cluster(inputs, "east")
                + [
                    {**s, "series": s["series"].replace("east", "west")}
                    for s in with_cluster(inputs, "east")
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{minute}m",
                        "alertname": alert,
                        "exp_alerts": [
                            {
                                "exp_labels": east,
                                "exp_annotations": {
                                    "summary": f"{summary} (cluster east)",
                                    "description": next(
                                        r["annotations"]["description"]
                                        for r in yaml.safe_load(rules.read_text())["groups"][0][
                                            "rules"
                                        ]
                                        if r["alert"] == alert
                                    ),
                                },
                            }
                        ],
                    }
                ],
            }
        )
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": tests}))
    result = run_promtool("test", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
