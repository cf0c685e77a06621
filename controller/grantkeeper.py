"""Grants: which namespaces may place on which nodes and GPUs. Owns the placement policy (ConfigMap
gpuplace-policy), the node labels it is resolved against, and every valid map offered to the
compiler: a map the grants allow is compiled, one outside them is withheld and its status names each
entry that is not granted. Runs in the model keeper's pass only (the caller holds the inbox's lock)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from controller.policystatus import PolicyVerdict
from controller.settings import ControllerSettings
from controller.sources import Form
from kubeio.client import Obj
from kubeio.events import WARNING, EventRecorder, ObjectRef
from placement.compile import Compiler
from placement.errors import Diagnostic, PlacementError
from placement.grants import (
    POLICY_API_VERSION,
    POLICY_CONFIGMAP,
    POLICY_KEY,
    POLICY_KIND,
    GrantView,
    PlacementPolicy,
    check_map,
    parse_policy,
    resolve,
)
from placement.maps import PlacementMap
from placement.model import Provenance
from placement.reasons import EventReason
from placement.resource import policy_from_resource
from placement.types import MapKey, NodeName

log = logging.getLogger(__name__)

OPEN_GRANTS = (
    "no placement policy (ConfigMap %s/%s) nor PlacementPolicy %s: every namespace whose users may create ConfigMaps "
    "and pods may place on every node and GPU, first come first served. Fine for a cluster of "
    "one team; on a shared cluster write a policy (docs/trust.md, Grants) or deny by default "
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
        #: The policy's objects by form, and the verdict on each (written to their status).
        self.policy_objects: dict[Form, Obj] = {}
        self.verdicts: dict[Form, PolicyVerdict] = {}
        self.verdicts_dirty = False

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
            log.warning(
                OPEN_GRANTS, self.settings.system_namespace, POLICY_CONFIGMAP, POLICY_CONFIGMAP
            )

    def apply_policy(self, obj: Obj | None, form: Form = Form.CONFIGMAP) -> bool:
        """The policy in one of its forms changed (None: deleted); whether the policy did. The
        PlacementPolicy custom resource wins over the ConfigMap when both exist. An invalid one
        is reported and the last valid one keeps applying: a typo must not open every node."""
        if obj is None:
            self.policy_objects.pop(form, None)
            self.verdicts.pop(form, None)
        else:
            self.policy_objects[form] = obj
        self.verdicts_dirty = True
        serving = Form.RESOURCE if Form.RESOURCE in self.policy_objects else Form.CONFIGMAP
        for other in self.policy_objects:
            if other is not serving:
                self.verdicts[other] = PolicyVerdict.superseded(self.policy_objects[other])
        current = self.policy_objects.get(serving)
        if current is None:
            policy = PlacementPolicy()
            if self.policy != policy:
                self.warn_if_open()
        else:
            try:
                policy = self._parse(current, serving)
            except PlacementError as exc:
                message = exc.format()
                self.verdicts[serving] = PolicyVerdict.invalid(current, exc.diagnostics)
                log.warning("placement policy invalid, keeping the last valid one: %s", message)
                self.events.emit(
                    self._ref(current, serving), WARNING, EventReason.POLICY_INVALID, message
                )
                return False
            self.verdicts[serving] = PolicyVerdict.valid(current, len(policy.grants))
        if policy == self.policy:
            return False
        self.policy = policy
        self.dirty = True
        return True

    def _parse(self, obj: Obj, form: Form) -> PlacementPolicy:
        if form is Form.RESOURCE:
            return policy_from_resource(obj)
        text = (obj.get("data") or {}).get(POLICY_KEY, "")
        source = f"configmap {self.settings.system_namespace}/{POLICY_CONFIGMAP} {POLICY_KEY}"
        return parse_policy(text, source)

    @staticmethod
    def _ref(obj: Obj, form: Form) -> ObjectRef:
        if form is Form.RESOURCE:
            return ObjectRef.of({**obj, "kind": POLICY_KIND, "apiVersion": POLICY_API_VERSION})
        return ObjectRef.of({**obj, "kind": "ConfigMap", "apiVersion": "v1"})

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
