"""Wake keys: what an unschedulable pod waits for, and what a change in the cluster wakes.

A decision that cannot place a pod names the objects whose change may unblock it (`Status.waits_for`);
the controller and the binder name the objects that changed (`SchedulingQueue.wake`). Both sides
build the keys with the constructors below, so a misspelt key is a type error, not a pod that waits
for the periodic flush. A key is a `str` (cheap to hash on the hot path, readable in logs):

| constructor                 | text                  | woken when                                     |
|-----------------------------|-----------------------|------------------------------------------------|
| `WakeKey.model()`           | `model`               | a new model generation is published            |
| `WakeKey.nodes()`           | `nodes`               | any node appears, goes or changes              |
| `WakeKey.node(n)`           | `node:<n>`            | node `n` (by name or alias) changes            |
| `WakeKey.slot(s)`           | `slot:<ns>/<map>[i]`  | the pod holding slot `s` goes                  |
| `WakeKey.map(m)`            | `map:<ns>/<map>`      | map `m` is recompiled or one of its pods goes  |
| `WakeKey.inventory(n)`      | `inventory:<n>`       | node `n`'s inventory (or ResourceSlices) changes |
| `WakeKey.gpu(n, g)`         | `gpu:<n>/<g>`         | a holder of GPU `g` on node `n` goes           |
| `WakeKey.pod(uid)`          | `pod:<uid>`           | the pod itself changes (e.g. gets its claim)   |
| `WakeKey.claim(uid)`        | `claim:<uid>`         | the ResourceClaim owned by pod `uid` changes   |
| `WakeKey.lease()`           | `lease`               | the binder holds the leader's Lease again      |
"""

from __future__ import annotations

from enum import StrEnum

from placement.types import MapKey, SlotKey


class WakeKind(StrEnum):
    MODEL = "model"
    NODES = "nodes"
    NODE = "node"
    SLOT = "slot"
    MAP = "map"
    INVENTORY = "inventory"
    GPU = "gpu"
    POD = "pod"
    CLAIM = "claim"
    LEASE = "lease"


#: Kinds that stand alone; every other kind names its subject after a colon.
_BARE = frozenset({WakeKind.MODEL, WakeKind.NODES, WakeKind.LEASE})


class WakeKey(str):
    """One wake key. Build it with a constructor; `WakeKey(text)` parses and checks `text`."""

    __slots__ = ()

    def __new__(cls, text: str) -> WakeKey:
        kind, sep, subject = text.partition(":")
        try:
            known = WakeKind(kind)
        except ValueError:
            raise ValueError(f"{text!r} is not a wake key: unknown kind {kind!r}") from None
        if (known in _BARE) == bool(sep) or (sep and not subject):
            raise ValueError(f"{text!r} is not a wake key of kind {kind!r}")
        return str.__new__(cls, text)

    @property
    def kind(self) -> WakeKind:
        return WakeKind(self.partition(":")[0])

    @property
    def subject(self) -> str:
        """What the key names (a node, slot, map, GPU, pod uid); empty for model, nodes, lease."""
        return self.partition(":")[2]

    @classmethod
    def model(cls) -> WakeKey:
        return _MODEL

    @classmethod
    def nodes(cls) -> WakeKey:
        return _NODES

    @classmethod
    def lease(cls) -> WakeKey:
        return _LEASE

    @classmethod
    def node(cls, name: str) -> WakeKey:
        """A node by its name or by the logical name (alias) a map declares."""
        return _key(f"node:{name}")

    @classmethod
    def slot(cls, slot: SlotKey) -> WakeKey:
        return _key(f"slot:{slot}")

    @classmethod
    def map(cls, key: MapKey) -> WakeKey:
        return _key(f"map:{key}")

    @classmethod
    def inventory(cls, node: str) -> WakeKey:
        return _key(f"inventory:{node}")

    @classmethod
    def gpu(cls, node: str, gpu: str) -> WakeKey:
        """A GPU of a node, by the identity the slot cache holds it under (UUID or `#<index>`)."""
        return _key(f"gpu:{node}/{gpu}")

    @classmethod
    def pod(cls, uid: str) -> WakeKey:
        return _key(f"pod:{uid}")

    @classmethod
    def claim(cls, owner_uid: str) -> WakeKey:
        return _key(f"claim:{owner_uid}")


def _key(text: str) -> WakeKey:
    """A key the constructors built (already well formed: no parse on the hot path)."""
    return str.__new__(WakeKey, text)


_MODEL = _key(WakeKind.MODEL.value)
_NODES = _key(WakeKind.NODES.value)
_LEASE = _key(WakeKind.LEASE.value)
