"""The node's heartbeat: coordination Lease `<node>` in the inventory namespace, renewed every
interval as kubelets renew node Leases.

The controller judges an inventory stale when it has not seen the Lease's renewTime change for
`leaseDurationSeconds`, by its own clock; the agent declares three renewal intervals there.
"""

from __future__ import annotations

import logging

from kubeio import bodies
from kubeio.client import Kube, Obj
from kubeio.errors import APIConflictError, APINotFoundError
from kubeio.paths import LEASES
from kubeio.times import now_micro
from placement.types import NodeName

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews one Lease. Not thread-safe: the agent's loop is its only caller."""

    def __init__(
        self, kube: Kube, namespace: str, node: NodeName, identity: str, duration_seconds: int
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.node = node
        self.identity = identity
        self.duration_seconds = duration_seconds
        self.collection = LEASES.collection(namespace)
        self.path = LEASES.item(node, namespace)
        self._lease: Obj | None = None  # as the server last returned it (its resourceVersion)

    def renew(self) -> None:
        """Raises kubeio.errors.APIError when the Lease could not be written."""
        lease = self._lease if self._lease is not None else self._read()
        if lease is None:
            self._lease = self._create()
            return
        try:
            self._lease = self.kube.put(self.path, self._renewed(lease))
        except APIConflictError:
            # Someone else wrote it (an agent of this node that is shutting down, or a person):
            # one more try on top of the fresh copy; a second conflict waits for the next interval.
            self._lease = None
            fresh = self._read()
            self._lease = (
                self._create() if fresh is None else self.kube.put(self.path, self._renewed(fresh))
            )
        except APINotFoundError:
            self._lease = None
            self._lease = self._create()

    def _read(self) -> Obj | None:
        try:
            return self.kube.get(self.path)
        except APINotFoundError:
            return None

    def _create(self) -> Obj:
        now = now_micro()
        spec = bodies.lease_spec(self.identity, self.duration_seconds, now, now, 0)
        body = bodies.lease(self.node, self.namespace, spec)
        log.info("creating heartbeat Lease %s/%s", self.namespace, self.node)
        return self.kube.create(self.collection, body)

    def _renewed(self, lease: Obj) -> Obj:
        spec = dict(lease.get("spec") or {})
        now = now_micro()
        holder = spec.get("holderIdentity") or ""
        if holder != self.identity:
            if holder:
                log.info("taking over heartbeat Lease %s from %s", self.node, holder)
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.duration_seconds
        spec["renewTime"] = now
        return {**lease, "spec": spec}
