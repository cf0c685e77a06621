"""Argo Workflows' workflow controller out of cluster against a `LocalCluster`, namespaced, with
the emissary executor's argoexec imported as an image into the real node's containerd.

The controller runs on the host with the cluster's admin kubeconfig, as ArgoCD's components do
(`gpuplace_dev.localargocd`); its configuration ConfigMap lives in ``argo`` and it watches one
namespace (``--namespaced --managed-namespace``), where Workflow pods run under the namespace's
default ServiceAccount bound to the executor's Role of the same release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml

from gpuplace_dev.gobuild import HostComponents
from gpuplace_dev.localargowf.binaries import ArgoWorkflowsBinaries, find_argo_workflows
from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.images import Image, ImageFile, oci_archive
from kubeio.paths import Resource

NAMESPACE = "argo"
CONFIGMAP = "workflow-controller-configmap"
WORKFLOWS = Resource("argoproj.io", "v1alpha1", "workflows")
CRDS = ("workflows.argoproj.io", "workflowtaskresults.argoproj.io")
EXECUTOR_ROLE = "argo-executor"
#: Phases after which a Workflow does not change.
FINISHED = ("Succeeded", "Failed", "Error")


class ArgoWorkflowsError(Exception):
    """Argo Workflows could not be started here, or a Workflow did not finish."""


def argoexec_image_name(version: str) -> str:
    return f"gpuplace.local/argoexec:{version}"


def argoexec_image(argoexec: bytes, version: str) -> Image:
    """argoexec at /bin/argoexec, its own entrypoint: the init container copies it into the shared
    volume from there, and the wait container runs it."""
    return Image(
        argoexec_image_name(version),
        {"/bin/argoexec": ImageFile(argoexec)},
        entrypoint=["/bin/argoexec"],
    )


@dataclass(frozen=True)
class WorkflowResult:
    """A finished Workflow: its phase and message, and each failed step's message by name."""

    name: str
    phase: str
    message: str
    started_at: str
    finished_at: str
    failed_steps: Mapping[str, str]

    @classmethod
    def from_object(cls, workflow: Mapping[str, Any]) -> WorkflowResult:
        status = workflow.get("status") or {}
        nodes = (status.get("nodes") or {}).values()
        failed = {
            str(n.get("displayName", "")): str(n.get("message", ""))
            for n in nodes
            if n.get("type") == "Pod" and n.get("phase") in ("Failed", "Error")
        }
        return cls(
            name=str(workflow["metadata"]["name"]),
            phase=str(status.get("phase", "")),
            message=str(status.get("message", "")),
            started_at=str(status.get("startedAt") or ""),
            finished_at=str(status.get("finishedAt") or ""),
            failed_steps=failed,
        )

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED


class LocalArgoWorkflows(HostComponents):
    """Installs Argo Workflows' CRDs and RBAC, imports argoexec, and runs the controller for
    ``managed_namespace``; `stop` ends it."""

    error = ArgoWorkflowsError

    def __init__(
        self,
        cluster: LocalCluster,
        managed_namespace: str,
        workdir: Path | None = None,
        *,
        binaries: ArgoWorkflowsBinaries | None = None,
    ) -> None:
        super().__init__(cluster, workdir, prefix="gpuplace-argo-workflows-")
        self.managed_namespace = managed_namespace
        self._binaries = binaries

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        binaries = self._binaries or find_argo_workflows()
        self.workdir.mkdir(parents=True, exist_ok=True)
        image = self._import_argoexec(binaries)
        self._install(binaries)
        self._spawn_controller(binaries, image)
        return self

    # ----------------------------------------------------------------------------- workflows

    def workflow(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self.cluster.request("GET", WORKFLOWS.item(name, namespace))
        return body if status == 200 else None

    def wait_finished(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        not_uid: str | None = None,
        timeout: float = 300.0,
    ) -> WorkflowResult:
        """Until Workflow ``name`` (with ``uid``, or any but ``not_uid``: a hook's Workflow is
        replaced on each sync) has finished; its result."""

        def finished() -> WorkflowResult | None:
            body = self.workflow(namespace, name)
            if body is None:
                return None
            found = body["metadata"]["uid"]
            if (uid is not None and found != uid) or (not_uid is not None and found == not_uid):
                return None
            result = WorkflowResult.from_object(body)
            return result if result.finished else None

        result: WorkflowResult = self.wait(
            f"Workflow {namespace}/{name} finished", finished, timeout
        )
        return result

    # ----------------------------------------------------------------------------- setup

    def _import_argoexec(self, binaries: ArgoWorkflowsBinaries) -> str:
        name = argoexec_image_name(binaries.version)
        archive = self.workdir / "argoexec-image.tar"
        image = argoexec_image(binaries.argoexec.read_bytes(), binaries.version)
        archive.write_bytes(oci_archive(image))
        self.cluster.real_node.ctr(
            "images", "import", "--label=io.cri-containerd.image=managed", str(archive)
        )
        return name

    def _install(self, binaries: ArgoWorkflowsBinaries) -> None:
        """The CRDs, the controller's namespace and configuration, and the executor's Role bound to
        the managed namespace's default ServiceAccount."""
        cluster = self.cluster
        self.install_crds(binaries.crds_dir, CRDS, "Argo Workflows'")
        cluster.create_namespace(NAMESPACE)
        role = yaml.safe_load(binaries.executor_role.read_text())
        role["metadata"] = {"name": EXECUTOR_ROLE, "namespace": self.managed_namespace}
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
                # No metrics listener: several local clusters may run on one host.
                "data": {
                    "metricsConfig": "enabled: false\n",
                    "telemetryConfig": "enabled: false\n",
                },
            },
            role,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": EXECUTOR_ROLE, "namespace": self.managed_namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": EXECUTOR_ROLE,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": "default",
                        "namespace": self.managed_namespace,
                    }
                ],
            },
        ]
        manifest = "\n".join(json.dumps(o) for o in objects)
        cluster.kubectl("apply", "--server-side", "-f", "-", input=manifest)

    def _spawn_controller(self, binaries: ArgoWorkflowsBinaries, image: str) -> None:
        kubeconfig = self.copy_kubeconfig()
        # One controller: no Lease to wait for.
        env = self.environment(LEADER_ELECTION_DISABLE="true")
        argv = [
            str(binaries.controller),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--namespaced",
            f"--managed-namespace={self.managed_namespace}",
            f"--configmap={CONFIGMAP}",
            f"--executor-image={image}",
            # Imported into the node's containerd, never pulled.
            "--executor-image-pull-policy=Never",
            "--loglevel=info",
        ]
        self.spawn("workflow-controller", argv, env)
