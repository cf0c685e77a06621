"""The PlacementMap document as users commit it (pydantic v2, strict: unknown fields are errors)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from placement.types import (
    API_VERSION,
    KIND,
    MAX_COUNT,
    MAX_INDEX,
    EnvMode,
    Indexing,
    RolloutStrategy,
    Sharing,
)

_STRICT = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class RequireSpec(BaseModel):
    model_config = _STRICT

    product: StrictStr | None = None
    min_memory_mib: StrictInt | None = Field(default=None, alias="minMemoryMiB", ge=1)


class PlacementSpec(BaseModel):
    model_config = _STRICT

    index: StrictInt = Field(ge=0, le=MAX_INDEX)
    node: StrictStr = Field(min_length=1, max_length=253)
    devices: list[StrictInt | StrictStr] | None = None
    count: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
    require: RequireSpec | None = None


class RolloutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    strategy: RolloutStrategy = RolloutStrategy.MANUAL
    max_unavailable: StrictInt = Field(default=1, alias="maxUnavailable", ge=1, le=MAX_INDEX)


class MapSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sharing: Sharing = Sharing.EXCLUSIVE
    indexing: Indexing = Indexing.AUTO
    env_mode: EnvMode = Field(default=EnvMode.INDEX, alias="envMode")
    placements: list[PlacementSpec] | None = None
    map: StrictStr | None = None
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)


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
