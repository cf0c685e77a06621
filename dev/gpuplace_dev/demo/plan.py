"""`gpuplace plan` in the demo, as a CI job runs it on a pull request: before a change is committed
(the working tree against HEAD), against the demo cluster, with the token of a ServiceAccount bound
to the chart's read-only ClusterRole gpuplace-plan."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.demo.gitops import run_cli
from gpuplace_dev.localcluster import LocalCluster, chart
from kubeio.client import Kube
from kubeio.paths import NAMESPACES, SERVICE_ACCOUNTS, Resource

CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False
)

#: The chart's ClusterRole (release gpuplace) and the CI job's identity, as docs/reviewing.md has it.
ROLE = "gpuplace-plan"
NAMESPACE = "ci"
ACCOUNT = "gpuplace-plan"
#: The kubeconfig context of the demo cluster, the repository's cluster directory clusters/dev.
CONTEXT = "gpuplace-plan@dev"
#: The cluster directories the ApplicationSet generates Applications of.
CLUSTERS = "clusters/*"


def read_only_identity(
    cluster: LocalCluster, kube: Kube, directory: Path, *, chart_installed: bool
) -> Path:
    """Writes into `directory` a kubeconfig of ServiceAccount ci/gpuplace-plan, bound to the
    ClusterRole gpuplace-plan (the installed chart's, else the chart's rendered and created here),
    with a token of an hour; returns its path."""
    if not chart_installed:
        kube.create(CLUSTER_ROLES.collection(), chart.plan_cluster_role())
    kube.create(
        NAMESPACES.collection(),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    kube.create(
        SERVICE_ACCOUNTS.collection(NAMESPACE),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}},
    )
    kube.create(
        CLUSTER_ROLE_BINDINGS.collection(),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
        },
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    token = kube.create(SERVICE_ACCOUNTS.item(ACCOUNT, NAMESPACE, "token"), request)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_file),
                },
            }
        ],
        "users": [{"name": ACCOUNT, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": "dev", "user": ACCOUNT}}],
        "current-context": CONTEXT,
    }
    path = directory / "plan.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class PlanRun:
    """One `gpuplace plan` run: what it printed, its exit status, and its JSON and SARIF outputs
    (empty when it wrote none)."""

    command: str
    returncode: int
    output: str
    report: dict[str, Any] = field(default_factory=dict)
    sarif: dict[str, Any] = field(default_factory=dict)

    def _live(self) -> list[dict[str, Any]]:
        return [c["live"] for c in self.report.get("clusters", []) if c.get("live")]

    @property
    def moving(self) -> set[str]:
        """The running pods whose slot moves elsewhere (`namespace/name`)."""
        return {
            d["pod"]
            for live in self._live()
            for d in live["drifting"]
            if d["reason"] == "SlotMoved"
        }

    @property
    def drifting(self) -> set[str]:
        """Every running pod the change moves or leaves without a slot."""
        return {d["pod"] for live in self._live() for d in live["drifting"]}

    @property
    def waiting(self) -> list[dict[str, Any]]:
        return [w for live in self._live() for w in live["waiting"]]

    @property
    def live_errors(self) -> list[str]:
        return [live["error"] for live in self._live() if live.get("error")]

    @property
    def read_live(self) -> bool:
        return bool(self._live())

    def sarif_locations(self) -> set[tuple[str, int, int]]:
        """(file, line, column) of each SARIF result."""
        out = set()
        for run in self.sarif.get("runs", []):
            for result in run.get("results", []):
                for location in result.get("locations", []):
                    physical = location["physicalLocation"]
                    region = physical.get("region", {})
                    out.add(
                        (
                            physical["artifactLocation"]["uri"],
                            int(region.get("startLine", 0)),
                            int(region.get("startColumn", 0)),
                        )
                    )
        return out


def run(repo: Path, directory: Path, *options: str) -> PlanRun:
    """`gpuplace plan HEAD` in `repo` (its working tree, the change before its commit), over the
    cluster directories `clusters/*`, with --detailed-exitcode, `options`, and JSON and SARIF
    written into `directory` as well."""
    reports = directory / "plan.json", directory / "plan.sarif"
    for report in reports:
        report.unlink(missing_ok=True)
    shown = ["plan", "HEAD", f"--clusters={CLUSTERS}", "--detailed-exitcode", *options]
    outputs = [f"--out=json={reports[0]}", f"--out=sarif={reports[1]}"]
    result = run_cli(*shown, f"--repo={repo}", *outputs)
    loaded = [json.loads(r.read_text()) if r.is_file() else {} for r in reports]
    return PlanRun(
        "gpuplace " + shlex.join(shown),
        result.returncode,
        result.stdout + result.stderr,
        loaded[0],
        loaded[1],
    )


def position(text: str, marker: str) -> tuple[int, int]:
    """The line and column (1-based) where `marker` first occurs in `text`."""
    offset = text.index(marker)
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1
