"""The chart's ValidatingAdmissionPolicies, as objects: what RBAC cannot say about gpuplace's own
identities. LocalCluster installs them so that every integration test runs under them, and a chart
test checks that `helm template` renders exactly these (charts/gpuplace/templates/*-policy.yaml).

- An agent writes only its own node's inventory ConfigMap and heartbeat Lease. RBAC cannot narrow
  `create` by name, and every agent shares one ServiceAccount; a pod-bound token carries the name
  of the pod's node (`authentication.kubernetes.io/node-name` in the user's extra), as the kubelet's
  NodeRestriction relies on.
- The controller updates or patches only ConfigMaps labelled as placement maps (the status
  annotation) outside its own namespace, and keeps the label; RBAC cannot narrow `patch` by label.
"""

from __future__ import annotations

from typing import Any

from placement.annotations import PLACEMENT_MAP_LABEL
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
API_VERSION = "admissionregistration.k8s.io/v1"


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def agent_policy(
    name: str = "gpuplace-agent",
    *,
    system_namespace: str = MODEL_NAMESPACE,
    inventory_namespace: str = INVENTORY_NAMESPACE,
    account: str = "gpuplace-agent",
) -> list[dict[str, Any]]:
    extra = f"request.userInfo.extra[{NODE_NAME_EXTRA!r}]"
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": inventory_namespace}
                },
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                    },
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "resources": ["leases"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                    },
                ],
            },
            "matchConditions": [
                {
                    "name": "agent",
                    "expression": (
                        f"request.userInfo.username == "
                        f"{service_account(system_namespace, account)!r}"
                    ),
                }
            ],
            "validations": [
                {
                    "expression": (
                        f"{NODE_NAME_EXTRA!r} in request.userInfo.extra && "
                        f"size({extra}) == 1 && request.name == {extra}[0]"
                    ),
                    "messageExpression": (
                        f"'an agent writes only the inventory and Lease of its own node: ' + "
                        f"({NODE_NAME_EXTRA!r} in request.userInfo.extra ? "
                        f"'this token is bound to node ' + {extra}[0] : "
                        f"'this token names no node (use the token of a pod on the node)') + "
                        f"', not ' + request.name"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    return [policy, _binding(name)]


def controller_policy(
    name: str = "gpuplace-controller",
    *,
    system_namespace: str = MODEL_NAMESPACE,
    account: str = "gpuplace-controller",
) -> list[dict[str, Any]]:
    label = f"{PLACEMENT_MAP_LABEL!r}"
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "operations": ["UPDATE"],
                    }
                ],
            },
            "matchConditions": [
                {
                    "name": "controller-outside-its-namespace",
                    "expression": (
                        f"request.userInfo.username == "
                        f"{service_account(system_namespace, account)!r} && "
                        f"request.namespace != {system_namespace!r}"
                    ),
                }
            ],
            "variables": [
                {
                    "name": "wasMap",
                    "expression": (
                        f"has(oldObject.metadata.labels) && {label} in oldObject.metadata.labels"
                        f" && oldObject.metadata.labels[{label}] == 'true'"
                    ),
                },
                {
                    "name": "isMap",
                    "expression": (
                        f"has(object.metadata.labels) && {label} in object.metadata.labels"
                        f" && object.metadata.labels[{label}] == 'true'"
                    ),
                },
            ],
            "validations": [
                {
                    "expression": "variables.wasMap && variables.isMap",
                    "messageExpression": (
                        f"'the controller writes only ConfigMaps labelled {PLACEMENT_MAP_LABEL}="
                        f"true outside {system_namespace}, and keeps the label; ' + "
                        f"request.namespace + '/' + request.name + ' is not one'"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    return [policy, _binding(name)]


def _binding(policy: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }


#: LocalCluster's copies are named apart from the chart's, so that `helm install` into the local
#: cluster creates its own (identical) policies instead of refusing to adopt these.
LOCAL_PREFIX = "localcluster-"


def admission_policies(prefix: str = LOCAL_PREFIX) -> list[dict[str, Any]]:
    """The policies for the chart's default release (`gpuplace` in gpuplace-system)."""
    return [
        *agent_policy(f"{prefix}gpuplace-agent"),
        *controller_policy(f"{prefix}gpuplace-controller"),
    ]
