"""Every label and annotation key gpuplace reads or writes, with their codecs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from placement.errors import Diagnostic, Location
from placement.types import GpuUuid, MapKey, NodeName

PREFIX = "gpuplace.io/"
MAP_LABEL = "gpuplace.io/map"
INDEX_LABEL = "gpuplace.io/index"
PLACEMENT_MAP_LABEL = "gpuplace.io/placement-map"
PLACEMENT_KEY = "placement.yaml"
STATUS_ANNOTATION = "gpuplace.io/status"
STATEFULSET_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# The ranks that training workloads' controllers write on their pods (placement/indexing.py).
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # label and annotation
JOBSET_GLOBAL_INDEX_LABEL = "jobset.sigs.k8s.io/job-global-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
KUEUE_POD_GROUP_INDEX_LABEL = "kueue.x-k8s.io/pod-group-pod-index"

NODE_ANNOTATION = "gpuplace.io/node"
INDEX_ANNOTATION = "gpuplace.io/index"
DEVICES_ANNOTATION = "gpuplace.io/devices"
CUDA_ANNOTATION = "gpuplace.io/cuda-visible-devices"
GENERATION_ANNOTATION = "gpuplace.io/model-generation"
#: Which map the slot belongs to (needed for legacy pods, whose map has no label).
MAP_ANNOTATION = "gpuplace.io/map"
#: HMAC of the pod's uid and every other gpuplace.io/* annotation of its Binding, keyed by the
#: binding key only the controller reads: a holding nobody else can write or rewrite.
SIGNATURE_ANNOTATION = "gpuplace.io/signature"
#: `v2:<key id>:<mac>`: the key id names the key of the ring (placement/keyring.py) that signed.
SIGNATURE_VERSION = "v2"
SIGNATURE_V1 = "v1"
#: Pod condition: the pod's binding is signed with a key the ring no longer holds (the key was
#: lost), so gpuplace cannot verify it; its GPUs stay blocked until `gpuplace key adopt`.
UNVERIFIABLE_CONDITION = "gpuplace.io/BindingUnverifiable"

#: Provenance. On a source ConfigMap: the git revision its content came from (stamped by the
#: ApplicationSet of argocd/ or the git source), the directory of the Application that renders it,
#: and the map file (relative to that directory, or to the repository when no directory is set).
#: On a pod: the revision and file of the map version that placed it.
REVISION_ANNOTATION = "gpuplace.io/revision"
SOURCE_PATH_ANNOTATION = "gpuplace.io/source-path"
SOURCE_FILE_ANNOTATION = "gpuplace.io/source-file"
#: kustomize's `buildMetadata: [originAnnotations]`: on a resource read from a file (a PlacementMap
#: listed under `resources:`), YAML naming that file (`path:`, relative to the directory built, or
#: to a remote `repo:`). The map's file when no gpuplace.io/source-file is stamped.
ORIGIN_ANNOTATION = "config.kubernetes.io/origin"

#: Pod condition of a bound pod whose slot its map no longer declares as bound.
DRIFTED_CONDITION = "gpuplace.io/Drifted"

#: Pod condition: the node's GPUs were renumbered under the pod (its NVML indices now name other
#: GPUs than the ones it was bound to).
RENUMBERED_CONDITION = "DevicesRenumbered"
LEGACY_ANNOTATION = "gpu-scheduling-map"
LEGACY_NODE_LABEL = "gpu-node-name"
#: Node label (NVIDIA GPU feature discovery): the NVLink domain (clique) of the node's GPUs.
CLIQUE_LABEL = "nvidia.com/gpu.clique"
LEGACY_MAP_PREFIX = "legacy."

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MANAGED_ENV = (ENV_CUDA_VISIBLE_DEVICES, ENV_CUDA_DEVICE_ORDER, ENV_NVIDIA_VISIBLE_DEVICES)

_ORDINAL_RE = re.compile(r"-(\d+)$")


@dataclass(frozen=True, slots=True)
class BindingDecision:
    """What the binder decided for one pod; written as annotations in the Binding."""

    map: MapKey
    index: int
    node: NodeName
    devices: tuple[GpuUuid, ...]
    cuda_visible_devices: str
    model_generation: int
    revision: str = ""  # git revision of the map version that placed the pod, when known
    source_file: str = ""  # its file in git, when known


def encode_binding(decision: BindingDecision) -> dict[str, str]:
    out = {
        MAP_ANNOTATION: decision.map.name,
        NODE_ANNOTATION: decision.node,
        INDEX_ANNOTATION: str(decision.index),
        DEVICES_ANNOTATION: ",".join(decision.devices),
        CUDA_ANNOTATION: decision.cuda_visible_devices,
        GENERATION_ANNOTATION: str(decision.model_generation),
    }
    if decision.revision:
        out[REVISION_ANNOTATION] = decision.revision
    if decision.source_file:
        out[SOURCE_FILE_ANNOTATION] = decision.source_file
    return out


#: The longest value each provenance annotation of a source map may have, in characters. Whoever
#: may write a map writes them, and they travel into the model and onto every pod the map places
#: (the Binding's gpuplace.io/revision and gpuplace.io/source-file), so they are bounded where
#: they are read: a revision is a commit id or a tag, a path one inside a repository. The file
#: they name together is at most MAX_SOURCE_PATH + MAX_SOURCE_FILE + 1 characters, or
#: MAX_ORIGIN + 2 from kustomize's origin annotation.
PROVENANCE_LIMITS: Mapping[str, int] = {
    REVISION_ANNOTATION: 128,
    SOURCE_PATH_ANNOTATION: 256,
    SOURCE_FILE_ANNOTATION: 512,
    ORIGIN_ANNOTATION: 1024,
}
MAX_REVISION = PROVENANCE_LIMITS[REVISION_ANNOTATION]
MAX_SOURCE_PATH = PROVENANCE_LIMITS[SOURCE_PATH_ANNOTATION]
MAX_SOURCE_FILE = PROVENANCE_LIMITS[SOURCE_FILE_ANNOTATION]
MAX_ORIGIN = PROVENANCE_LIMITS[ORIGIN_ANNOTATION]


def provenance_problems(
    annotations: Mapping[str, object],
    source: str,
    before: Mapping[str, object] | None = None,
) -> tuple[Diagnostic, ...]:
    """Each provenance annotation of a source map longer than its limit (PROVENANCE_LIMITS),
    located at `source`'s field. With `before` (the annotations of the object an update
    replaces), only those that changed: an object that already carries one is refused by the
    controller, and its other writes (its status) are not blocked."""
    problems = []
    for key, limit in PROVENANCE_LIMITS.items():
        value = annotations.get(key)
        if not isinstance(value, str) or len(value) <= limit:
            continue
        if before is not None and before.get(key) == value:
            continue
        problems.append(
            Diagnostic(
                Location(source, path=f"metadata.annotations[{key}]"),
                f"{len(value)} characters, more than the {limit} this annotation may have: "
                "it is copied into the model and onto every pod the map places",
                hint="stamp a commit id or tag as the revision and paths inside the repository "
                "as the source path and file",
            )
        )
    return tuple(problems)


def source_provenance(annotations: Mapping[str, str]) -> tuple[str, str]:
    """(revision, file) stamped on a source map (ConfigMap or custom resource); the file joined to
    the source path. Without gpuplace.io/source-file, the file kustomize's origin annotation
    names. An annotation longer than its limit is not read (`provenance_problems` reports it)."""

    def read(key: str) -> str:
        value = annotations.get(key, "")
        return value if len(value) <= PROVENANCE_LIMITS[key] else ""

    revision = read(REVISION_ANNOTATION).strip()
    file = read(SOURCE_FILE_ANNOTATION).strip()
    base = read(SOURCE_PATH_ANNOTATION).strip().strip("/")
    if not file:
        repo, path = kustomize_origin(read(ORIGIN_ANNOTATION))
        if repo and path:  # a remote base's file: not under this Application's directory
            return revision, f"{repo.rstrip('/')}//{path.lstrip('/')}"
        if path:
            return revision, posixpath.normpath(posixpath.join(base, path.lstrip("/")))
    if base and file:
        file = file.lstrip("/") if file.startswith("/") else f"{base}/{file.removeprefix('./')}"
    elif base:
        file = base
    return revision, file


def kustomize_origin(text: str) -> tuple[str, str]:
    """(repo, path) of a `config.kubernetes.io/origin` annotation: repo "" for a local file, path
    "" for a generated resource or for text that is not kustomize's. Read line by line: kustomize
    writes flat `key: value` YAML, and an annotation is untrusted text no YAML parser needs."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key in ("path", "repo"):
            fields[key] = value.strip().strip("'\"").strip()
    return fields.get("repo", ""), fields.get("path", "")


def decode_binding(namespace: str, annotations: Mapping[str, str]) -> BindingDecision | None:
    """The decision recorded on a bound pod, or None if the pod carries none (or a broken one)."""
    try:
        return BindingDecision(
            map=MapKey(namespace, annotations[MAP_ANNOTATION]),
            index=int(annotations[INDEX_ANNOTATION]),
            node=NodeName(annotations[NODE_ANNOTATION]),
            devices=tuple(GpuUuid(d) for d in annotations[DEVICES_ANNOTATION].split(",") if d),
            cuda_visible_devices=annotations[CUDA_ANNOTATION],
            model_generation=int(annotations[GENERATION_ANNOTATION]),
            revision=annotations.get(REVISION_ANNOTATION, ""),
            source_file=annotations.get(SOURCE_FILE_ANNOTATION, ""),
        )
    except (KeyError, ValueError):
        return None


def _signed_text(version: str, uid: str, namespace: str, annotations: Mapping[str, str]) -> bytes:
    # Every gpuplace.io/* annotation but the signature, so that an annotation added to the Binding
    # later (a revision, say) is covered without a new format; sorted, one `key=value` a line.
    fields = sorted(
        (k, v) for k, v in annotations.items() if k.startswith(PREFIX) and k != SIGNATURE_ANNOTATION
    )
    lines = [version, uid, namespace, *(f"{k}={v}" for k, v in fields)]
    return "\n".join(lines).encode()


def _mac(secret: bytes, text: bytes) -> str:
    digest = hmac.new(secret, text, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Signature:
    """A parsed signature annotation: `v2:<key id>:<mac>`, or `v1:<mac>` (releases before the key
    ring, signed with the one key of the time; it names no key)."""

    version: str
    key_id: str  # "" for v1
    mac: str

    @classmethod
    def parse(cls, value: str) -> Signature | None:
        parts = value.split(":")
        if len(parts) == 2 and parts[0] == SIGNATURE_V1 and parts[1]:
            return cls(SIGNATURE_V1, "", parts[1])
        if len(parts) == 3 and parts[0] == SIGNATURE_VERSION and parts[1] and parts[2]:
            return cls(SIGNATURE_VERSION, parts[1], parts[2])
        return None

    def text(self) -> str:
        if self.version == SIGNATURE_V1:
            return f"{SIGNATURE_V1}:{self.mac}"
        return f"{self.version}:{self.key_id}:{self.mac}"


def sign_binding(
    secret: bytes, key_id: str, uid: str, namespace: str, annotations: Mapping[str, str]
) -> str:
    """The signature annotation's value for a Binding with these annotations, for pod `uid`,
    made with the ring's key `key_id` whose bytes are `secret`."""
    text = _signed_text(f"{SIGNATURE_VERSION}:{key_id}", uid, namespace, annotations)
    return Signature(SIGNATURE_VERSION, key_id, _mac(secret, text)).text()


def signed_binding(
    secret: bytes, key_id: str, uid: str, namespace: str, decision: BindingDecision
) -> dict[str, str]:
    """The Binding's annotations: the decision and its signature."""
    annotations = encode_binding(decision)
    annotations[SIGNATURE_ANNOTATION] = sign_binding(secret, key_id, uid, namespace, annotations)
    return annotations


def signature_of(annotations: Mapping[str, str]) -> Signature | None:
    """The pod's signature annotation, parsed; None when absent or malformed."""
    given = annotations.get(SIGNATURE_ANNOTATION)
    return Signature.parse(given) if given else None


def verify_binding(secret: bytes, uid: str, namespace: str, annotations: Mapping[str, str]) -> bool:
    """Whether a pod's gpuplace.io/* annotations are exactly what the binder signed for it with
    the key whose bytes are `secret` (a v2 signature's key id is covered by its MAC)."""
    signature = signature_of(annotations)
    return signature is not None and verify_signature(
        secret, signature, uid, namespace, annotations
    )


def verify_signature(
    secret: bytes, signature: Signature, uid: str, namespace: str, annotations: Mapping[str, str]
) -> bool:
    """`verify_binding` for a signature already read from those annotations."""
    version = signature.version
    if version == SIGNATURE_VERSION:
        version = f"{SIGNATURE_VERSION}:{signature.key_id}"
    expected = _mac(secret, _signed_text(version, uid, namespace, annotations))
    return hmac.compare_digest(signature.mac, expected)


def binding_digest(annotations: Mapping[str, str]) -> str:
    """A fingerprint of every gpuplace.io/* annotation of a pod, signature included: what an
    adoption record names, so that it covers exactly the binding the administrator saw."""
    fields = sorted((k, v) for k, v in annotations.items() if k.startswith(PREFIX))
    text = "\n".join(f"{k}={v}" for k, v in fields).encode()
    return hashlib.sha256(text).hexdigest()


def has_binding_annotations(annotations: Mapping[str, str]) -> bool:
    """Whether the pod carries any gpuplace.io/* annotation (a binding, whole or forged)."""
    return any(k.startswith(PREFIX) for k in annotations)


def name_ordinal(name: str) -> int | None:
    """The `-<digits>` suffix of a pod name (StatefulSet ordinal, legacy index)."""
    match = _ORDINAL_RE.search(name)
    return int(match.group(1)) if match else None


def legacy_map_key(namespace: str, pod_name: str) -> MapKey:
    """The slot namespace of a legacy pod: its name without the ordinal (its StatefulSet)."""
    base = _ORDINAL_RE.sub("", pod_name) or pod_name
    return MapKey(namespace, f"{LEGACY_MAP_PREFIX}{base}")


def spoofed_annotations(annotations: Mapping[str, str]) -> list[str]:
    """User-set gpuplace.io/* annotations that admission removes (only the binder may set them)."""
    return [k for k in annotations if k.startswith(PREFIX)]


def source_name(key: MapKey) -> str:
    """Where a map's text is in the cluster, as located errors name it."""
    return f"configmap {key} {PLACEMENT_KEY}"
