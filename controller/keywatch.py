"""The binding key ring on the leader: loaded (or created) before the binder rebuilds its cache, since
what a bound pod holds depends on what its signature proves; and followed afterwards. A rotation,
an adoption, a deletion or an edit of the Secret has every bound pod judged again; an unreadable
ring is reported and the last good one keeps serving; a deleted or emptied Secret gets the ring this
leader holds written back. Its queue has one key, `KEY_RING`, added by the Secret's informer; a
reconcile reads the Secret as the informer holds it now (absent: deleted)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final

from controller.binder import Binder
from controller.bindingkey import KeySecret, load_or_create, read_stored, write_back
from controller.metrics import ControllerMetrics
from controller.snapshot import Published
from controller.workqueue import WorkQueue
from kubeio.client import Kube, Obj
from kubeio.errors import APIError
from kubeio.informer import Informer
from kubeio.pod import Pod
from placement.keyring import KEYRING_FIELD, RingError, TrustView

log = logging.getLogger(__name__)

#: The key ring queue's one key.
KEY_RING: Final = "key-ring"

RING_HINT = (
    " (mend the Secret, or delete it to start a new key ring: pods bound under the old keys then"
    " keep their GPUs blocked until `gpuplace key adopt`)"
)
#: Installed by the chart, the controller may not create Secrets (RBAC cannot narrow `create` by
#: name): the chart renders the Secret and the leader fills it.
CREATE_HINT = (
    " (a controller installed by the chart cannot create the Secret: `helm upgrade` or an ArgoCD"
    " sync renders it again, empty, and the leader writes back the ring it holds)"
)


def legacy_only(obj: Obj) -> bool:
    """A Secret holding only the key of the releases before the ring (written back as a ring)."""
    return KEYRING_FIELD not in (obj.get("data") or {})


@dataclass(eq=False)
class KeyWatch:
    kube: Kube
    secret: KeySecret
    binder: Binder
    metrics: ControllerMetrics
    pods: Callable[[], AbstractContextManager[list[Pod]]]
    published: Published
    #: The Secret's informer, and the queue its events go to.
    informer: Informer
    queue: WorkQueue[str]

    def load(self, stop: threading.Event, retry_seconds: float) -> TrustView:
        """The ring, created if there is none; retried until it is usable (the binder does not
        bind meanwhile) or `stop` is set."""
        while True:
            try:
                return load_or_create(self.kube, self.secret)
            except (APIError, RingError) as exc:
                if stop.is_set():
                    raise
                log.error(
                    "binding key ring not usable, not binding until it is: %s%s",
                    exc,
                    RING_HINT if isinstance(exc, RingError) else CREATE_HINT,
                )
                stop.wait(retry_seconds)

    def on_secret(self, _event: str, _obj: Obj, _old: Obj | None) -> None:
        """The Secret's informer handler (informer thread)."""
        self.queue.add(KEY_RING)

    def reconcile(self, _keys: list[str]) -> None:
        """The Secret as the informer holds it now, against the ring the binder trusts."""
        held = self.binder.trust
        if not self.binder.active.is_set() or held is None:
            return  # not leading: the leader's start-up reads the Secret itself
        obj = self.informer.get(self.secret.namespace, self.secret.name)
        try:
            stored = None if obj is None else read_stored(obj, self.secret)
            if obj is None or stored is None or stored.ring is None:
                view = write_back(self.kube, self.secret, held)
            elif legacy_only(obj):
                view = load_or_create(self.kube, self.secret)
            else:
                view = stored.view
        except RingError as exc:
            self.metrics.key_ring_errors.inc()
            log.error("binding key ring unreadable, the last good one serves: %s%s", exc, RING_HINT)
            return
        except APIError as exc:
            log.warning(
                "binding key ring not written, the last good one serves: %s%s", exc, CREATE_HINT
            )
            return
        if view.version == held.version:
            return
        log.info(
            "binding key ring changed: %d key(s), signing with %s, %d adoption record(s)",
            len(view.ring.keys),
            view.ring.signer.id,
            len(view.adoptions),
        )
        with self.pods() as pods:  # no bound pod's event judged by the old ring after this read
            self.binder.retrust(view, pods, self.published.current.shared)
