"""Settings of the agent process: one object, built from flags and the environment in main()."""

from __future__ import annotations

import math
from dataclasses import dataclass

from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from placement.podresources import KUBELET_POD_RESOURCES_SOCKET
from placement.types import NodeName

#: Renewals a Lease may miss before the controller calls the node's inventory stale.
MISSED_RENEWALS = 3


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: NodeName
    #: Seconds between Lease renewals (the controller calls an inventory stale after 3 missed)
    #: and between NVML polls; health events cut a wait short.
    interval_seconds: float = 10.0
    #: Publish an empty inventory instead of exiting when this node has no NVML.
    publish_empty: bool = False
    #: A GPU marked unhealthy by a critical XID is healthy again after this many seconds without
    #: another one; 0 keeps it out of service until the agent restarts (the NVIDIA device
    #: plugin's behaviour, and the default).
    xid_recovery_seconds: float = 0.0
    #: The Lease's holderIdentity: who renewed it last (the pod name in a DaemonSet).
    identity: str = ""
    kubeconfig: str | None = None  # None: $KUBECONFIG / ~/.kube/config, else in-cluster
    inventory_namespace: str = INVENTORY_NAMESPACE
    #: Read-only: where the compiled model lives (the agent never writes there).
    model_namespace: str = MODEL_NAMESPACE
    metrics_host: str = "0.0.0.0"  # noqa: S104 - a pod's metrics port listens on all interfaces
    metrics_port: int = 8080
    log_level: str = "info"
    log_json: bool = False
    #: The kubelet's PodResources socket: what each pod holds is published beside the inventory
    #: (for `gpuplace import`); "" or a path that does not exist publishes nothing.
    pod_resources_socket: str = KUBELET_POD_RESOURCES_SOCKET

    @property
    def lease_duration_seconds(self) -> int:
        """What the Lease declares: the controller judges it stale after this long unrenewed."""
        return max(1, math.ceil(MISSED_RENEWALS * self.interval_seconds))
