"""Pod admission: opted-in pods get the binder's schedulerName and env wired to their binding.

The env values are not known at admission (the binder decides later), so every container gets
fieldRefs on the annotations the binder's Binding writes; the kubelet resolves them when the
container starts, after binding. Pods that name a map or index the model does not have are refused
here, with the map and index in the message, instead of staying Pending forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeio.pod import MalformedPodError, Pod, required_object, string
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    ENV_CUDA_DEVICE_ORDER,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_NVIDIA_VISIBLE_DEVICES,
    INDEX_LABEL,
    LEGACY_ANNOTATION,
    MANAGED_ENV,
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
    name_ordinal,
    spoofed_annotations,
)
from placement.declared import Declared, declared_elsewhere
from placement.dra import POD_CLAIM_NAME, Enforcement, template_name
from placement.errors import PlacementError
from placement.gate import Path as GatePath
from placement.gate import Refusal, identify, judge
from placement.grants import GrantView
from placement.indexing import describe_source, resolve_index
from placement.legacy import LegacyEntry, declared_indices, own_line, shared_gpus
from placement.model import CompiledMap, Model
from placement.podmeta import identity_of, legacy_text_of
from placement.types import EnvMode, Indexing, MapKey
from webhook.jsonpatch import Operation, add, pointer, remove
from webhook.review import AdmissionRequest, Verdict
from webhook.settings import AdmissionSettings

CONTAINER_LISTS = ("initContainers", "containers")
DEFAULT_SCHEDULER = "default-scheduler"
#: How many index ranges a message lists before it elides the rest.
MAX_RANGES_SHOWN = 8


@dataclass(frozen=True, slots=True)
class ContainerEnv:
    list_name: str  # initContainers | containers
    position: int
    name: str
    env: tuple[Mapping[str, Any], ...] | None  # None: the container has no env list
    has_resources: bool = False
    claims: tuple[str, ...] | None = None  # resources.claims names; None: no such list


@dataclass(frozen=True, slots=True)
class PodView:
    """A pod under review: the one pod reader's view (`kubeio.pod.Pod`) and the parts of its spec
    that admission patches, each type-checked once."""

    pod: Pod
    containers: tuple[ContainerEnv, ...]
    #: spec.resourceClaims as (name, template or claim it names); None: no such list
    resource_claims: tuple[tuple[str, str], ...] | None = None

    def __str__(self) -> str:
        return str(self.pod)

    @property
    def namespace(self) -> str:
        return self.pod.namespace

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.pod.labels

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.pod.annotations


def _containers(spec: Mapping[str, Any]) -> tuple[ContainerEnv, ...]:
    out: list[ContainerEnv] = []
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if items is None:
            continue
        if not isinstance(items, list):
            raise MalformedPodError(f"spec.{list_name} must be a list")
        for i, item in enumerate(items):
            where = f"spec.{list_name}[{i}]"
            container = required_object(item, where)
            env = container.get("env")
            if env is not None:
                if not isinstance(env, list):
                    raise MalformedPodError(f"{where}.env must be a list")
                env = tuple(required_object(e, f"{where}.env[{j}]") for j, e in enumerate(env))
            name = string(container.get("name"), f"{where}.name")
            resources = container.get("resources")
            claims: tuple[str, ...] | None = None
            if resources is not None:
                raw = required_object(resources, f"{where}.resources").get("claims")
                if raw is not None:
                    if not isinstance(raw, list):
                        raise MalformedPodError(f"{where}.resources.claims must be a list")
                    claims = tuple(
                        string(
                            required_object(c, f"{where}.resources.claims[{j}]").get("name"),
                            "name",
                        )
                        for j, c in enumerate(raw)
                    )
            out.append(ContainerEnv(list_name, i, name, env, resources is not None, claims))
    return tuple(out)


def read_pod(obj: Mapping[str, Any] | None, namespace: str) -> PodView:
    """Checks the shape of every field admission touches; raises MalformedPodError naming the field."""
    pod = Pod.read(obj, namespace)
    spec = pod.obj["spec"]
    return PodView(pod, _containers(spec), _resource_claims(spec.get("resourceClaims")))


def _resource_claims(value: object) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedPodError("spec.resourceClaims must be a list")
    out = []
    for i, item in enumerate(value):
        entry = required_object(item, f"spec.resourceClaims[{i}]")
        # A template, as ours is, or a claim named directly (never ours, even under our name).
        template = entry.get("resourceClaimTemplateName")
        source = template if template else f"claim:{entry.get('resourceClaimName') or ''}"
        out.append(
            (
                string(entry.get("name"), f"spec.resourceClaims[{i}].name"),
                string(source, f"spec.resourceClaims[{i}]"),
            )
        )
    return tuple(out)


def _field_env(name: str, annotation: str) -> dict[str, Any]:
    path = f"metadata.annotations['{annotation}']"
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def wired_env(
    env_mode: EnvMode, enforcement: Enforcement = Enforcement.ENV
) -> tuple[dict[str, Any], ...]:
    """The entries every container gets, in the order they are inserted at the front of `env`.

    In dra enforcement the binder writes the UUIDs of the pod's own GPUs into the annotation (the
    only GPUs the container sees, so host indices would name the wrong ones), and the DRA driver,
    not the pod, sets NVIDIA_VISIBLE_DEVICES; a user-set value of it is still removed.
    """
    entries = [
        _field_env(ENV_CUDA_VISIBLE_DEVICES, CUDA_ANNOTATION),
        {"name": ENV_CUDA_DEVICE_ORDER, "value": "PCI_BUS_ID"},
    ]
    if env_mode is EnvMode.UUID and enforcement is Enforcement.ENV:
        entries.append(_field_env(ENV_NVIDIA_VISIBLE_DEVICES, DEVICES_ANNOTATION))
    return tuple(entries)


def _env_ops(
    container: ContainerEnv, wanted: tuple[dict[str, Any], ...]
) -> tuple[list[Operation], list[str]]:
    """Operations that put `wanted` first in the container's env and drop other values of them.

    Ours go first because `$(VAR)` in a later entry can only refer to entries before it; explicit
    `env` beats `envFrom`, so ConfigMap-provided values of these names lose as well.
    """
    base = pointer("spec", container.list_name, container.position, "env")
    if container.env is None:
        return [add(base, list(wanted))], []
    env = container.env
    managed = [i for i, e in enumerate(env) if e.get("name") in MANAGED_ENV]
    if tuple(env[: len(wanted)]) == wanted and managed == list(range(len(wanted))):
        return [], []  # already wired (a pod re-created from `kubectl get -o yaml`)
    ops = [remove(f"{base}/{i}") for i in reversed(managed)]
    ops.extend(add(f"{base}/{k}", entry) for k, entry in enumerate(wanted))
    replaced = [str(env[i].get("name")) for i in managed if env[i] not in wanted]
    return ops, replaced


def _wiring(
    pod: PodView,
    env_mode: EnvMode,
    scheduler_name: str | None,
    enforcement: Enforcement = Enforcement.ENV,
) -> tuple[tuple[Operation, ...], tuple[str, ...]]:
    ops: list[Operation] = []
    warnings: list[str] = []
    spoofed = sorted(spoofed_annotations(pod.annotations))
    ops.extend(remove(pointer("metadata", "annotations", key)) for key in spoofed)
    if spoofed:
        warnings.append(
            f"removed annotation(s) {', '.join(spoofed)}: only the gpuplace binder sets gpuplace.io/*"
        )
    if scheduler_name is not None and pod.pod.scheduler_name != scheduler_name:
        ops.append(add(pointer("spec", "schedulerName"), scheduler_name))
        if pod.pod.scheduler_name not in ("", DEFAULT_SCHEDULER):
            warnings.append(
                f"spec.schedulerName {pod.pod.scheduler_name!r} replaced by {scheduler_name!r}: "
                f"pods with label {MAP_LABEL} are placed by the gpuplace binder"
            )
    wanted = wired_env(env_mode, enforcement)
    replaced: dict[str, list[str]] = {}
    for container in pod.containers:
        container_ops, names = _env_ops(container, wanted)
        ops.extend(container_ops)
        for name in names:
            replaced.setdefault(name, []).append(container.name or str(container.position))
    for name, containers in sorted(replaced.items()):
        warnings.append(
            f"env {name} in container(s) {', '.join(containers)} replaced: "
            "gpuplace sets it from the pod's binding"
        )
    return tuple(ops), tuple(warnings)


def describe_indices(indices: Iterable[int]) -> str:
    """`0-3, 5, 8-9`: sorted indices as ranges, eliding after a few."""
    ranges: list[tuple[int, int]] = []
    for i in indices:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:MAX_RANGES_SHOWN]]
    if len(ranges) > MAX_RANGES_SHOWN:
        shown.append("...")
    return ", ".join(shown) or "none"


def _shared_lines(cmap: CompiledMap, index: int) -> list[str]:
    """Warnings for the GPUs that slot `index` shares with other lines of legacy text."""
    slot = cmap.slots.get(index)
    if slot is None or not cmap.legacy_sharing:
        return []
    out = []
    for position, gpu in enumerate(slot.gpus):
        partners = [i for i in cmap.sorted_indices if cmap.lines_share(index, i, gpu)]
        if partners:
            indices = describe_indices(sorted([index, *partners]))
            device = slot.device_indices[position] if slot.device_indices else gpu
            out.append(
                f"placement map {cmap.key}: GPU {device} on node {slot.node} is given to indices "
                f"{indices} by its spec.map lines: their pods share it, as the earlier tools did"
            )
    return out


def _admit_mapped(pod: PodView, model: Model, settings: AdmissionSettings) -> Verdict:
    key = MapKey(pod.namespace, pod.labels[MAP_LABEL])
    cmap: CompiledMap | None = model.maps.get(key)
    if cmap is None:
        guess = resolve_index(identity_of(pod.pod), Indexing.AUTO)
        index = f" (index {guess.index})" if guess.index is not None else ""
        return Verdict.deny(
            f"pod {pod}{index}: label {MAP_LABEL}={key.name!r} names placement map {key}, which "
            f"does not exist or has never been valid; apply ConfigMap {key.name!r} in namespace "
            f"{key.namespace!r} with label {PLACEMENT_MAP_LABEL}=true and key placement.yaml, "
            f"and check its {STATUS_ANNOTATION} annotation"
        )
    choice = resolve_index(identity_of(pod.pod), cmap.indexing, cmap.ranks)
    if choice.error:
        return Verdict.deny(f"pod {pod}: placement map {key}: {choice.error}")
    if pod.pod.node_name:
        return Verdict.deny(
            f"pod {pod}: spec.nodeName {pod.pod.node_name!r} is set, but pods with label {MAP_LABEL} "
            "are bound by the gpuplace binder; remove spec.nodeName"
        )
    warnings: list[str] = []
    if choice.index is not None:
        slot = cmap.slots.get(choice.index)
        if slot is None:
            return Verdict.deny(
                f"pod {pod}: placement map {key} has no index {choice.index} (from "
                f"{describe_source(choice, cmap.ranks)}); it declares "
                f"{describe_indices(cmap.sorted_indices)}; "
                f"declare index {choice.index} in the map or run fewer replicas"
            )
        warnings.extend(_shared_lines(cmap, choice.index))
        if slot.blocked:
            detail = f": {slot.message}" if slot.message else ""
            warnings.append(
                f"placement map {key} index {choice.index} is not served now ({slot.blocked}"
                f"{detail}); the pod stays Pending until it is"
            )
    elif INDEX_LABEL in pod.labels and cmap.indexing is Indexing.ALLOCATE:
        warnings.append(
            f"label {INDEX_LABEL} is ignored: placement map {key} uses 'indexing: allocate'"
        )
    if LEGACY_ANNOTATION in pod.annotations:
        warnings.append(f"annotation {LEGACY_ANNOTATION} is ignored: label {MAP_LABEL} is set")
    claim_ops: list[Operation] = []
    if settings.enforcement is Enforcement.DRA:
        conflict = foreign_claims(pod)
        if conflict:
            return Verdict.deny(
                f"pod {pod}: placement map {key} is enforced through DRA: gpuplace gives the pod "
                f"one ResourceClaim ({POD_CLAIM_NAME!r}, from ResourceClaimTemplate "
                f"{template_name(key.name)!r}) and allocates it to the declared GPUs; "
                f"{conflict}, which nothing would allocate (kube-scheduler does not schedule "
                "gpuplace's pods); remove them"
            )
        claim_ops = claim_wiring(pod, template_name(key.name))
    ops, wiring_warnings = _wiring(
        pod, cmap.env_mode, settings.scheduler_name, settings.enforcement
    )
    return Verdict(True, patch=(*claim_ops, *ops), warnings=(*warnings, *wiring_warnings))


def foreign_claims(pod: PodView) -> str:
    """What, in a pod of a dra map, names a claim other than gpuplace's; empty if nothing."""
    found = [
        f"spec.resourceClaims[{i}] {name!r}"
        for i, (name, _source) in enumerate(pod.resource_claims or ())
        if name != POD_CLAIM_NAME
    ]
    for container in pod.containers:
        for j, name in enumerate(container.claims or ()):
            if name != POD_CLAIM_NAME:
                found.append(
                    f"spec.{container.list_name}[{container.position}].resources.claims[{j}] {name!r}"
                )
    return "it also carries " + ", ".join(found) if found else ""


def claim_wiring(pod: PodView, template: str) -> list[Operation]:
    """Operations that give the pod the map's claim and every container a reference to it."""
    ops: list[Operation] = []
    entry = {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": template}
    if pod.resource_claims is None:
        ops.append(add(pointer("spec", "resourceClaims"), [entry]))
    elif (POD_CLAIM_NAME, template) not in pod.resource_claims:
        # Ours under another source (a pod copied from another map): the map decides.
        for i in reversed(range(len(pod.resource_claims))):
            ops.append(remove(pointer("spec", "resourceClaims", i)))
        ops.append(add(pointer("spec", "resourceClaims", "-"), entry))
    for container in pod.containers:
        base = pointer("spec", container.list_name, container.position, "resources")
        if not container.has_resources:
            ops.append(add(base, {"claims": [{"name": POD_CLAIM_NAME}]}))
        elif container.claims is None:
            ops.append(add(f"{base}/claims", [{"name": POD_CLAIM_NAME}]))
        elif POD_CLAIM_NAME not in container.claims:
            ops.append(add(f"{base}/claims/-", {"name": POD_CLAIM_NAME}))
    return ops


def _admit_legacy(pod: PodView, model: Model) -> Verdict:
    source = f"pod {pod} annotation {LEGACY_ANNOTATION}"
    text = legacy_text_of(pod.pod) or ""
    # Refused before the text is read: the admission loop answers every other team's pods too.
    if name_ordinal(pod.name) is None:
        return Verdict.deny(
            f"pod {pod}: pods using annotation {LEGACY_ANNOTATION} take their index from the name's "
            "'-<n>' suffix, and this name has none; run them as a StatefulSet"
        )
    try:
        line = own_line(text, pod.name, source)
    except PlacementError as exc:
        return Verdict.deny(exc.format(), code=422, reason="Invalid")
    index, entry = line.index, line.entry
    if entry is None or index is None:
        declared = declared_indices(text)
        if not declared:
            return Verdict.deny(
                f"{source}: the map has no entries (expected lines like '0=node1:0,1')",
                code=422,
                reason="Invalid",
            )
        return Verdict.deny(
            f"pod {pod}: annotation {LEGACY_ANNOTATION} has no line for index {index} (the pod "
            f"name's suffix); it declares {describe_indices(declared)}"
        )
    refusal = _gate_line(pod, entry, model.grants)
    if refusal is not None:
        return Verdict.deny(f"{source}:{entry.line}:{entry.node_column}: error: {refusal}")
    if pod.pod.node_name:
        taken = declared_elsewhere(
            model, pod.namespace, pod.name, pod.pod.node_name, identify(None, entry.devices)
        )
        if taken is not None:
            return Verdict.deny(_squatting(pod, f"{source}:{entry.line}", taken))
    sharing = [
        f"annotation {LEGACY_ANNOTATION}: {shared.describe()}"
        for shared in shared_gpus(line.entries)
        if index in shared.indices
    ]
    ops, warnings = _wiring(pod, EnvMode.INDEX, None)
    return Verdict(True, patch=ops, warnings=(*sharing, *warnings))


def _squatting(pod: PodView, where: str, taken: Declared) -> str:
    return (
        f"{where}: error: pod {pod} is created bound to node {taken.node} (spec.nodeName), but "
        f"{taken}; a pod that no scheduler placed may not take it: remove spec.nodeName and let "
        "the binder place the pod, or give it another GPU"
    )


def _gate_line(pod: PodView, entry: LegacyEntry, grants: GrantView) -> Refusal | None:
    """The gate on what the line gives the pod: the node the line's name resolves to (the
    published grants carry the logical names, with or without a policy) and the GPUs it names;
    a pod created already bound (spec.nodeName) must run on that very node."""
    node = grants.node_of(entry.node)
    bound_to = pod.pod.node_name or None
    return judge(
        grants,
        pod.namespace,
        GatePath.PREBOUND if bound_to else GatePath.LEGACY,
        node,
        identify(None, entry.devices),
        written=entry.node,
        bound_to=bound_to,
    )


def admit_pod(request: AdmissionRequest, model: Model, settings: AdmissionSettings) -> Verdict:
    """The decision for one pod review; pods that did not opt in are admitted unchanged."""
    if request.operation != "CREATE" or request.sub_resource:
        return Verdict(True)
    try:
        pod = read_pod(request.object, request.namespace)
    except MalformedPodError as exc:
        return Verdict.deny(
            f"pod {request.namespace}/{request.name}: {exc}", code=400, reason="BadRequest"
        )
    if MAP_LABEL in pod.labels:
        return _admit_mapped(pod, model, settings)
    if (
        settings.legacy_mode
        and LEGACY_ANNOTATION in pod.annotations
        and pod.pod.scheduler_name in settings.legacy_scheduler_names
    ):
        return _admit_legacy(pod, model)
    return Verdict(True)
