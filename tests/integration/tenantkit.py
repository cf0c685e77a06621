"""A hostile tenant: a ServiceAccount with only the `edit` ClusterRole, bound in its own namespace,
driving the pinned kubectl with its own token (no admin certificate anywhere in its kubeconfig)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gpuplace_dev.localcluster import LocalCluster
from tests.integration.controllerkit import write_kubeconfig


class Tenant:
    def __init__(self, cluster: LocalCluster, namespace: str, name: str = "tenant") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.user = f"system:serviceaccount:{namespace}:{name}"
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", sa
        )
        assert status in (201, 409), body
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{name}-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
        status, body = cluster.request("POST", path, binding)
        assert status in (201, 409), body
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request
        )
        assert status == 201, body
        self.kubeconfig = write_kubeconfig(
            cluster,
            Path(cluster.directory) / f"kubeconfig-{namespace}-{name}",
            name,
            {"token": body["status"]["token"]},
            namespace,
        )

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs kubectl as the tenant; never raises (tests read returncode and stderr)."""
        return subprocess.run(
            [str(self.cluster.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def create(self, obj: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", "-f", "-", input=json.dumps(obj))

    def apply(self, text: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", "-f", "-", input=text)

    def can(self, verb: str, resource: str, subresource: str = "") -> bool:
        args = ["auth", "can-i", verb, resource]
        if subresource:
            args.append(f"--subresource={subresource}")
        return self.kubectl(*args).stdout.strip() == "yes"
