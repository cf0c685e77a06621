"""The PlacementMap document as users commit it (pydantic v2, strict: unknown fields are errors)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from placement.taints import TaintEffect, Toleration, TolerationOperator
from placement.types import (
    API_VERSION,
    KIND,
    MAX_COUNT,
    MAX_INDEX,
    MAX_MAP_TEXT,
    MAX_PLACEMENTS,
    MAX_TAINT_KEY,
    TAINT_KEY_RE,
    EnvMode,
    Indexing,
    RolloutStrategy,
    Sharing,
)

_STRICT = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class RequireSpec(BaseModel):
    """What the entry's GPUs must be (checked against the node's inventory)."""

    model_config = _STRICT

    product: StrictStr | None = Field(
        default=None,
        description='NVML product name the GPUs must report, e.g. "NVIDIA H100 80GB HBM3".',
    )
    min_memory_mib: StrictInt | None = Field(
        default=None,
        alias="minMemoryMiB",
        ge=1,
        description="Least memory each GPU must have, in MiB.",
    )
    nvlink: StrictBool | None = Field(
        default=None,
        description="count entries: the picked GPUs must all be joined to each other by NVLink "
        "(without it, NVLink-joined sets are only preferred).",
    )


_TAINT_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


class DeviceToleration(BaseModel):
    """A DRA device taint the slot's devices may carry (dra enforcement), as in a claim."""

    model_config = _STRICT

    key: StrictStr = Field(
        default="",
        max_length=MAX_TAINT_KEY,
        description="Taint key; empty with operator Exists tolerates every taint.",
    )
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Exists: any value; Equal: the value must match."
    )
    value: StrictStr = Field(default="", max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect tolerated; absent: every effect."
    )

    @field_validator("key")
    @classmethod
    def _key_form(cls, key: str) -> str:
        if key and not TAINT_KEY_RE.fullmatch(key):
            raise ValueError(
                f"{key!r} is not a taint key: a name of letters, digits, '-', '_', '.' (at most "
                "63), optionally after a DNS prefix and '/', e.g. gpu.nvidia.com/xid"
            )
        return key

    @field_validator("value")
    @classmethod
    def _value_form(cls, value: str) -> str:
        if not _TAINT_VALUE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a taint value: letters, digits, '-', '_', '.', starting and "
                "ending with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DeviceToleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        return self

    def toleration(self) -> Toleration:
        effect = TaintEffect(self.effect) if self.effect else None
        return Toleration(self.key, TolerationOperator(self.operator), self.value, effect)


class MigSpec(BaseModel):
    """One MIG instance: a profile on a GPU whose MIG mode is on and whose instances exist."""

    model_config = _STRICT

    gpu: StrictInt | StrictStr = Field(
        description="The parent GPU: NVML index, GPU UUID (GPU-...) or PCI bus ID.",
    )
    profile: StrictStr = Field(
        min_length=1,
        max_length=32,
        description="MIG profile, e.g. 3g.40gb (H100 80GB) or 3g.71gb (H200); the slot gets one "
        "existing instance of it.",
    )


class PlacementSpec(BaseModel):
    """One slot: the node and the GPUs of the pod with this index."""

    model_config = _STRICT

    index: StrictInt = Field(
        ge=0,
        le=MAX_INDEX,
        description="Slot index: the pod's StatefulSet ordinal, gpuplace.io/index label or "
        "allocated slot. Unique within the map.",
    )
    node: StrictStr = Field(
        min_length=1,
        max_length=253,
        description="Node name, or a logical name resolved through the node alias label "
        "(gpu-node-name by default).",
    )
    devices: list[StrictInt | StrictStr] | None = Field(
        default=None,
        max_length=MAX_COUNT,
        description='NVML indices, GPU UUIDs (GPU-...) or quoted PCI bus IDs ("0000:18:00.0"); '
        "exclusive with count. UUIDs and PCI bus IDs stay stable across reboots.",
    )
    count: StrictInt | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="How many GPUs the controller picks on the node (and keeps); exclusive "
        "with devices.",
    )
    require: RequireSpec | None = Field(
        default=None, description="What the GPUs must be: product name, least memory."
    )
    mig: MigSpec | None = Field(
        default=None,
        description="One MIG instance instead of whole GPUs; exclusive with devices and count.",
    )
    fallback: list[StrictInt | StrictStr] | None = Field(
        default=None,
        max_length=MAX_COUNT,
        description="Spare GPUs (NVML indices, UUIDs or PCI bus IDs), used in order in place of a "
        "declared device that is missing, unhealthy or tainted; only with devices.",
    )
    tolerations: list[DeviceToleration] | None = Field(
        default=None,
        max_length=16,
        description="dra enforcement: DRA device taints the slot's devices may carry and still "
        "serve it (NoSchedule/NoExecute taints not tolerated keep the pod from binding).",
    )


class RolloutSpec(BaseModel):
    """What happens to bound pods whose slot a new version of the map moved or removed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.MANUAL,
        description="manual: drifted pods stay where they are (status shows them); evict: "
        "they are evicted (honouring PodDisruptionBudgets) and placed on their new slots.",
    )
    max_unavailable: StrictInt = Field(
        default=1,
        alias="maxUnavailable",
        ge=1,
        le=MAX_INDEX,
        description="Most drifted pods evicted at a time (strategy evict).",
    )


#: A label key as Kubernetes writes one: an optional DNS prefix and '/', then a name.
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


class GangSpec(BaseModel):
    """The map's slots are one gang: bound together when every slot has its pod and can be
    served, never in part."""

    model_config = _STRICT

    timeout_seconds: StrictInt = Field(
        default=600,
        alias="timeoutSeconds",
        ge=1,
        le=7 * 24 * 3600,
        description="How long a gang may wait, from its first waiting pod, before it is "
        "reported stuck (Event GangStuck, map condition, gpuplace_gangs_stuck); it goes on "
        "waiting and is still never bound in part.",
    )


class MapSpec(BaseModel):
    """Where each pod of the map goes: one entry per slot, in `placements` or in `map`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sharing: Sharing = Field(
        default=Sharing.EXCLUSIVE,
        description="exclusive: no two slots (of any map) share a GPU; shared: slots may.",
    )
    indexing: Indexing = Field(
        default=Indexing.AUTO,
        description="How a pod finds its index: auto (label gpuplace.io/index, indexLabel, the "
        "rank its workload wrote (LeaderWorkerSet, JobSet, Indexed Job, Kueue pod group, "
        "StatefulSet), name suffix, else allocated), ordinal, label, allocate.",
    )
    index_label: StrictStr | None = Field(
        default=None,
        alias="indexLabel",
        max_length=316,
        description="A pod label that carries the pod's rank (for controllers gpuplace does not "
        "know); read after gpuplace.io/index, before the workload ranks (indexing auto, label).",
    )
    pods_per_job: StrictInt | None = Field(
        default=None,
        alias="podsPerJob",
        ge=1,
        le=MAX_INDEX,
        description="JobSet: the pods of each child Job (the replicated Jobs' parallelism); a "
        "pod's rank is job global index * podsPerJob + completion index. Absent: one pod a Job.",
    )
    gang: GangSpec | None = Field(
        default=None,
        description="The map's slots are one gang: no pod is bound until every slot has its "
        "pod and can be served, then all are bound at once; a rank that restarts later takes "
        "its slot back alone.",
    )
    env_mode: EnvMode = Field(
        default=EnvMode.INDEX,
        alias="envMode",
        description="CUDA_VISIBLE_DEVICES as NVML indices (index) or GPU UUIDs (uuid, also "
        "NVIDIA_VISIBLE_DEVICES).",
    )
    placements: list[PlacementSpec] | None = Field(
        default=None,
        max_length=MAX_PLACEMENTS,
        description="The slots, one entry per index (unique); exclusive with map.",
    )
    map: StrictStr | None = Field(
        default=None,
        max_length=MAX_MAP_TEXT,
        description="Legacy alternative to placements: one `<index>=<node>:<devices>` line "
        "per slot, e.g. 0=node1:0,1.",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        description="What happens to bound pods whose slot a new version of the map changed.",
    )

    @field_validator("index_label")
    @classmethod
    def _label_key(cls, key: str | None) -> str | None:
        if key is not None and not _LABEL_KEY.fullmatch(key):
            raise ValueError(
                f"{key!r} is not a label key: a name of letters, digits, '-', '_', '.' (at most "
                "63), optionally after a DNS prefix and '/', e.g. example.com/rank"
            )
        return key

    same_clique: StrictBool = Field(
        default=False,
        alias="sameClique",
        description="All slots' nodes must carry the same nvidia.com/gpu.clique label value "
        "(one NVLink domain).",
    )


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: StrictStr = Field(min_length=1, max_length=63)
    namespace: StrictStr = Field(min_length=1, max_length=63)
    labels: dict[StrictStr, StrictStr] | None = None
    annotations: dict[StrictStr, StrictStr] | None = None


class PlacementMapDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: StrictStr = Field(alias="apiVersion")
    kind: StrictStr
    metadata: Metadata
    spec: MapSpec


def is_placement_document(value: object) -> bool:
    """Whether a YAML document is meant to be a PlacementMap (other kinds are left alone)."""
    if not isinstance(value, dict):
        return False
    api = value.get("apiVersion")
    if value.get("kind") == "PlacementPolicy":  # the cluster's grants (placement/grants.py)
        return False
    return value.get("kind") == KIND or (isinstance(api, str) and api.startswith("gpuplace.io/"))


EXPECTED_API_VERSION = API_VERSION
