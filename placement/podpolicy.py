"""The ValidatingAdmissionPolicy that keeps bindings from being forged or rewritten, built without I/O.

The apiserver evaluates it (CEL, no webhook round trip) for every user, the cluster admin
included:
- on CREATE no pod may carry `gpuplace.io/*` annotations: the mutating webhook strips them from the
  pods it wires, and only the binder writes them, through the pods' Binding subresource (which this
  policy does not match: its object is the Binding, and the apiserver copies the annotations onto
  the pod in storage, past pod admission);
- on UPDATE (of the pod, its status or its ephemeral containers) the `gpuplace.io/*` annotations and
  the legacy `gpu-scheduling-map` annotation stay exactly as they were;
- a pod labelled `gpuplace.io/map` gets `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` only as the
  webhook wires them (fieldRefs on its binding's annotations), in every kind of container;
- a pod labelled `gpuplace.io/map` is created only with the binder's `schedulerName`, which the
  mutating webhook sets: while gpuplace is not installed (between an uninstall and an install; the
  chart keeps this policy) such a pod is refused, rather than started by another scheduler without
  its GPU wiring.

The Helm chart renders the same objects (a unit test compares them).
"""

from __future__ import annotations

import json
from typing import Any

from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    ENV_CUDA_DEVICE_ORDER,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LEGACY_ANNOTATION,
    MAP_LABEL,
    PREFIX,
)

POLICY_NAME = "gpuplace-pod-bindings"
#: The local cluster's copy: its own name, so that installing the chart there (which owns
#: POLICY_NAME) does not collide with it.
LOCAL_POLICY_NAME = "gpuplace-local-pod-bindings"
API_VERSION = "admissionregistration.k8s.io/v1"


def _q(text: str) -> str:
    return json.dumps(text)


def field_path(annotation: str) -> str:
    """The fieldRef path the webhook wires for an annotation."""
    return f"metadata.annotations['{annotation}']"


_ANNS = "has(object.metadata.annotations) ? object.metadata.annotations : {}"
_OLD_ANNS = (
    "oldObject != null && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"
)
_OURS = f"k.startsWith({_q(PREFIX)}) || k == {_q(LEGACY_ANNOTATION)}"


def _env_ok() -> str:
    cuda = _q(field_path(CUDA_ANNOTATION))
    devices = _q(field_path(DEVICES_ANNOTATION))
    return (
        f"!(e.name in [{_q(ENV_CUDA_VISIBLE_DEVICES)}, {_q(ENV_NVIDIA_VISIBLE_DEVICES)}, "
        f"{_q(ENV_CUDA_DEVICE_ORDER)}]) || "
        f"(e.name == {_q(ENV_CUDA_DEVICE_ORDER)} ? (has(e.value) && e.value == 'PCI_BUS_ID') : "
        "(has(e.valueFrom) && has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath == "
        f"(e.name == {_q(ENV_CUDA_VISIBLE_DEVICES)} ? {cuda} : {devices})))"
    )


DEFAULT_SCHEDULER = "gpuplace"


def policy_spec(scheduler_name: str = DEFAULT_SCHEDULER) -> dict[str, Any]:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["pods", "pods/status", "pods/ephemeralcontainers"],
                }
            ]
        },
        "variables": _variables(),
        "validations": [*_validations(), _scheduled_by_gpuplace(scheduler_name)],
    }


def _scheduled_by_gpuplace(scheduler_name: str) -> dict[str, str]:
    return {
        "expression": "request.operation != 'CREATE' || !variables.mapped || "
        f"(has(object.spec.schedulerName) && object.spec.schedulerName == {_q(scheduler_name)})",
        "messageExpression": f"'pods labelled {MAP_LABEL} are placed by gpuplace, and this one "
        "was not admitted by its webhook (schedulerName ' + (has(object.spec.schedulerName) ? "
        "object.spec.schedulerName : 'default-scheduler') + ', not "
        f"{scheduler_name}): gpuplace is not installed or its webhook is not running. Another "
        "scheduler would start it without its GPU wiring; install gpuplace (helm install, or "
        "sync its ArgoCD Application), or remove the label'",
        "reason": "Forbidden",
    }


def _variables() -> list[dict[str, str]]:
    """The annotations before and after, ours set at create (forged) or changed, and whether the
    pod is placed by a map."""
    return [
        {"name": "anns", "expression": _ANNS},
        {"name": "oldAnns", "expression": _OLD_ANNS},
        {
            "name": "forged",
            "expression": f"variables.anns.filter(k, k.startsWith({_q(PREFIX)}))",
        },
        {
            "name": "changed",
            "expression": f"variables.anns.filter(k, ({_OURS}) && "
            "!(k in variables.oldAnns && variables.oldAnns[k] == variables.anns[k]))"
            f" + variables.oldAnns.filter(k, ({_OURS}) && !(k in variables.anns))",
        },
        {
            "name": "mapped",
            "expression": "has(object.metadata.labels) && "
            f"{_q(MAP_LABEL)} in object.metadata.labels",
        },
    ]


def _validations() -> list[dict[str, str]]:
    """No gpuplace annotation at create, none changed later, and the GPU environment of a map's
    pod only as the webhook wires it."""
    # Three lists of three types: each is checked on its own (CEL will not concatenate them).
    env_checks = " && ".join(
        f"(!has(object.spec.{kind}) || object.spec.{kind}.all(c, "
        f"!has(c.env) || c.env.all(e, {_env_ok()})))"
        for kind in ("containers", "initContainers", "ephemeralContainers")
    )
    return [
        {
            "expression": "request.operation != 'CREATE' || size(variables.forged) == 0",
            "messageExpression": "'annotation(s) ' + variables.forged.join(', ') + "
            "' may not be set: gpuplace.io/* annotations are written only by the gpuplace "
            "binder, through the pod\\'s Binding; remove them (label the pod "
            f"{MAP_LABEL}=<map> to have it placed)'",
            "reason": "Forbidden",
        },
        {
            "expression": "request.operation != 'UPDATE' || size(variables.changed) == 0",
            "messageExpression": "'annotation(s) ' + variables.changed.join(', ') + "
            "' may not be changed: they record the pod\\'s GPU binding, which the gpuplace "
            "binder wrote and signed; delete and recreate the pod to place it again'",
            "reason": "Forbidden",
        },
        {
            "expression": f"!variables.mapped || ({env_checks})",
            "message": f"pods labelled {MAP_LABEL} get {ENV_CUDA_VISIBLE_DEVICES}, "
            f"{ENV_NVIDIA_VISIBLE_DEVICES} and {ENV_CUDA_DEVICE_ORDER} only as the gpuplace "
            "webhook wires them (from the binding's annotations); remove them from the "
            "containers",
            "reason": "Forbidden",
        },
    ]


def policy(
    name: str = POLICY_NAME,
    labels: dict[str, str] | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER,
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": policy_spec(scheduler_name),
    }


def policy_binding(name: str = POLICY_NAME, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
