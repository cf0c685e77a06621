"""The node's inventory ConfigMap: written only when a value changed, repaired when someone else
changed or deleted it.

What is on the server is known from the last write's response and from a watch on this one
ConfigMap (a field selector on its name, as a kubelet watches its own Node), so an unchanged
inventory costs no request at all: the Lease is the heartbeat, not the ConfigMap.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from kubeio.client import Kube, Obj
from kubeio.errors import APIConflictError, APINotFoundError
from kubeio.informer import DELETED
from kubeio.paths import CONFIGMAPS
from placement.inventory import DeviceCheck
from placement.types import NodeName

log = logging.getLogger(__name__)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuplace-agent"


class _Unknown:
    """The server's copy has not been read yet."""


UNKNOWN: Final = _Unknown()
Data = dict[str, str]


def checks_json(checks: Sequence[DeviceCheck]) -> str:
    """`checks.json`: one object per model entry on this node, in the order of `check_node`."""
    return json.dumps([c.to_json() for c in checks], sort_keys=True, separators=(",", ":"))


def _holds(data: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(data.get(key) == value for key, value in wanted.items())


class InventoryPublisher:
    """Keeps the data of ConfigMap `<node>` in `namespace` equal to what the agent computed.

    Only the keys given to `publish` are managed; other keys and metadata are left alone.
    `on_event` is the handler for the watch on this ConfigMap: a change that this publisher did
    not write makes the next `publish` write again, and `wake` tells the agent to publish now.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        node: NodeName,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.node = node
        self.collection = CONFIGMAPS.collection(namespace)
        self.path = CONFIGMAPS.item(node, namespace)
        self._wake = wake
        self._lock = threading.Lock()
        self._server: Data | _Unknown | None = UNKNOWN  # None: the ConfigMap does not exist
        # resourceVersions this process wrote: their watch events tell nothing new.
        self._written: deque[str] = deque(maxlen=32)
        self._desired: Data = {}  # what the last `publish` asked for

    def on_event(self, event: str, obj: Obj, _old: Obj | None) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("name") != self.node:
            return
        with self._lock:
            if event == DELETED:
                self._server = None
            elif str(meta.get("resourceVersion", "")) in self._written:
                return
            else:
                data: Data = dict(obj.get("data") or {})
                self._server = data
                # Also the event of a write whose response this thread has not seen yet.
                if _holds(data, self._desired):
                    return
        log.info("inventory ConfigMap %s/%s changed by someone else", self.namespace, self.node)
        self._wake()

    def publish(self, data: Mapping[str, str]) -> tuple[str, ...]:
        """Writes the keys whose values differ from the server's; returns them (empty when the
        server already had everything). Raises kubeio.errors.APIError."""
        with self._lock:
            server = self._server
            self._desired = dict(data)
        if isinstance(server, _Unknown):
            server = self._read()
        if server is None:
            return self._create(data)
        stale = {key: value for key, value in data.items() if server.get(key) != value}
        if not stale:
            return ()
        try:
            obj = self.kube.patch(self.path, {"data": stale})
        except APINotFoundError:
            return self._create(data)
        self._remember(obj)
        return tuple(sorted(stale))

    def _read(self) -> Data | None:
        try:
            obj = self.kube.get(self.path)
        except APINotFoundError:
            data: Data | None = None
        else:
            data = dict(obj.get("data") or {})
        with self._lock:
            if isinstance(self._server, _Unknown):
                self._server = data
            return self._server

    def _create(self, data: Mapping[str, str]) -> tuple[str, ...]:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.node,
                "namespace": self.namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            },
            "data": dict(data),
        }
        try:
            obj = self.kube.create(self.collection, body)
        except APIConflictError:
            # Created meanwhile (an earlier agent of this node, or a watch event not seen yet).
            obj = self.kube.patch(self.path, {"data": dict(data)})
        self._remember(obj)
        return tuple(sorted(data))

    def _remember(self, obj: Obj) -> None:
        with self._lock:
            self._server = dict(obj.get("data") or {})
            self._written.append(str(obj.get("metadata", {}).get("resourceVersion", "")))
