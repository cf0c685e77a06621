"""charts/gpuplace against the real apiserver: every switch passes `kubectl apply --dry-run=server`,
and the rendered RBAC, applied for real, allows each service account what it needs and refuses the
rest (`kubectl auth can-i --as=system:serviceaccount:...`).

The cert-manager (Certificate, Issuer) and prometheus-operator (ServiceMonitor) CRDs are installed
from their Go modules' sources first (hack/build-tools.sh fetches them), so those switches get the
same server-side check as the rest: schema validation by the real CRDs, not a client-side guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from tests.chartkit import (
    CHART,
    INVENTORY,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    Scenario,
    dry_run,
    helm,
    install_crds,
    render,
)

RBAC_KINDS = {
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
}
WORKLOAD_NS = "chart-rbac-workloads"


@pytest.fixture(scope="module")
def chart_cluster(cluster: LocalCluster) -> LocalCluster:
    install_crds(cluster, "cert-manager")
    install_crds(cluster, "prometheus-operator")
    for namespace in (NAMESPACE, INVENTORY, WORKLOAD_NS):
        cluster.create_namespace(namespace)
    return cluster


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_rendered_chart_passes_server_side_dry_run(
    chart_cluster: LocalCluster, scenario: Scenario, tmp_path: Path
) -> None:
    objects = render(scenario, tmp_path)
    result = dry_run(chart_cluster, yaml.safe_dump_all(objects))
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objects)


def test_server_dry_run_catches_a_broken_object(
    chart_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The check above can fail: a field the apiserver does not know is refused."""
    objects = render(SCENARIOS[0], tmp_path)
    config = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    config["webhooks"][0]["failurPolicy"] = "Fail"
    result = dry_run(chart_cluster, yaml.safe_dump(config))
    assert result.returncode != 0
    assert "failurPolicy" in result.stderr


def test_install_renders_notes(chart_cluster: LocalCluster) -> None:
    # `helm install --dry-run=server` renders NOTES.txt against the real server (kubeVersion
    # constraint included). The inventory namespace already exists here, unowned by helm. So may
    # the binding key Secret, which controllers run by other tests of this session create when
    # the chart has not rendered it: a real install renders it before any controller starts.
    chart_cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/gpuplace-binding-key")
    result = helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=server",
        "--set",
        "global.inventoryNamespace.create=false",
        env={"KUBECONFIG": str(chart_cluster.kubeconfig)},
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "gpuplace 0.1.0 is installed in gpuplace-system." in notes
    assert "legacy mode on" in notes
    assert "kubectl -n gpuplace-inventory get configmaps,leases" in notes
    assert "Grants: until a placement policy exists" in notes  # allow-all is the default
    assert "binding key ring" in notes and "kept by `helm uninstall`" in notes


# ------------------------------------------------------------------------------- RBAC


@pytest.fixture(scope="module")
def rbac(
    chart_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """The chart's RBAC in dra enforcement (the default's plus the controller's DRA rules),
    applied for real; removed again after the module."""
    dra = next(s for s in SCENARIOS if s.name == "dra")
    objects = [o for o in render(dra, tmp_path_factory.mktemp("rbac")) if o["kind"] in RBAC_KINDS]
    manifest = yaml.safe_dump_all(objects)
    chart_cluster.kubectl("apply", "-f", "-", input=manifest)
    yield chart_cluster
    removable = [o for o in objects if o["kind"] != "Namespace"]
    chart_cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        input=yaml.safe_dump_all(removable),
    )


def can_i(cluster: LocalCluster, account: str, *request: str) -> bool:
    user = f"system:serviceaccount:{NAMESPACE}:gpuplace-{account}"
    result = cluster.kubectl("auth", "can-i", *request, f"--as={user}", check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), (result.stdout, result.stderr)
    return answer == "yes"


W = WORKLOAD_NS
ALLOWED: list[tuple[str, ...]] = [
    # controller: source maps everywhere (read, status annotation), the model in gpuplace-system
    ("controller", "watch", "configmaps", "--all-namespaces"),
    ("controller", "list", "configmaps", "--all-namespaces"),
    ("controller", "patch", "configmaps", "-n", W),
    ("controller", "create", "configmaps", "-n", NAMESPACE),
    ("controller", "update", "configmaps/gpuplace-model", "-n", NAMESPACE),
    ("controller", "delete", "configmaps/gpuplace-model-3", "-n", NAMESPACE),
    ("controller", "get", "configmaps", "-n", INVENTORY),
    ("controller", "watch", "leases.coordination.k8s.io", "-n", INVENTORY),
    ("controller", "create", "leases.coordination.k8s.io", "-n", NAMESPACE),
    ("controller", "update", "leases.coordination.k8s.io/gpuplace-controller", "-n", NAMESPACE),
    ("controller", "watch", "pods", "--all-namespaces"),
    ("controller", "create", "pods", "--subresource=binding", "-n", W),
    ("controller", "patch", "pods", "--subresource=status", "-n", W),
    ("controller", "watch", "nodes"),
    ("controller", "create", "events", "-n", W),
    # controller, dra enforcement: the only writer of claim allocations; claim templates per map
    ("controller", "patch", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", W),
    ("controller", "patch", "resourceclaims.resource.k8s.io", "-n", W),
    ("controller", "watch", "resourceclaims.resource.k8s.io", "--all-namespaces"),
    ("controller", "watch", "resourceslices.resource.k8s.io"),
    ("controller", "watch", "devicetaintrules.resource.k8s.io"),
    ("controller", "create", "resourceclaimtemplates.resource.k8s.io", "-n", W),
    ("controller", "delete", "resourceclaimtemplates.resource.k8s.io", "-n", W),
    ("controller", "get", "secrets/gpuplace-binding-key", "-n", NAMESPACE),
    ("controller", "watch", "secrets/gpuplace-binding-key", "-n", NAMESPACE),
    ("controller", "update", "secrets/gpuplace-binding-key", "-n", NAMESPACE),
    # webhook: the model, its CA Secret and its two webhook configurations, by name
    ("webhook", "watch", "configmaps", "-n", NAMESPACE),
    ("webhook", "get", "secrets/gpuplace-webhook-ca", "-n", NAMESPACE),
    ("webhook", "update", "secrets/gpuplace-webhook-ca", "-n", NAMESPACE),
    ("webhook", "patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/gpuplace"),
    ("webhook", "update", "validatingwebhookconfigurations.admissionregistration.k8s.io/gpuplace"),
    ("webhook", "get", "mutatingwebhookconfigurations.admissionregistration.k8s.io/gpuplace"),
    # agent: inventories and heartbeats in gpuplace-inventory; reads the model
    ("agent", "create", "configmaps", "-n", INVENTORY),
    ("agent", "update", "configmaps/gpu-a-01", "-n", INVENTORY),
    ("agent", "patch", "configmaps/gpu-a-01", "-n", INVENTORY),
    ("agent", "create", "leases.coordination.k8s.io", "-n", INVENTORY),
    ("agent", "update", "leases.coordination.k8s.io/gpu-a-01", "-n", INVENTORY),
    ("agent", "watch", "configmaps", "-n", NAMESPACE),
]
# RBAC allows an agent to write every inventory and the controller to patch every ConfigMap; the
# chart's ValidatingAdmissionPolicies narrow both, which `can-i` cannot see: test_least_privilege.py
# checks them with real tokens.
REFUSED: list[tuple[str, ...]] = [
    # controller: no ConfigMap writes outside gpuplace-system beyond the status patch; no pod writes
    ("controller", "create", "configmaps", "-n", W),
    ("controller", "update", "configmaps", "-n", W),
    ("controller", "delete", "configmaps", "-n", W),
    ("controller", "create", "configmaps", "-n", INVENTORY),
    ("controller", "update", "leases.coordination.k8s.io", "-n", INVENTORY),
    ("controller", "create", "pods", "-n", W),
    ("controller", "patch", "pods", "-n", W),
    ("controller", "delete", "pods", "-n", W),
    ("controller", "patch", "nodes"),
    ("controller", "get", "secrets", "-n", NAMESPACE),
    ("controller", "watch", "secrets", "-n", NAMESPACE),
    ("controller", "get", "secrets/gpuplace-webhook-ca", "-n", NAMESPACE),
    ("controller", "create", "secrets", "-n", NAMESPACE),
    ("controller", "delete", "secrets/gpuplace-binding-key", "-n", NAMESPACE),
    ("controller", "create", "pods", "--subresource=eviction", "-n", W),
    ("controller", "create", "resourceclaims.resource.k8s.io", "-n", W),
    ("controller", "delete", "resourceclaims.resource.k8s.io", "-n", W),
    ("controller", "create", "resourceslices.resource.k8s.io"),
    ("controller", "update", "resourceslices.resource.k8s.io"),
    ("controller", "create", "devicetaintrules.resource.k8s.io"),
    # webhook and agent: never a claim allocation
    ("webhook", "patch", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", W),
    ("webhook", "update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", W),
    ("agent", "patch", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", W),
    ("agent", "update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", W),
    ("agent", "create", "resourceslices.resource.k8s.io"),
    # webhook: cannot bind, nor touch other Secrets or configurations, nor write the model
    ("webhook", "create", "pods", "--subresource=binding", "-n", W),
    ("webhook", "patch", "pods", "-n", W),
    ("webhook", "list", "secrets", "-n", NAMESPACE),
    ("webhook", "create", "secrets", "-n", NAMESPACE),
    ("webhook", "get", "secrets/gpuplace-other", "-n", NAMESPACE),
    ("webhook", "update", "configmaps", "-n", NAMESPACE),
    ("webhook", "list", "configmaps", "-n", W),
    ("webhook", "patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/other"),
    ("webhook", "create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("webhook", "delete", "validatingwebhookconfigurations.admissionregistration.k8s.io/gpuplace"),
    # agent: never the model, pods or nodes
    ("agent", "create", "configmaps", "-n", NAMESPACE),
    ("agent", "update", "configmaps/gpuplace-model", "-n", NAMESPACE),
    ("agent", "patch", "configmaps/gpuplace-model-0", "-n", NAMESPACE),
    ("agent", "delete", "configmaps", "-n", NAMESPACE),
    ("agent", "create", "leases.coordination.k8s.io", "-n", NAMESPACE),
    ("agent", "update", "leases.coordination.k8s.io/gpuplace-controller", "-n", NAMESPACE),
    ("agent", "patch", "pods", "-n", W),
    ("agent", "patch", "pods", "--subresource=status", "-n", W),
    ("agent", "create", "pods", "--subresource=binding", "-n", W),
    ("agent", "patch", "nodes"),
    ("agent", "patch", "nodes", "--subresource=status"),
    ("agent", "delete", "configmaps", "-n", INVENTORY),
    ("agent", "list", "configmaps", "-n", W),
    ("agent", "get", "secrets", "-n", NAMESPACE),
]


def _id(check: tuple[str, ...]) -> str:
    return " ".join(
        a for a in check if not a.startswith("-n") and a not in (NAMESPACE, INVENTORY, W)
    ) + (f" in {check[-1]}" if "-n" in check else "")


@pytest.mark.parametrize("check", ALLOWED, ids=_id)
def test_service_account_is_allowed_what_it_needs(
    rbac: LocalCluster, check: tuple[str, ...]
) -> None:
    account, *request = check
    assert can_i(rbac, account, *request), check


@pytest.mark.parametrize("check", REFUSED, ids=_id)
def test_service_account_is_refused_the_rest(rbac: LocalCluster, check: tuple[str, ...]) -> None:
    account, *request = check
    assert not can_i(rbac, account, *request), check


def test_accounts_without_bindings_get_nothing(rbac: LocalCluster) -> None:
    """can-i answers from the chart's bindings, not from something broader."""
    assert not can_i(rbac, "nobody", "watch", "configmaps", "--all-namespaces")
