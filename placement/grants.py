"""Grants: which namespaces may place on which nodes and GPUs (the cluster placement policy).

The policy is a `PlacementPolicy` document, committed to git and synced into ConfigMap
`gpuplace-policy` (key `policy.yaml`) in `gpuplace-system`:

    apiVersion: gpuplace.io/v1alpha1
    kind: PlacementPolicy
    metadata:
      name: cluster
    spec:
      grants:
        - namespaces: [inference]
          nodes: [gpu-a-01, node7]              # node names, or logical names (gpu-node-name)
          nodeSelector: {matchLabels: {pool: inference}}
          devices: [0, 1]                       # optional: only these GPUs (indices or UUIDs)
          tolerations:                          # optional: DRA device taints it may tolerate
            - key: example.com/reserved         # on those nodes (a map's `tolerations`)
              effects: [NoSchedule]             # optional: only these effects
            - anyKey: true                      # every key: needed by `operator: Exists`
                                                # without a key

A namespace named in a grant may place only where its grants say. A namespace named in none may
place anywhere while the installation allows by default (a new install), and nowhere once it denies
by default (one switch: `--grants-default=deny`, chart value `global.grants.defaultDeny`).

Tolerating a taint is a grant too: a namespace that the policy names, or any namespace once grants
deny by default, may tolerate in its maps only the taint keys (and effects) its grants list for
the node. A taint marks a device as reserved or failing; tolerating it is the platform's call, not
the tenant's. Health the agent reports is no taint and no grant makes it tolerable.

The controller resolves the policy against the cluster's nodes into a `GrantView` (node selectors
and logical names become node names), publishes it for the webhook, and every check (a map at
apply time and at compile time, a legacy pod, a cut-over holding) asks that view.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from placement.errors import Diagnostic, Location, PlacementError
from placement.maps import DeclaredSlot, PlacementMap
from placement.taints import TaintEffect, Toleration, TolerationOperator
from placement.types import (
    DNS_LABEL_RE,
    GPU_UUID_RE,
    MAX_DEVICE_INDEX,
    MAX_TAINT_KEY,
    TAINT_KEY_RE,
    DeviceRef,
    GpuUuid,
    is_node_ref,
)
from placement.yamlsource import Document, Path, load_documents

POLICY_KIND = "PlacementPolicy"
POLICY_API_VERSION = "gpuplace.io/v1alpha1"
POLICY_CONFIGMAP = "gpuplace-policy"
POLICY_KEY = "policy.yaml"
GRANTS_CONFIGMAP = "gpuplace-grants"
GRANTS_KEY = "grants.json"
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: The key of a toleration grant that covers every taint key (`anyKey: true`); never a taint key.
ANY_KEY = "*"
#: The effects a map's toleration may name (a `None` taint never keeps a device away).
TOLERABLE_EFFECTS = (TaintEffect.NO_SCHEDULE.value, TaintEffect.NO_EXECUTE.value)


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn


@dataclass(frozen=True, slots=True)
class NodeSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.expressions
        )


@dataclass(frozen=True, slots=True)
class TolerationGrant:
    """DRA device taints a grant's namespaces may tolerate on its nodes: those of one key (or of
    every key, `ANY_KEY`) with these effects (None: every effect)."""

    key: str
    effects: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    namespaces: tuple[str, ...]
    nodes: tuple[str, ...] = ()
    selector: NodeSelector | None = None
    devices: tuple[DeviceRef, ...] = ()  # empty: every GPU of those nodes
    location: Location = field(default=Location(""), compare=False)
    tolerations: tuple[TolerationGrant, ...] = ()  # empty: no taint may be tolerated


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    grants: tuple[Grant, ...] = ()
    source: str = ""


# ---------------------------------------------------------------------------------- parsing


class _Reader:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.errors: list[Diagnostic] = []

    def error(self, path: Path, message: str, hint: str = "", *, key: bool = False) -> None:
        self.errors.append(Diagnostic(self.doc.locate(path, key=key), message, hint=hint))

    def mapping(self, value: object, path: Path, allowed: Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.error(path, "expected a mapping")
            return {}
        known = tuple(allowed)
        for k in value:
            if k not in known:
                self.error(
                    (*path, k),
                    f"unknown field {k!r}",
                    f"expected one of {', '.join(known)}",
                    key=True,
                )
        return value

    def strings(self, value: object, path: Path) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.error(path, "expected a list of strings")
            return ()
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                self.error((*path, i), "expected a non-empty string")
            else:
                out.append(item)
        return tuple(out)


def _selector(r: _Reader, value: object, path: Path) -> NodeSelector:
    body = r.mapping(value, path, ("matchLabels", "matchExpressions"))
    labels: dict[str, str] = {}
    raw_labels = body.get("matchLabels", {})
    if not isinstance(raw_labels, dict):
        r.error((*path, "matchLabels"), "expected a mapping of label to value")
    else:
        for k, v in raw_labels.items():
            if not isinstance(v, str):
                r.error((*path, "matchLabels", k), "label values are strings (quote them)")
            else:
                labels[str(k)] = v
    expressions: list[Requirement] = []
    raw = body.get("matchExpressions", [])
    if not isinstance(raw, list):
        r.error((*path, "matchExpressions"), "expected a list")
        raw = []
    for i, item in enumerate(raw):
        epath = (*path, "matchExpressions", i)
        e = r.mapping(item, epath, ("key", "operator", "values"))
        op = e.get("operator")
        if op not in _SELECTOR_OPERATORS:
            r.error(
                (*epath, "operator"),
                f"operator {op!r} is not one of {', '.join(_SELECTOR_OPERATORS)}",
            )
            continue
        values = r.strings(e["values"], (*epath, "values")) if "values" in e else ()
        if not isinstance(e.get("key"), str):
            r.error(epath, "expected 'key'")
            continue
        expressions.append(Requirement(e["key"], op, values))
    return NodeSelector(labels, tuple(expressions))


def _devices(r: _Reader, value: object, path: Path) -> tuple[DeviceRef, ...]:
    if not isinstance(value, list) or not value:
        r.error(
            path,
            "expected a non-empty list of GPU indices or UUIDs",
            "omit 'devices' to grant every GPU",
        )
        return ()
    out: list[DeviceRef] = []
    for i, item in enumerate(value):
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= MAX_DEVICE_INDEX:
            out.append(item)
        elif isinstance(item, str) and GPU_UUID_RE.match(item):
            out.append(GpuUuid(item))
        else:
            r.error((*path, i), f"device {item!r} is neither an NVML index nor a GPU UUID")
    return tuple(out)


def _toleration_grant(r: _Reader, value: object, path: Path) -> TolerationGrant | None:
    before = len(r.errors)
    body = r.mapping(value, path, ("key", "anyKey", "effects"))
    key, any_key = body.get("key"), body.get("anyKey")
    if "anyKey" in body and any_key is not True:
        r.error((*path, "anyKey"), "anyKey is true or omitted", "give the taint key as 'key'")
    elif ("key" in body) == ("anyKey" in body):
        r.error(
            path,
            "a toleration grant needs exactly one of 'key' and 'anyKey: true'",
            "name the taint key; 'anyKey: true' grants every key, as a toleration without a "
            "key (operator Exists) needs",
        )
    elif "key" in body and (
        not isinstance(key, str) or len(key) > MAX_TAINT_KEY or not TAINT_KEY_RE.fullmatch(key)
    ):
        r.error(
            (*path, "key"),
            f"{key!r} is not a taint key",
            "a name of letters, digits, '-', '_', '.' (at most 63), optionally after a DNS "
            "prefix and '/', e.g. example.com/reserved",
        )
    effects: frozenset[str] | None = None
    if "effects" in body:
        raw = body["effects"]
        if not isinstance(raw, list) or not raw:
            r.error(
                (*path, "effects"),
                f"expected a non-empty list of {' or '.join(TOLERABLE_EFFECTS)}",
                "omit 'effects' to grant every effect",
            )
        else:
            for i, effect in enumerate(raw):
                if effect not in TOLERABLE_EFFECTS:
                    r.error(
                        (*path, "effects", i),
                        f"effect {effect!r} is not one of {', '.join(TOLERABLE_EFFECTS)}",
                    )
            effects = frozenset(str(e) for e in raw)
    if len(r.errors) > before:
        return None
    return TolerationGrant(ANY_KEY if any_key is True else str(key), effects)


def _toleration_grants(r: _Reader, value: object, path: Path) -> tuple[TolerationGrant, ...]:
    if not isinstance(value, list):
        r.error(path, "expected a list of toleration grants")
        return ()
    found = (_toleration_grant(r, item, (*path, i)) for i, item in enumerate(value))
    return tuple(g for g in found if g is not None)


def _grant(r: _Reader, value: object, path: Path) -> Grant | None:
    before = len(r.errors)
    body = r.mapping(value, path, ("namespaces", "nodes", "nodeSelector", "devices", "tolerations"))
    namespaces = (
        r.strings(body.get("namespaces"), (*path, "namespaces")) if "namespaces" in body else ()
    )
    if not namespaces and "namespaces" not in body:
        r.error(path, "a grant needs 'namespaces'")
    for i, ns in enumerate(namespaces):
        if not DNS_LABEL_RE.match(ns):
            r.error((*path, "namespaces", i), f"{ns!r} is not a namespace name")
    nodes = r.strings(body["nodes"], (*path, "nodes")) if "nodes" in body else ()
    for i, node in enumerate(nodes):
        if not is_node_ref(node):
            r.error((*path, "nodes", i), f"{node!r} is not a node name or label value")
    selector = (
        _selector(r, body["nodeSelector"], (*path, "nodeSelector"))
        if "nodeSelector" in body
        else None
    )
    if not nodes and selector is None and body:
        r.error(path, "a grant needs 'nodes', 'nodeSelector' or both")
    devices = _devices(r, body["devices"], (*path, "devices")) if "devices" in body else ()
    tolerations = (
        _toleration_grants(r, body["tolerations"], (*path, "tolerations"))
        if "tolerations" in body
        else ()
    )
    if len(r.errors) > before:
        return None
    return Grant(namespaces, nodes, selector, devices, r.doc.locate(path), tolerations)


def parse_policy(text: str, source: str) -> PlacementPolicy:
    """The one PlacementPolicy in `text`; raises PlacementError with every located problem."""
    docs = [d for d in load_documents(text, source) if d.value is not None]
    if len(docs) != 1:
        raise PlacementError.single(
            Location(source, 1, 1),
            f"expected exactly one {POLICY_KIND}, found {len(docs)} documents",
        )
    return policy_from_document(docs[0])


def parse_label_selector(text: str, source: str) -> NodeSelector:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions) written as YAML or JSON, e.g.
    the chart's `global.legacy.namespaceSelector` given to the controller; empty text or `{}`
    selects everything. Raises PlacementError with every located problem."""
    docs = [d for d in load_documents(text, source) if d.value is not None]
    if not docs:
        return NodeSelector()
    if len(docs) > 1:
        raise PlacementError.single(Location(source, 1, 1), "expected one label selector")
    r = _Reader(docs[0])
    selector = _selector(r, docs[0].value, ())
    if r.errors:
        raise PlacementError(tuple(r.errors))
    return selector


def policy_from_document(doc: Document) -> PlacementPolicy:
    """The policy one document holds (a file's, or a custom resource's); raises PlacementError."""
    r = _Reader(doc)
    top = r.mapping(doc.value, (), ("apiVersion", "kind", "metadata", "spec"))
    if top.get("kind") != POLICY_KIND:
        r.error(("kind",), f"expected kind {POLICY_KIND}")
    if top.get("apiVersion") != POLICY_API_VERSION:
        r.error(("apiVersion",), f"expected apiVersion {POLICY_API_VERSION}")
    spec = r.mapping(top.get("spec", {}), ("spec",), ("grants",))
    grants: list[Grant] = []
    raw = spec.get("grants", [])
    if not isinstance(raw, list):
        r.error(("spec", "grants"), "expected a list of grants")
        raw = []
    for i, item in enumerate(raw):
        grant = _grant(r, item, ("spec", "grants", i))
        if grant is not None:
            grants.append(grant)
    if r.errors:
        raise PlacementError(tuple(r.errors))
    return PlacementPolicy(tuple(grants), doc.source)


def is_policy_document(value: object) -> bool:
    return isinstance(value, dict) and value.get("kind") == POLICY_KIND


# ---------------------------------------------------------------------------------- the view

#: node (name or logical name) -> the GPUs granted there (None: all of them)
NodeGrants = Mapping[str, frozenset[DeviceRef] | None]
#: taint key (or ANY_KEY) -> the effects that may be tolerated (None: every effect)
TaintGrants = Mapping[str, frozenset[str] | None]


@dataclass(frozen=True, slots=True)
class GrantView:
    """The policy resolved against the cluster's nodes: what each namespace may use."""

    deny_by_default: bool = False
    namespaces: Mapping[str, NodeGrants] = field(default_factory=dict)
    #: Namespaces with a node-selector grant that could not be resolved (offline checks only):
    #: a node they name outside their named nodes is not an error there.
    unresolved: frozenset[str] = frozenset()
    origin: str = f"{POLICY_CONFIGMAP}"
    #: namespace -> node (name or logical name) -> the taints it may tolerate there
    tolerations: Mapping[str, Mapping[str, TaintGrants]] = field(default_factory=dict)
    #: Logical name -> the node it resolves to (`placement.nodes`: only names that are no node's
    #: name and are on exactly one node), so that a name as written is judged on its node.
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def allows_everything(self) -> bool:
        return not self.deny_by_default and not self.namespaces

    def node_of(self, written: str) -> str:
        """The node a map or line means by `written`, as the node resolver picks it."""
        return self.aliases.get(written, written)

    def refusal(
        self, namespace: str, node: str, devices: Iterable[DeviceRef], count: bool = False
    ) -> str | None:
        """Why `namespace` may not place on `node` (with these devices, as written), or None if
        it may. `node` is judged as the node resolver resolves it."""
        grants = self.namespaces.get(namespace)
        node = self.node_of(node)
        if grants is None:
            if self.deny_by_default:
                return (
                    f"namespace {namespace} has no grant in the placement policy, and grants deny "
                    "by default; ask a cluster admin to grant it nodes in "
                    f"gpuplace-system/{self.origin}"
                )
            return None
        if node not in grants:
            if namespace in self.unresolved:
                return None
            return (
                f"namespace {namespace} may not place on node {node}: no grant in "
                f"gpuplace-system/{self.origin} gives it that node"
            )
        allowed = grants[node]
        if allowed is None:
            return None
        if count:
            return (
                f"namespace {namespace} may use only GPUs {_show(allowed)} of node {node}; "
                "list them under 'devices' instead of 'count'"
            )
        outside = [d for d in devices if d not in allowed]
        if outside:
            return (
                f"namespace {namespace} may not use GPU(s) {', '.join(map(str, outside))} of node "
                f"{node}: its grant allows {_show(allowed)}"
            )
        return None

    def toleration_refusal(self, namespace: str, node: str, toleration: Toleration) -> str | None:
        """Why `namespace` may not tolerate what `toleration` tolerates on `node`, or None if
        its grants let it. A toleration without a key tolerates every taint: it needs a grant of
        every key (`anyKey`); one without an effect tolerates every effect: it needs a grant of
        its key without `effects`. `node` is judged as the node resolver resolves it."""
        node = self.node_of(node)
        if namespace not in self.namespaces:
            if self.deny_by_default:
                return (
                    f"namespace {namespace} has no grant in the placement policy, and grants deny "
                    f"by default: it may tolerate no taint (gpuplace-system/{self.origin})"
                )
            return None
        if _tolerable(self.tolerations.get(namespace, {}).get(node, {}), toleration):
            return None
        if namespace in self.unresolved:
            return None  # offline: a node-selector grant may list it
        if not toleration.key:
            what, grant = "every taint", "anyKey: true"
        else:
            effect = f" with effect {toleration.effect.value}" if toleration.effect else ""
            what = f"taint key {toleration.key}{effect}"
            grant = f"key: {toleration.key}"
            if toleration.effect is None:
                what += " (no effect named: every effect)"
        return (
            f"namespace {namespace} may not tolerate {what} on node {node}: no grant in "
            f"gpuplace-system/{self.origin} gives it a toleration {{{grant}}} there"
        )

    def granted_tolerations(
        self, namespace: str, node: str, tolerations: Iterable[Toleration]
    ) -> tuple[Toleration, ...]:
        """The tolerations `namespace` may hold on `node`; the rest are ignored, never honoured."""
        return tuple(t for t in tolerations if self.toleration_refusal(namespace, node, t) is None)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "denyByDefault": self.deny_by_default,
            "namespaces": {
                ns: {n: None if d is None else sorted(d, key=str) for n, d in sorted(g.items())}
                for ns, g in sorted(self.namespaces.items())
            },
        }
        if self.aliases:
            data["aliases"] = dict(sorted(self.aliases.items()))
        if self.tolerations:
            data["tolerations"] = {
                ns: {
                    n: {k: None if e is None else sorted(e) for k, e in sorted(keys.items())}
                    for n, keys in sorted(nodes.items())
                }
                for ns, nodes in sorted(self.tolerations.items())
            }
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> GrantView:
        data = json.loads(text)
        namespaces = {
            str(ns): {
                str(n): None if d is None else frozenset(_device(x) for x in d)
                for n, d in nodes.items()
            }
            for ns, nodes in data.get("namespaces", {}).items()
        }
        tolerations = {
            str(ns): {
                str(n): {
                    str(k): None if e is None else frozenset(map(str, e)) for k, e in keys.items()
                }
                for n, keys in nodes.items()
            }
            for ns, nodes in (data.get("tolerations") or {}).items()
        }
        aliases = {str(k): str(v) for k, v in data.get("aliases", {}).items()}
        return cls(
            bool(data.get("denyByDefault", False)),
            namespaces,
            tolerations=tolerations,
            aliases=aliases,
        )


def _tolerable(granted: TaintGrants, toleration: Toleration) -> bool:
    """Whether grants of these keys cover every taint `toleration` tolerates."""
    keys = (ANY_KEY, toleration.key) if toleration.key else (ANY_KEY,)
    for key in keys:
        if key not in granted:
            continue
        effects = granted[key]
        if effects is None:
            return True
        if toleration.effect is not None and toleration.effect.value in effects:
            return True
    return False


def _grant_taints(
    taints: dict[str, dict[str, dict[str, frozenset[str] | None]]],
    namespace: str,
    node: str,
    grants: Iterable[TolerationGrant],
) -> None:
    """Adds what `grants` let `namespace` tolerate on `node` to `taints`."""
    for grant in grants:
        granted = taints.setdefault(namespace, {}).setdefault(node, {})
        if grant.key in granted and granted[grant.key] is None:
            continue
        if grant.effects is None:
            granted[grant.key] = None
        else:
            granted[grant.key] = (granted.get(grant.key) or frozenset()) | grant.effects


def _device(value: object) -> DeviceRef:
    return value if isinstance(value, int) else GpuUuid(str(value))


def _show(devices: frozenset[DeviceRef]) -> str:
    return ", ".join(str(d) for d in sorted(devices, key=lambda d: (isinstance(d, str), str(d))))


def resolve(
    policy: PlacementPolicy,
    deny_by_default: bool,
    nodes: Mapping[str, Mapping[str, str]] | None,
    alias_label: str = "gpu-node-name",
) -> GrantView:
    """The view for `nodes` (name -> labels); `nodes=None` resolves offline (names only).

    A name in a grant means the node the node resolver (`placement.nodes`) picks for it, as a
    map's or a line's does: a node's own name wins over a logical name that equals it, and a
    logical name on several nodes grants none of them. The view is keyed by node names and
    carries the logical names that resolve, so that a check of a name as written agrees with
    the node a slot compiles onto."""
    view: dict[str, dict[str, frozenset[DeviceRef] | None]] = {}
    unresolved: set[str] = set()
    taints: dict[str, dict[str, dict[str, frozenset[str] | None]]] = {}
    aliases: dict[str, str] = {}
    carriers: dict[str, set[str]] = {}
    if nodes is not None:
        for name, labels in nodes.items():
            alias = labels.get(alias_label)
            if alias:
                carriers.setdefault(alias, set()).add(name)
        aliases = {
            alias: next(iter(names))
            for alias, names in carriers.items()
            if len(names) == 1 and alias not in nodes
        }

    def add(namespace: str, node: str, devices: tuple[DeviceRef, ...]) -> None:
        grants = view.setdefault(namespace, {})
        if node in grants and grants[node] is None:
            return
        if not devices:
            grants[node] = None
        else:
            grants[node] = (grants.get(node) or frozenset()) | frozenset(devices)

    for grant in policy.grants:
        targets: set[str] = set()
        for written in grant.nodes:
            if nodes is not None and written not in nodes and written in carriers:
                if written in aliases:
                    targets.add(aliases[written])
                continue  # ambiguous: the resolver picks no node for it
            targets.add(written)  # a node's name (or, offline or not yet there, as written)
        if nodes is not None:
            if grant.selector is not None:
                targets.update(n for n, labels in nodes.items() if grant.selector.matches(labels))
        elif grant.selector is not None:
            unresolved.update(grant.namespaces)
        for namespace in grant.namespaces:
            view.setdefault(namespace, {})
            for node in targets:
                add(namespace, node, grant.devices)
                _grant_taints(taints, namespace, node, grant.tolerations)
    return GrantView(
        deny_by_default, view, frozenset(unresolved), tolerations=taints, aliases=aliases
    )


def slot_refusal(view: GrantView, namespace: str, slot: DeclaredSlot) -> str | None:
    # A spare serves the slot when a declared GPU fails: it needs the grant as much.
    devices = (*slot.devices, *slot.fallback)
    if slot.mig is not None:
        devices = (slot.mig.gpu,)  # a MIG instance is granted through its parent GPU
    return view.refusal(namespace, slot.node, devices, count=slot.count is not None)


def check_map(view: GrantView, pmap: PlacementMap) -> list[Diagnostic]:
    """Every entry of `pmap` that its namespace's grants do not allow, at the entry's location."""
    if view.allows_everything:
        return []
    out: list[Diagnostic] = []
    for slot in pmap.slots:
        why = slot_refusal(view, pmap.key.namespace, slot)
        if why is not None:
            out.append(Diagnostic(slot.location, f"index {slot.index}: {why}"))
        out.extend(toleration_refusals(view, pmap.key.namespace, slot))
    return out


def toleration_refusals(view: GrantView, namespace: str, slot: DeclaredSlot) -> list[Diagnostic]:
    """Each toleration of `slot` that its namespace's grants do not let it hold, located."""
    out: list[Diagnostic] = []
    for i, toleration in enumerate(slot.tolerations):
        why = view.toleration_refusal(namespace, slot.node, toleration)
        if why is not None:
            where = slot.location
            if i < len(slot.toleration_locations):
                where = slot.toleration_locations[i]
            out.append(
                Diagnostic(
                    where,
                    f"index {slot.index}: toleration {describe_toleration(toleration)}: {why}",
                    hint="ask a cluster admin to grant it in the placement policy, or remove it",
                )
            )
    return out


def describe_toleration(toleration: Toleration) -> str:
    """`{key: k, operator: Exists, effect: NoSchedule}`, as a map writes it."""
    parts = [f"key: {toleration.key}"] if toleration.key else []
    parts.append(f"operator: {toleration.operator.value}")
    if toleration.operator is TolerationOperator.EQUAL and toleration.value:
        parts.append(f"value: {toleration.value}")
    if toleration.effect is not None:
        parts.append(f"effect: {toleration.effect.value}")
    return "{" + ", ".join(parts) + "}"


def granted_slot(view: GrantView, namespace: str, slot: DeclaredSlot) -> DeclaredSlot:
    """`slot` with only the tolerations its namespace's grants let it hold on its node."""
    if not slot.tolerations:
        return slot
    granted = view.granted_tolerations(namespace, slot.node, slot.tolerations)
    if granted == slot.tolerations:
        return slot
    return replace(slot, tolerations=granted, toleration_locations=())


def granted_map(view: GrantView, pmap: PlacementMap) -> PlacementMap:
    """`pmap` whose slots keep only granted tolerations (itself when nothing is dropped)."""
    slots = tuple(granted_slot(view, pmap.key.namespace, s) for s in pmap.slots)
    if all(a is b for a, b in zip(slots, pmap.slots, strict=True)):
        return pmap
    return replace(pmap, slots=slots)
