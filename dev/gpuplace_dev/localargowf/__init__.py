"""A real Argo Workflows controller next to a `LocalCluster`, for the preflight tier.

``hack/build-argo-workflows.sh`` (``make argo-workflows``) builds the workflow controller and
argoexec from the argo-workflows Go module into ``~/.cache/gpuplace/argo-workflows-<version>``.
`LocalArgoWorkflows` imports argoexec as an image into the real node's containerd (the emissary
executor runs it in every Workflow pod), installs the CRDs and the executor's Role, and runs the
controller out of cluster, namespaced, like ArgoCD's components::

    with LocalArgoWorkflows(cluster, managed_namespace="maps") as workflows:
        cluster.kubectl("create", "-f", "workflow.yaml")
        workflows.wait_finished("maps", "gpuplace-preflight-llm")
"""

from gpuplace_dev.localargowf.binaries import (
    ArgoWorkflowsBinaries,
    ArgoWorkflowsBinariesError,
    find_argo_workflows,
)
from gpuplace_dev.localargowf.launcher import (
    ArgoWorkflowsError,
    LocalArgoWorkflows,
    WorkflowResult,
)

__all__ = [
    "ArgoWorkflowsBinaries",
    "ArgoWorkflowsBinariesError",
    "ArgoWorkflowsError",
    "LocalArgoWorkflows",
    "WorkflowResult",
    "find_argo_workflows",
]
