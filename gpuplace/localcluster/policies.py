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
    writes = ["CREATE", "UPDATE", "DELETE"]
    return _policy(
        name,
        namespace=inventory_namespace,
        rules=[_rule("", "configmaps", writes), _rule("coordination.k8s.io", "leases", writes)],
        condition=(
            "agent",
            f"request.userInfo.username == {service_account(system_namespace, account)!r}",
        ),
        expression=(
            f"{NODE_NAME_EXTRA!r} in request.userInfo.extra && "
            f"size({extra}) == 1 && request.name == {extra}[0]"
        ),
        message=(
            f"'an agent writes only the inventory and Lease of its own node: ' + "
            f"({NODE_NAME_EXTRA!r} in request.userInfo.extra ? "
            f"'this token is bound to node ' + {extra}[0] : "
            f"'this token names no node (use the token of a pod on the node)') + "
            f"', not ' + request.name"
        ),
    )


def controller_policy(
    name: str = "gpuplace-controller",
    *,
    system_namespace: str = MODEL_NAMESPACE,
    account: str = "gpuplace-controller",
) -> list[dict[str, Any]]:
    return _policy(
        name,
        rules=[_rule("", "configmaps", ["UPDATE"])],
        condition=(
            "controller-outside-its-namespace",
            f"request.userInfo.username == {service_account(system_namespace, account)!r} && "
            f"request.namespace != {system_namespace!r}",
        ),
        variables={"wasMap": _labelled_map("oldObject"), "isMap": _labelled_map("object")},
        expression="variables.wasMap && variables.isMap",
        message=(
            f"'the controller writes only ConfigMaps labelled {PLACEMENT_MAP_LABEL}="
            f"true outside {system_namespace}, and keeps the label; ' + "
            f"request.namespace + '/' + request.name + ' is not one'"
        ),
    )


def _labelled_map(obj: str) -> str:
    """CEL: `obj` (object or oldObject) carries the placement-map label set to 'true'."""
    label = f"{PLACEMENT_MAP_LABEL!r}"
    return (
        f"has({obj}.metadata.labels) && {label} in {obj}.metadata.labels"
        f" && {obj}.metadata.labels[{label}] == 'true'"
    )


def _rule(group: str, resource: str, operations: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["v1"],
        "resources": [resource],
        "operations": operations,
    }


def _policy(
    name: str,
    *,
    rules: list[dict[str, Any]],
    condition: tuple[str, str],
    expression: str,
    message: str,
    namespace: str | None = None,
    variables: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A policy that denies, with `message`, the requests matching `rules` (in `namespace`, if
    given) and the CEL `condition` (name, expression) for which `expression` is false; and its
    binding."""
    constraints: dict[str, Any] = {}
    if namespace is not None:
        constraints["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": namespace}
        }
    constraints["resourceRules"] = rules
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": constraints,
        "matchConditions": [{"name": condition[0], "expression": condition[1]}],
    }
    if variables:
        spec["variables"] = [{"name": k, "expression": v} for k, v in variables.items()]
    spec["validations"] = [
        {"expression": expression, "messageExpression": message, "reason": "Forbidden"}
    ]
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": spec,
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
