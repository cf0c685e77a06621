"""The compiled model: what the binder and webhook serve, and its ConfigMap codec.

The model lives in ConfigMaps in `gpuplace-system`: a manifest `gpuplace-model` naming the shards and
the generation, and shards `gpuplace-model-<n>` holding whole maps, placed by a stable hash so that a
change to one map rewrites one shard. Every shard stays under 900 KiB.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from placement.bulk import without_cycle_collection
from placement.devices import UNDECLARED, DeclaredDevices, GpuId, gpu_ids
from placement.grants import GRANTS_CONFIGMAP, GRANTS_KEY, GrantView
from placement.indexing import RankRules
from placement.maps import Gang, MigRequest, Rollout
from placement.reasons import Reason
from placement.taints import Toleration
from placement.types import (
    DeviceRef,
    EnvMode,
    GpuUuid,
    Indexing,
    MapKey,
    NodeName,
    RolloutStrategy,
    Sharing,
    SlotKey,
)

MODEL_NAMESPACE = "gpuplace-system"
MANIFEST_NAME = "gpuplace-model"
SHARD_PREFIX = "gpuplace-model-"
MANIFEST_KEY = "manifest.json"
SHARD_KEY = "model.json"
MODEL_LABEL = "gpuplace.io/model"
MAX_SHARD_BYTES = 900 * 1024


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A slot's MIG instance: what the map asked for, and the parent GPU it resolved to (its
    UUID; empty while unresolved). The instance's own UUID is the slot's one device."""

    request: MigRequest
    parent: GpuUuid | Literal[""] = ""

    def describe(self, uuid: str) -> str:
        """`gpu 0 / 3g.40gb (MIG-…)`: how status and explain show the slot's instance."""
        return f"{self.request} ({uuid})" if uuid else str(self.request)

    def encode(self) -> list[str]:
        return [str(self.request.gpu), self.request.profile, self.parent]

    @classmethod
    def decode(cls, row: Any) -> MigSlot:
        gpu, profile, parent = (str(v) for v in row)
        ref = int(gpu) if gpu.isdecimal() else GpuUuid(gpu)
        return cls(MigRequest(ref, profile), GpuUuid(parent) if parent else "")


@dataclass(frozen=True, slots=True)
class CompiledSlot:
    index: int
    node: NodeName
    devices: tuple[GpuUuid, ...] = ()  # resolved UUIDs; empty while the node's inventory is unknown
    device_indices: tuple[int, ...] = ()  # NVML indices; empty when declared by UUID and unresolved
    declared: DeclaredDevices = UNDECLARED  # as the map wrote it
    blocked: Reason | Literal[""] = ""  # why this slot is not served now (e.g. SlotConflict)
    message: str = ""
    #: Set for a slot of one MIG instance: `devices` then holds the instance's MIG UUID and
    #: `device_indices` the parent GPU's NVML index.
    mig: MigSlot | None = None

    def cuda_visible_devices(self, env_mode: EnvMode) -> str:
        # An index would name the parent GPU: a MIG instance is reached by its UUID only.
        if env_mode is EnvMode.UUID or self.mig is not None:
            return ",".join(self.devices)
        return ",".join(str(i) for i in self.device_indices)

    @property
    def gpus(self) -> tuple[GpuId, ...]:
        """The GPUs this slot holds, as the binder counts them: UUIDs, or NVML indices until the
        node's inventory resolves them."""
        return gpu_ids(self.devices, self.device_indices)

    @property
    def resolved(self) -> bool:
        return bool(self.devices) and len(self.devices) == len(self.device_indices)


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a map's content came from: the git revision and the file, as its source stamped
    them (the ApplicationSet of argocd/, the git source, `gpuplace render`); empty when unknown."""

    revision: str = ""
    file: str = ""

    def describe(self) -> str:
        if not self.revision and not self.file:
            return "unknown revision"
        where = f" ({self.file})" if self.file else ""
        return f"revision {self.revision or 'unknown'}{where}"


@dataclass(frozen=True, slots=True)
class CompiledMap:
    key: MapKey
    slots: Mapping[int, CompiledSlot]
    sharing: Sharing = Sharing.EXCLUSIVE
    indexing: Indexing = Indexing.AUTO
    env_mode: EnvMode = EnvMode.INDEX
    generation: int = 0  # model generation in which this map last changed
    source_version: str = ""  # digest of the source text compiled
    #: Slots of this map that name the same GPU share it (legacy text, see placement.legacy).
    legacy_sharing: bool = False
    rollout: Rollout = field(default_factory=Rollout)
    provenance: Provenance = field(default_factory=Provenance)
    #: Slot index -> the DRA device taints its devices may carry (only slots that declare some).
    tolerations: Mapping[int, tuple[Toleration, ...]] = field(default_factory=dict)
    #: Slot index -> its spare GPUs as the map wrote them (only slots that list some): kept so
    #: that a map rebuilt from the model (placement/restore.py) keeps its spares.
    fallback: Mapping[int, tuple[DeviceRef, ...]] = field(default_factory=dict)
    #: All slots' nodes must carry one GPU clique label value.
    same_clique: bool = False
    #: spec.indexLabel and spec.podsPerJob (placement/indexing.py).
    ranks: RankRules = field(default_factory=RankRules)
    #: spec.gang: the slots bind together or not at all (placement/gang.py).
    gang: Gang | None = None
    sorted_indices: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.slots, MappingProxyType):
            object.__setattr__(self, "slots", MappingProxyType(dict(self.slots)))
        if not isinstance(self.tolerations, MappingProxyType):
            object.__setattr__(self, "tolerations", MappingProxyType(dict(self.tolerations)))
        if not isinstance(self.fallback, MappingProxyType):
            object.__setattr__(self, "fallback", MappingProxyType(dict(self.fallback)))
        object.__setattr__(self, "sorted_indices", tuple(sorted(self.slots)))

    def lines_share(self, index: int, other: int, gpu: str) -> bool:
        """Whether slots `index` and `other` of this map may hold `gpu` (a UUID, or "#<index>"
        while unresolved) together: both name it in legacy text whose lines share."""
        if not self.legacy_sharing or index == other:
            return False
        mine, theirs = self.slots.get(index), self.slots.get(other)
        return (
            mine is not None
            and theirs is not None
            and mine.node == theirs.node
            and gpu in mine.gpus
            and gpu in theirs.gpus
        )

    def content_equal(self, other: CompiledMap) -> bool:
        """Equal apart from the generation stamp."""
        return encode_map(self, include_generation=False) == encode_map(
            other, include_generation=False
        )


@dataclass(frozen=True, slots=True)
class Model:
    generation: int = 0
    maps: Mapping[MapKey, CompiledMap] = field(default_factory=dict)
    #: Which namespaces may place where (the placement policy resolved against the nodes).
    grants: GrantView = field(default_factory=GrantView)
    #: (node, GPU) -> the served slots that declare it: built on first use (`declared_by`).
    _declared: dict[tuple[str, str], tuple[SlotKey, ...]] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.maps, MappingProxyType):
            object.__setattr__(self, "maps", MappingProxyType(dict(self.maps)))

    def declared_by(self, node: str, gpu: str) -> tuple[SlotKey, ...]:
        """The served (not blocked) slots that declare `gpu` (a UUID, or an NVML index as
        `GpuId`) on `node`, a MIG slot its parent GPU too. The index is built once per model, off
        the map pods' path: only pods placed outside the model (legacy lines) ask."""
        index = self._declared
        if index is None:
            built: dict[tuple[str, str], list[SlotKey]] = {}
            for key, cmap in self.maps.items():
                for slot in cmap.slots.values():
                    if slot.blocked:
                        continue
                    gpus: list[str] = list(slot.gpus)
                    if slot.device_indices and slot.devices and slot.mig is None:
                        gpus += gpu_ids((), slot.device_indices)
                    if slot.mig is not None and slot.mig.parent:
                        gpus.append(GpuId.of_uuid(slot.mig.parent))
                    for one in gpus:
                        built.setdefault((slot.node, one), []).append(SlotKey(key, slot.index))
            index = {k: tuple(v) for k, v in built.items()}
            object.__setattr__(self, "_declared", index)
        return index.get((node, gpu), ())

    def slot(self, key: MapKey, index: int) -> CompiledSlot | None:
        cmap = self.maps.get(key)
        return None if cmap is None else cmap.slots.get(index)

    def tolerations(self, key: MapKey, index: int) -> tuple[Toleration, ...]:
        """The DRA taint tolerations of a slot that its namespace's grants let it hold on its
        node: every check of taints and every claim allocation reads them here, so a toleration
        the grants do not give is ignored, never honoured."""
        cmap = self.maps.get(key)
        if cmap is None:
            return ()
        held, slot = cmap.tolerations.get(index, ()), cmap.slots.get(index)
        if not held or slot is None:
            return ()
        return self.grants.granted_tolerations(key.namespace, slot.node, held)


def encode_map(cmap: CompiledMap, *, include_generation: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sharing": cmap.sharing.value,
        "indexing": cmap.indexing.value,
        "envMode": cmap.env_mode.value,
        "sourceVersion": cmap.source_version,
        # One compact row a slot keeps 80,000 slots within a few MiB.
        "slots": [
            [
                s.index,
                s.node,
                ",".join(s.devices),
                ",".join(map(str, s.device_indices)),
                str(s.declared),
                s.blocked,
                s.message,
                # Only MIG slots carry an eighth column: whole-GPU rows stay as they were.
                *([s.mig.encode()] if s.mig is not None else []),
            ]
            for s in (cmap.slots[i] for i in cmap.sorted_indices)
        ],
    }
    if cmap.legacy_sharing:
        out["legacySharing"] = True
    # Written only when set: most maps keep the defaults, and the model stays small.
    if cmap.rollout != Rollout():
        out["rollout"] = [cmap.rollout.strategy.value, cmap.rollout.max_unavailable]
    if cmap.provenance.revision:
        out["revision"] = cmap.provenance.revision
    if cmap.provenance.file:
        out["sourceFile"] = cmap.provenance.file
    if cmap.tolerations:
        out["tolerations"] = {
            str(i): [t.encode() for t in cmap.tolerations[i]] for i in sorted(cmap.tolerations)
        }
    if cmap.fallback:
        out["fallback"] = {str(i): list(cmap.fallback[i]) for i in sorted(cmap.fallback)}
    if cmap.same_clique:
        out["sameClique"] = True
    if cmap.ranks.index_label:
        out["indexLabel"] = cmap.ranks.index_label
    if cmap.ranks.pods_per_job:
        out["podsPerJob"] = cmap.ranks.pods_per_job
    if cmap.gang is not None:
        out["gang"] = cmap.gang.timeout_seconds
    if include_generation:
        out["generation"] = cmap.generation
    return out


def decode_map(key: MapKey, data: Mapping[str, Any]) -> CompiledMap:
    slots: dict[int, CompiledSlot] = {}
    for row in data["slots"]:
        index, node, devices, indices, declared, blocked, message = row[:7]
        slots[int(index)] = CompiledSlot(
            index=int(index),
            node=NodeName(str(node)),
            devices=tuple(GpuUuid(d) for d in str(devices).split(",") if d),
            device_indices=tuple(int(i) for i in str(indices).split(",") if i),
            declared=DeclaredDevices.parse(str(declared)),
            blocked=Reason(blocked) if blocked else "",
            message=str(message),
            mig=MigSlot.decode(row[7]) if len(row) > 7 else None,
        )
    return CompiledMap(
        key=key,
        slots=slots,
        sharing=Sharing(data["sharing"]),
        indexing=Indexing(data["indexing"]),
        env_mode=EnvMode(data["envMode"]),
        generation=int(data.get("generation", 0)),
        source_version=str(data.get("sourceVersion", "")),
        legacy_sharing=bool(data.get("legacySharing", False)),
        rollout=_decode_rollout(data.get("rollout")),
        provenance=Provenance(str(data.get("revision", "")), str(data.get("sourceFile", ""))),
        tolerations={
            int(i): tuple(Toleration.decode(row) for row in rows)
            for i, rows in (data.get("tolerations") or {}).items()
        },
        fallback={
            int(i): tuple(_device_ref(ref) for ref in refs)
            for i, refs in (data.get("fallback") or {}).items()
        },
        same_clique=bool(data.get("sameClique", False)),
        ranks=RankRules(str(data.get("indexLabel", "")), int(data.get("podsPerJob", 0))),
        gang=Gang(int(data["gang"])) if "gang" in data else None,
    )


def _device_ref(value: Any) -> DeviceRef:
    return value if isinstance(value, int) else GpuUuid(str(value))


def _decode_rollout(value: Any) -> Rollout:
    if not value:
        return Rollout()
    strategy, max_unavailable = value
    return Rollout(RolloutStrategy(strategy), int(max_unavailable))


def _shard_of(key: MapKey, count: int) -> int:
    return zlib.crc32(str(key).encode()) % count


def encode_model(model: Model) -> dict[str, dict[str, str]]:
    """ConfigMap name -> data for the manifest and every shard; each shard under MAX_SHARD_BYTES."""
    with without_cycle_collection():
        return _encode_model(model)


def _encode_model(model: Model) -> dict[str, dict[str, str]]:
    encoded = {
        key: json.dumps(encode_map(m), separators=(",", ":"), sort_keys=True)
        for key, m in model.maps.items()
    }
    for key, text in encoded.items():
        if len(text) + 64 > MAX_SHARD_BYTES:
            raise ValueError(
                f"map {key} alone encodes to {len(text)} bytes, over {MAX_SHARD_BYTES}"
            )
    count = 1
    while True:
        buckets: list[list[tuple[str, str]]] = [[] for _ in range(count)]
        for key, text in encoded.items():
            buckets[_shard_of(key, count)].append((str(key), text))
        shards = [
            "{" + ",".join(f"{json.dumps(k)}:{t}" for k, t in sorted(bucket)) + "}"
            for bucket in buckets
        ]
        if all(len(s) <= MAX_SHARD_BYTES for s in shards):
            break
        count *= 2
    out: dict[str, dict[str, str]] = {}
    digests: dict[str, str] = {}
    for i, text in enumerate(shards):
        name = f"{SHARD_PREFIX}{i}"
        out[name] = {SHARD_KEY: text}
        digests[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    manifest: dict[str, Any] = {"generation": model.generation, "shards": digests}
    if model.grants != GrantView():
        # The resolved grants, for the webhook (which watches the model, not nodes).
        text = model.grants.to_json()
        out[GRANTS_CONFIGMAP] = {GRANTS_KEY: text}
        manifest["grants"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    out[MANIFEST_NAME] = {MANIFEST_KEY: json.dumps(manifest, sort_keys=True, separators=(",", ":"))}
    return out


def decode_manifest(data: Mapping[str, str]) -> tuple[int, dict[str, str]]:
    manifest = json.loads(data[MANIFEST_KEY])
    return int(manifest["generation"]), dict(manifest["shards"])


def model_data(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """ConfigMap name -> data of the model ConfigMaps a watch holds (anything not text dropped)."""
    out: dict[str, dict[str, str]] = {}
    for obj in objects:
        data = obj.get("data")
        out[str(obj["metadata"]["name"])] = (
            {str(k): v for k, v in data.items() if isinstance(v, str)}
            if isinstance(data, Mapping)
            else {}
        )
    return out


def read_model(configmaps: Mapping[str, Mapping[str, str]]) -> Model:
    """The one reader of the stored model, for the controller, the webhook and the agents.

    No model ConfigMap at all (a fresh install, before the controller wrote one) is the empty
    model: pods that name a map are refused with a clear message, nothing targets a node. Anything
    else that does not decode raises ValueError saying what: a write seen half-way (a shard before
    or after the manifest that names it), shards without a manifest, malformed content. A reader
    then keeps serving the last model it read completely; the next event completes the write.
    """
    if not configmaps:
        return Model()
    try:
        return decode_model(configmaps)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"model ConfigMaps do not decode: {exc!r}") from exc


class ModelConfigMaps:
    """Which ConfigMaps hold the stored model and how they read (`read_model`), for the one watch
    on them that the controller, the webhook and the agents run (`kubeio.configmapwatch`)."""

    name = "model"
    label_selector = f"{MODEL_LABEL}=true"

    def decode(self, objects: Iterable[Mapping[str, Any]]) -> Model:
        return read_model(model_data(objects))

    def describe(self, model: Model) -> str:
        return f"generation {model.generation}"


MODEL_CONFIGMAPS = ModelConfigMaps()


def decode_model(configmaps: Mapping[str, Mapping[str, str]]) -> Model:
    """Rebuilds the model from ConfigMap name -> data; raises ValueError if a shard is missing or
    does not match the manifest (a reader saw a write half-way and should wait for the next event)."""
    with without_cycle_collection():
        return _decode_model(configmaps)


def _decode_model(configmaps: Mapping[str, Mapping[str, str]]) -> Model:
    if MANIFEST_NAME not in configmaps:
        raise ValueError(f"model manifest {MANIFEST_NAME} is missing")
    generation, digests = decode_manifest(configmaps[MANIFEST_NAME])
    maps: dict[MapKey, CompiledMap] = {}
    for name, digest in digests.items():
        shard = configmaps.get(name)
        if shard is None:
            raise ValueError(f"model shard {name} is missing")
        text = shard.get(SHARD_KEY, "")
        if hashlib.sha256(text.encode()).hexdigest()[:16] != digest:
            raise ValueError(f"model shard {name} does not match manifest generation {generation}")
        for key_text, data in json.loads(text).items():
            key = MapKey.parse(key_text)
            maps[key] = decode_map(key, data)
    grants = GrantView()
    grants_digest = json.loads(configmaps[MANIFEST_NAME][MANIFEST_KEY]).get("grants")
    if grants_digest:
        text = (configmaps.get(GRANTS_CONFIGMAP) or {}).get(GRANTS_KEY, "")
        if hashlib.sha256(text.encode()).hexdigest()[:16] != grants_digest:
            raise ValueError(f"{GRANTS_CONFIGMAP} does not match manifest generation {generation}")
        grants = GrantView.from_json(text)
    return Model(generation, maps, grants)
