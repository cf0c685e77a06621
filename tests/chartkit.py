"""Helpers for the chart, ArgoCD and preflight tests: the tools cache, `helm`, chart scenarios.

`tools_dir()` runs hack/build-tools.sh (which skips what is cached) once per process and returns
the directory with bin/helm and crds/<name>/*.yaml.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.localcluster.tools import helm_env

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpuplace"
ARGOCD = REPO / "argocd"
RELEASE = "gpuplace"
NAMESPACE = "gpuplace-system"
INVENTORY = "gpuplace-inventory"


@functools.cache
def tools_dir() -> Path:
    result = subprocess.run(
        [str(REPO / "hack" / "build-tools.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/build-tools.sh failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def helm_binary() -> Path:
    return tools_dir() / "bin" / "helm"


def crd_files(name: str) -> list[Path]:
    return sorted((tools_dir() / "crds" / name).glob("*.yaml"))


def helm(
    *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs helm with a private home so no user configuration leaks into the test."""
    tools_dir()  # built if missing
    environment = {**helm_env(), **(env or {})}
    result = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=environment, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


@dataclass(frozen=True)
class Scenario:
    """A set of chart values (one switch or a combination) the chart must render and pass with."""

    name: str
    values: Mapping[str, Any] = field(default_factory=dict)

    def values_args(self, tmp: Path) -> list[str]:
        if not self.values:
            return []
        path = tmp / f"values-{self.name}.yaml"
        path.write_text(yaml.safe_dump(dict(self.values)))
        return ["--values", str(path)]

    def __str__(self) -> str:
        return self.name


SCENARIOS = (
    Scenario("default"),
    Scenario("cert-manager", {"webhook": {"tls": {"mode": "certManager"}}}),
    Scenario(
        "cert-manager-cluster-issuer",
        {
            "webhook": {
                "tls": {
                    "mode": "certManager",
                    "certManager": {
                        "issuerRef": {
                            "name": "corp-ca",
                            "kind": "ClusterIssuer",
                            "group": "cert-manager.io",
                        }
                    },
                }
            }
        },
    ),
    Scenario("legacy-off", {"global": {"legacy": {"enabled": False}}}),
    Scenario(
        "legacy-opted-in-namespaces",
        {
            "global": {
                "legacy": {"namespaceSelector": {"matchLabels": {"gpuplace.io/legacy": "enabled"}}}
            }
        },
    ),
    Scenario(
        "service-monitor",
        {"global": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    ),
    Scenario(
        "monitoring",
        {
            "global": {
                "serviceMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                "grafanaDashboard": {"enabled": True},
            }
        },
    ),
    Scenario("web-view", {"controller": {"web": {"enabled": True, "authenticate": True}}}),
    Scenario("web-view-port-forward", {"controller": {"web": {"enabled": True}}}),
    Scenario(
        "network-policy",
        {
            "networkPolicy": {
                "enabled": True,
                "webhook": {"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
                "metrics": {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                            },
                            "podSelector": {"matchLabels": {"app": "prometheus"}},
                        }
                    ]
                },
                "web": {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "ingress"}
                            }
                        }
                    ]
                },
            },
            "controller": {"web": {"enabled": True, "authenticate": True}},
        },
    ),
    Scenario(
        "network-policy-closed",
        {
            "networkPolicy": {
                "enabled": True,
                "webhook": {
                    "from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.9.0/24"]}}]
                },
            },
            "controller": {"web": {"enabled": True}},
        },
    ),
    Scenario("agent-off", {"agent": {"enabled": False}}),
    Scenario("dra", {"global": {"enforcement": {"mode": "dra"}}}),
    Scenario("nvml-runtime", {"agent": {"nvml": {"hostPath": ""}, "runtimeClassName": "nvidia"}}),
    Scenario(
        "nvml-directory",
        {
            "agent": {
                "nvml": {
                    "hostPath": "/home/kubernetes/bin/nvidia/lib64",
                    "hostPathType": "Directory",
                }
            }
        },
    ),
    Scenario("inventory-namespace-external", {"global": {"inventoryNamespace": {"create": False}}}),
    Scenario("crds-managed", {"crds": {"managed": True}}),
    Scenario("configmap-maps-off", {"maps": {"configMaps": {"enabled": False}}}),
    Scenario(
        "production",
        {
            "global": {
                "image": {"digest": "sha256:" + "ab" * 32},
                "imagePullSecrets": ["regcred"],
                "priorityClassName": "system-cluster-critical",
                "commonLabels": {"team": "platform"},
                "logging": {"level": "debug", "json": False},
            },
            "controller": {
                "replicas": 3,
                "podDisruptionBudget": {"enabled": False, "maxUnavailable": 1},
                "extraArgs": ["--bind-workers=64"],
                "extraEnv": [{"name": "EXTRA", "value": "1"}],
                "tolerations": [
                    {
                        "key": "dedicated",
                        "operator": "Equal",
                        "value": "infra",
                        "effect": "NoSchedule",
                    }
                ],
                "nodeSelector": {"node-role.kubernetes.io/infra": ""},
            },
            "webhook": {
                "replicas": 3,
                "antiAffinity": "hard",
                "timeoutSeconds": 5,
                "excludeNamespaces": ["kube-system", "kube-public"],
            },
            "agent": {"updateStrategy": {"maxUnavailable": 1}},
        },
    ),
)


def render(
    scenario: Scenario, tmp: Path, *extra: str, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the rendered objects, in helm's install order."""
    out = helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        *scenario.values_args(tmp),
        *extra,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render_with_sources(scenario: Scenario, tmp: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(template file name, object) for every rendered object."""
    out = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *scenario.values_args(tmp)
    )
    for chunk in out.stdout.split("\n---\n"):
        source = ""
        for line in chunk.splitlines():
            if line.startswith("# Source: "):
                source = line.removeprefix("# Source: ").rsplit("/", 1)[-1]
                break
        doc = yaml.safe_load(chunk)
        if doc:
            yield source, doc


def find(
    objects: Sequence[dict[str, Any]], kind: str, name: str | None = None
) -> list[dict[str, Any]]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def argocd_documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every object in argocd/*.yaml, with its file."""
    out: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(ARGOCD.glob("*.yaml")):
        out.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def install_crds(cluster: Any, name: str) -> list[str]:
    """Installs the CRDs fetched under crds/<name> (server-side: the full Argo Workflows CRDs are
    too large for the last-applied annotation) and waits until the apiserver serves them."""
    names = []
    for path in crd_files(name):
        cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gpuplace-tests",
            "-f",
            str(path),
            timeout=300,
        )
        names.append(yaml.safe_load(path.read_text())["metadata"]["name"])
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=120s",
        *(f"crd/{n}" for n in names),
        timeout=180,
    )
    return names


def dry_run(cluster: Any, manifest: str) -> Any:
    """`kubectl apply --dry-run=server` with strict field validation: unknown or mistyped fields
    fail, as do objects the apiserver or an admission plugin would refuse."""
    return cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=manifest, check=False
    )
