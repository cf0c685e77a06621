"""Several local clusters seen as a fleet: one kubeconfig with one context per cluster, named as
the fleet names them (the ArgoCD cluster name, the repository's `clusters/<name>` directory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from gpuplace_dev.localcluster.cluster import LocalCluster


def fleet_kubeconfig(path: Path, clusters: Mapping[str, LocalCluster]) -> Path:
    """Writes to `path` one kubeconfig with a context, cluster and admin user per name, the
    first the current context; returns `path`."""
    named, users, contexts = [], [], []
    for name, cluster in clusters.items():
        own = yaml.safe_load(cluster.kubeconfig.read_text())
        named.append({"name": name, "cluster": own["clusters"][0]["cluster"]})
        users.append({"name": name, "user": own["users"][0]["user"]})
        contexts.append({"name": name, "context": {"cluster": name, "user": name}})
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": named,
        "users": users,
        "contexts": contexts,
        "current-context": next(iter(clusters)),
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
