"""The CustomResourceDefinitions of PlacementMap and PlacementPolicy, built from their models.

The spec schemas are the pydantic models' (placement/schema.py, placement/policyschema.py),
converted by placement/openapi.py. On top of them go the cheap rules placement/validate.py and
the policy reader apply to one item at a time, as CEL and patterns the apiserver runs at apply
time (`MAP_RULES`, `POLICY_RULES`); whatever relates items to each other (a GPU two entries
name, grants, inventories) stays with the webhook and the controller.
`gpuplace crds` prints these; charts/gpuplace/crds/ holds the same, generated (`make crds`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from placement.crdstatus import map_status_schema, policy_status_schema
from placement.grants import POLICY_CONFIGMAP
from placement.migprofiles import PROFILE_RE
from placement.openapi import structural_schema
from placement.policyschema import PolicySpec
from placement.schema import MapSpec
from placement.types import (
    API_GROUP,
    DEVICE_NAME_RE,
    DNS_LABEL_RE,
    GPU_UUID_RE,
    KIND,
    MAX_DEVICE_INDEX,
    NODE_REF_PATTERN,
    PLACEMENT_MAPS_PLURAL,
    PLACEMENT_MAPS_SHORT,
    PLACEMENT_POLICIES_PLURAL,
    POLICY_KIND,
)

VERSION = "v1alpha1"
CRD_API_VERSION = "apiextensions.k8s.io/v1"
#: `pp` is too generic to claim in a cluster's short names.
PLACEMENT_POLICIES_SHORT = "gpp"
CATEGORY = "gpuplace"
#: ArgoCD never deletes a CRD (that would delete every map and drift every pod) and applies it
#: server-side (too large for the last-applied annotation).
ARGOCD_SYNC_OPTIONS = "Delete=false,ServerSideApply=true"
LABELS = {"app.kubernetes.io/part-of": "gpuplace"}

#: An NVML index, a GPU UUID or a PCI bus ID: OpenAPI applies the bounds to an integer and the
#: pattern to a string, at no cost to the CRD's CEL budget (a CEL rule on every device of 10,000
#: entries would exceed it).
_DEVICE = {
    "minimum": 0,
    "maximum": MAX_DEVICE_INDEX,
    "pattern": DEVICE_NAME_RE.pattern,
}
#: A grant names GPUs by NVML index or UUID only (placement/grants.py reads no PCI bus IDs).
_GRANT_DEVICE = {**_DEVICE, "pattern": GPU_UUID_RE.pattern}

MAP_RULES: Mapping[tuple[str, ...], Mapping[str, Any]] = {
    (): {
        "x-kubernetes-validations": [
            {
                "rule": "has(self.placements) != has(self.map)",
                "message": "give exactly one of 'placements' and 'map'",
            }
        ]
    },
    # Unique indices without a CEL rule: the apiserver refuses a duplicate key of a map-list
    # itself, at no cost to the CRD's CEL budget (which a rule over 10,000 items would exceed).
    ("placements",): {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["index"]},
    ("placements", "[]"): {
        "x-kubernetes-validations": [
            {
                "rule": "(has(self.devices) ? 1 : 0) + (has(self.count) ? 1 : 0) "
                "+ (has(self.mig) ? 1 : 0) == 1",
                "message": "give exactly one of 'devices' (these GPUs), 'count' (the "
                "controller picks that many) and 'mig' (one MIG instance)",
            }
        ]
    },
    ("placements", "[]", "node"): {"pattern": NODE_REF_PATTERN},
    ("placements", "[]", "devices"): {"minItems": 1},
    ("placements", "[]", "devices", "[]"): _DEVICE,
    ("placements", "[]", "mig", "gpu"): _DEVICE,
    ("placements", "[]", "mig", "profile"): {"pattern": f"^{PROFILE_RE.pattern}$"},
    # No default: a legacy `map` that omits `sharing` keeps its lines' shared GPUs, so
    # placement/validate.py must see whether it was given.
    ("sharing",): {"default": None},
}

POLICY_RULES: Mapping[tuple[str, ...], Mapping[str, Any]] = {
    ("grants", "[]"): {
        "x-kubernetes-validations": [
            {
                "rule": "(has(self.nodes) && size(self.nodes) > 0) || has(self.nodeSelector)",
                "message": "a grant needs 'nodes', 'nodeSelector' or both",
            }
        ]
    },
    ("grants", "[]", "devices", "[]"): _GRANT_DEVICE,
    ("grants", "[]", "tolerations", "[]"): {
        "x-kubernetes-validations": [
            {
                "rule": "has(self.key) != has(self.anyKey)",
                "message": "a toleration grant needs exactly one of 'key' and 'anyKey: true'",
            }
        ]
    },
}


def placement_map_crd() -> dict[str, Any]:
    """CRD placementmaps.gpuplace.io: namespaced, short name pm, status subresource."""
    spec = _with_rules(structural_schema(MapSpec), MAP_RULES)
    # Pods name their map in a label value: a DNS label (the apiserver allows names of 253).
    name = {"type": "string", "maxLength": 63, "pattern": DNS_LABEL_RE.pattern}
    schema = _root(
        "A placement map: which node and GPUs the pod of each index (slot) gets. Pods opt in "
        "with the label gpuplace.io/map: <name>, in the map's namespace.",
        name,
        spec,
        map_status_schema(),
    )
    columns = [
        _column("Phase", "string", ".status.phase", "Valid, Invalid, Conflict or Degraded"),
        _column("Slots", "integer", ".status.slots.total", "Slots the map declares"),
        _column("Bound", "integer", ".status.slots.bound", "Slots with a bound pod"),
        _column("Drifted", "integer", ".status.slots.drifted", "Bound pods off their slot"),
        {**_column("Message", "string", ".status.message", "The verdict"), "priority": 1},
        _column("Age", "date", ".metadata.creationTimestamp", ""),
    ]
    return _crd(PLACEMENT_MAPS_PLURAL, KIND, "Namespaced", [PLACEMENT_MAPS_SHORT], schema, columns)


def placement_policy_crd() -> dict[str, Any]:
    """CRD placementpolicies.gpuplace.io: cluster-scoped, one object named gpuplace-policy."""
    spec = _with_rules(structural_schema(PolicySpec), POLICY_RULES)
    singleton = {
        "rule": f"self == '{POLICY_CONFIGMAP}'",
        "message": f"the cluster has one placement policy, named {POLICY_CONFIGMAP}",
    }
    name = {"type": "string", "x-kubernetes-validations": [singleton]}
    schema = _root(
        "The cluster's placement policy: which namespaces may place on which nodes and GPUs. "
        f"One object, named {POLICY_CONFIGMAP}.",
        name,
        spec,
        policy_status_schema(),
    )
    columns = [
        _column("Phase", "string", ".status.phase", "Valid or Invalid"),
        _column("Message", "string", ".status.message", "The verdict"),
        _column("Age", "date", ".metadata.creationTimestamp", ""),
    ]
    return _crd(
        PLACEMENT_POLICIES_PLURAL,
        POLICY_KIND,
        "Cluster",
        [PLACEMENT_POLICIES_SHORT],
        schema,
        columns,
    )


def all_crds() -> tuple[dict[str, Any], ...]:
    return (placement_map_crd(), placement_policy_crd())


def _with_rules(
    schema: dict[str, Any], rules: Mapping[tuple[str, ...], Mapping[str, Any]]
) -> dict[str, Any]:
    """`schema` with each rule's keys set at its path (property names, "[]" for a list's
    items); a None value removes the key."""
    out = copy.deepcopy(schema)
    for path, keys in rules.items():
        node = out
        for step in path:
            node = node["items"] if step == "[]" else node["properties"][step]
        for key, value in copy.deepcopy(dict(keys)).items():
            if value is None:
                node.pop(key, None)
            else:
                node[key] = value
    return out


def _root(
    description: str, name: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]
) -> dict[str, Any]:
    """The object's schema; `name` restricts metadata.name (the only part of metadata a CRD
    may)."""
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{API_GROUP}/{VERSION}"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": name}},
            "spec": spec,
            "status": status,
        },
    }


def _column(name: str, kind: str, path: str, description: str) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if description:
        column["description"] = description
    return column


def _crd(
    plural: str,
    kind: str,
    scope: str,
    short_names: list[str],
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": CRD_API_VERSION,
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "labels": dict(LABELS),
            "annotations": {"argocd.argoproj.io/sync-options": ARGOCD_SYNC_OPTIONS},
        },
        "spec": {
            "group": API_GROUP,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
                "shortNames": short_names,
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }
