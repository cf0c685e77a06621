"""Real ArgoCD next to a `LocalCluster`, for the ArgoCD end-to-end tier and `gpuplace demo --argocd`.

``hack/build-argocd.sh`` (``make argocd``) builds the application-controller, repo-server and
applicationset-controller from the argo-cd Go module, and kustomize, into
``~/.cache/gpuplace/argocd-<version>``. `LocalArgoCD` runs them out of cluster, as ArgoCD's own
local development does, with a loopback Redis::

    with LocalCluster() as cluster, LocalArgoCD(cluster, destinations=("dev",)) as argocd:
        cluster.kubectl("apply", "-f", "applicationset.yaml")

`AppState` reads an Application's sync and health status.
"""

from gpuplace_dev.localargocd.apps import AppState
from gpuplace_dev.localargocd.binaries import ArgoCDBinaries, ArgoCDBinariesError, find_argocd
from gpuplace_dev.localargocd.launcher import ArgoCDError, LocalArgoCD

__all__ = [
    "AppState",
    "ArgoCDBinaries",
    "ArgoCDBinariesError",
    "ArgoCDError",
    "LocalArgoCD",
    "find_argocd",
]
