"""One reader of a pod: the fields gpuplace reads, taken from the object once, for the controller's
pod events, the webhook's reviews and the CLI's lists alike.

`Pod.of` reads an object the apiserver returned (an informer's event, a LIST); `Pod.read` reads
one that anybody could have sent (an AdmissionReview posted to the webhook) and refuses a field of
the wrong type, naming it, with `MalformedPodError`. Both give the same view.

The view is Kubernetes' fields only; what gpuplace's own labels and annotations say is read from it
by `placement.podmeta`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeio.client import Obj
from kubeio.events import ObjectRef

TERMINAL_PHASES = ("Succeeded", "Failed")


class MalformedPodError(ValueError):
    """The object is not shaped like a pod (the apiserver never sends one)."""


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Container:
    """One init container or container of a pod, as far as gpuplace reads it."""

    list_name: str  # initContainers | containers
    name: str
    env: tuple[Mapping[str, Any], ...]  # spec.<list>[i].env, as written


CONTAINER_LISTS = ("initContainers", "containers")


@dataclass(frozen=True, slots=True)
class Pod:
    """The parts of a pod that gpuplace reads. `obj` is the object it was read from, for the
    write paths that send parts of it back (an Event's reference, a status patch)."""

    namespace: str
    name: str
    uid: str
    generate_name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_kind: str | None  # kind of the controller in ownerReferences
    created: str  # metadata.creationTimestamp
    deleting: bool  # metadata.deletionTimestamp is set
    node_name: str
    scheduler_name: str
    phase: str
    obj: Obj

    @classmethod
    def of(cls, obj: Obj) -> Pod:
        """A pod the apiserver returned: its fields have their API types."""
        meta = obj["metadata"]
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            namespace=meta.get("namespace") or "",
            name=meta.get("name") or "",
            uid=meta.get("uid") or "",
            generate_name=meta.get("generateName") or "",
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
            owner_kind=next(
                (o.get("kind") for o in meta.get("ownerReferences") or () if o.get("controller")),
                None,
            ),
            created=meta.get("creationTimestamp") or "",
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=spec.get("nodeName") or "",
            scheduler_name=spec.get("schedulerName") or "",
            phase=status.get("phase") or "",
            obj=obj,
        )

    @classmethod
    def read(cls, obj: Mapping[str, Any] | None, namespace: str = "") -> Pod:
        """A pod from an untrusted source: every field read is type-checked; `namespace` (the
        request's) wins over metadata.namespace. Raises MalformedPodError naming the field."""
        if obj is None:
            raise MalformedPodError("the review carries no pod")
        meta = mapping(obj.get("metadata"), "metadata")
        spec = required_object(obj.get("spec"), "spec")
        status = mapping(obj.get("status"), "status")
        namespace = namespace or string(meta.get("namespace"), "metadata.namespace")
        if not namespace:
            raise MalformedPodError("neither the request nor metadata.namespace names a namespace")
        return cls(
            namespace=namespace,
            name=string(meta.get("name"), "metadata.name"),
            uid=string(meta.get("uid"), "metadata.uid"),
            generate_name=string(meta.get("generateName"), "metadata.generateName"),
            labels=string_map(meta.get("labels"), "metadata.labels"),
            annotations=string_map(meta.get("annotations"), "metadata.annotations"),
            owner_kind=_controller_kind(meta.get("ownerReferences")),
            created=string(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=string(spec.get("nodeName"), "spec.nodeName"),
            scheduler_name=string(spec.get("schedulerName"), "spec.schedulerName"),
            phase=string(status.get("phase"), "status.phase"),
            obj=dict(obj),
        )

    def __str__(self) -> str:
        name = self.name or (f"{self.generate_name}<generated>" if self.generate_name else "<new>")
        return f"{self.namespace}/{name}"

    @property
    def key(self) -> str:
        """namespace/name"""
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Pod", self.namespace, self.name, self.uid)

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def generated(self) -> bool:
        """metadata.name came from metadata.generateName."""
        return bool(self.generate_name) and self.name.startswith(self.generate_name)

    def condition(self, kind: str, status: str = "True") -> Condition | None:
        """The pod's condition `kind` while its status is `status` (PodScheduled False: why the
        pod waits)."""
        for cond in (self.obj.get("status") or {}).get("conditions") or ():
            if cond.get("type") == kind and cond.get("status") == status:
                return Condition(
                    kind, status, str(cond.get("reason") or ""), str(cond.get("message") or "")
                )
        return None

    def has_claim(self, name: str) -> bool:
        """Whether spec.resourceClaims has an entry `name`."""
        entries = (self.obj.get("spec") or {}).get("resourceClaims") or ()
        return any(e.get("name") == name for e in entries)

    def containers(self) -> tuple[Container, ...]:
        """The init containers and containers, in that order (entries of another shape than the
        API's are skipped: the apiserver never sends them)."""
        spec = self.obj.get("spec") or {}
        out: list[Container] = []
        for list_name in CONTAINER_LISTS:
            for item in spec.get(list_name) or ():
                if not isinstance(item, Mapping):
                    continue
                env = item.get("env") or ()
                out.append(
                    Container(
                        list_name,
                        str(item.get("name") or ""),
                        tuple(e for e in env if isinstance(e, Mapping)),
                    )
                )
        return tuple(out)

    def generated_claim(self, name: str) -> str | None:
        """The ResourceClaim kube-controller-manager generated for entry `name` of
        spec.resourceClaims (status.resourceClaimStatuses); None until it has."""
        for entry in (self.obj.get("status") or {}).get("resourceClaimStatuses") or ():
            if entry.get("name") == name and entry.get("resourceClaimName"):
                return str(entry["resourceClaimName"])
        return None


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """An object field, or {} where it is missing or null."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedPodError(f"{where} must be an object")
    return value


def required_object(value: object, where: str) -> Mapping[str, Any]:
    """Like `mapping`, but null is refused too (a JSON patch writes into this object)."""
    if not isinstance(value, dict):
        raise MalformedPodError(f"{where} must be an object")
    return value


def string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedPodError(f"{where} must be a string")
    return value


def string_map(value: object, where: str) -> Mapping[str, str]:
    data = mapping(value, where)
    for key, item in data.items():
        if not isinstance(item, str):
            raise MalformedPodError(f"{where}[{key!r}] must be a string")
    return data


def _controller_kind(owners: object) -> str | None:
    if owners is None:
        return None
    if not isinstance(owners, list):
        raise MalformedPodError("metadata.ownerReferences must be a list")
    for i, owner in enumerate(owners):
        ref = mapping(owner, f"metadata.ownerReferences[{i}]")
        if ref.get("controller") is True:
            return string(ref.get("kind"), f"metadata.ownerReferences[{i}].kind")
    return None
