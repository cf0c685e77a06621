"""Grants: which namespaces may place on which nodes and GPUs. Owns the placement policy (ConfigMap
gpuplace-policy), the node labels it is resolved against, and every valid map offered to the
compiler: a map the grants allow is compiled, one outside them is withheld and its status names each
entry that is not granted. Runs on the reconcile loop only (the caller holds its lock)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from controller.settings import ControllerSettings
from kubeio.client import Obj
from kubeio.events import WARNING, EventRecorder, ObjectRef
from placement.compile import Compiler
from placement.errors import Diagnostic, PlacementError
from placement.grants import (
    POLICY_CONFIGMAP,
    POLICY_KEY,
    GrantView,
    PlacementPolicy,
    check_map,
    parse_policy,
    resolve,
)
from placement.maps import PlacementMap
from placement.model import Provenance
from placement.reasons import EventReason
from placement.types import MapKey, NodeName

log = logging.getLogger(__name__)

OPEN_GRANTS = (
    "no placement policy (ConfigMap %s/%s): every namespace whose users may create ConfigMaps "
    "and pods may place on every node and GPU, first come first served. Fine for a cluster of "
    "one team; on a shared cluster write a policy (README, Grants) or deny by default "
    "(--grants-default-deny, chart value global.grants.defaultDeny)"
)


class GrantKeeper:
    def __init__(
        self, settings: ControllerSettings, compiler: Compiler, events: EventRecorder
    ) -> None:
        self.settings = settings
        self.compiler = compiler
        self.events = events
        self.policy = PlacementPolicy()
        self.view = GrantView()
        #: The first pass resolves: deny-by-default needs no policy to take effect.
        self.dirty = True
        self.node_labels: dict[str, dict[str, str]] = {}
        #: Valid maps and what the compiler needs of them, whether granted or not.
        self.offered: dict[MapKey, tuple[PlacementMap, str, Provenance]] = {}
        self.denied: dict[MapKey, tuple[Diagnostic, ...]] = {}

    def offer(self, pmap: PlacementMap, version: str, provenance: Provenance) -> None:
        """Hands a valid map to the compiler if its namespace's grants allow all of it."""
        self.offered[pmap.key] = (pmap, version, provenance)
        denied = tuple(check_map(self.view, pmap))
        if denied:
            self.denied[pmap.key] = denied
            self.compiler.remove_map(pmap.key)
        else:
            self.denied.pop(pmap.key, None)
            self.compiler.set_map(pmap, version, provenance)

    def forget(self, key: MapKey) -> None:
        """The map's source is gone."""
        self.offered.pop(key, None)
        self.denied.pop(key, None)

    def set_node(self, name: NodeName, labels: Mapping[str, str] | None) -> None:
        """A node's labels (None: the node is gone); the grants resolve again when a policy
        selects nodes by label and they changed."""
        if labels is None:
            self.dirty = self.dirty or bool(self.policy.grants)
            self.node_labels.pop(name, None)
            return
        if self.node_labels.get(name) != labels:
            self.dirty = self.dirty or bool(self.policy.grants)
        self.node_labels[name] = dict(labels)

    def warn_if_open(self) -> None:
        """Says, while no placement policy exists and deny-by-default is off, that every
        namespace may claim every GPU (fine for one team, not for a shared cluster)."""
        if not self.settings.grants_default_deny:
            log.warning(OPEN_GRANTS, self.settings.system_namespace, POLICY_CONFIGMAP)

    def apply_policy(self, obj: Obj | None) -> bool:
        """The policy ConfigMap changed (None: deleted); whether the policy did. An invalid one
        is reported and the last valid one keeps applying: a typo must not open every node."""
        if obj is None:
            self.policy = PlacementPolicy()
            self.warn_if_open()
        else:
            text = (obj.get("data") or {}).get(POLICY_KEY, "")
            source = f"configmap {self.settings.system_namespace}/{POLICY_CONFIGMAP} {POLICY_KEY}"
            try:
                policy = parse_policy(text, source)
            except PlacementError as exc:
                message = exc.format()
                log.warning("placement policy invalid, keeping the last valid one: %s", message)
                ref = ObjectRef.of({**obj, "kind": "ConfigMap", "apiVersion": "v1"})
                self.events.emit(ref, WARNING, EventReason.POLICY_INVALID, message)
                return False
            if policy == self.policy:
                return False
            self.policy = policy
        self.dirty = True
        return True

    def regrant(self) -> set[MapKey] | None:
        """Resolves the policy against the nodes once something it depends on changed; when the
        grants changed, re-offers every map and returns their keys (None: nothing changed)."""
        if not self.dirty:
            return None
        self.dirty = False
        view = resolve(
            self.policy,
            self.settings.grants_default_deny,
            self.node_labels,
            self.settings.alias_label,
        )
        if view == self.view:
            return None
        self.view = view
        self.compiler.set_grants(view)
        for pmap, version, provenance in list(self.offered.values()):
            self.offer(pmap, version, provenance)
        return set(self.offered)
