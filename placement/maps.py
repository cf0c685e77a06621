"""A validated placement map: the normalized form every later stage consumes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.errors import Diagnostic, Location
from placement.indexing import RankRules
from placement.taints import Toleration
from placement.types import DeviceRef, EnvMode, Indexing, MapKey, RolloutStrategy, Sharing


@dataclass(frozen=True, slots=True)
class Requirement:
    product: str | None = None
    min_memory_mib: int | None = None
    #: A `count` pick must be GPUs all joined to each other by NVLink.
    nvlink: bool = False

    def describe(self) -> str:
        parts = []
        if self.nvlink:
            parts.append("joined by NVLink")
        if self.product:
            parts.append(f"product {self.product!r}")
        if self.min_memory_mib:
            parts.append(f">= {self.min_memory_mib} MiB")
        return ", ".join(parts) or "any GPU"


@dataclass(frozen=True, slots=True)
class Gang:
    """The map's slots bind together or not at all (placement/gang.py); a gang waiting longer
    than `timeout_seconds` is reported stuck."""

    timeout_seconds: int = 600


@dataclass(frozen=True, slots=True)
class Rollout:
    """How pods follow a new version of their map: `manual` (default) leaves drifted pods where
    they run; `evict` evicts them, at most `max_unavailable` of the map's pods down at a time."""

    strategy: RolloutStrategy = RolloutStrategy.MANUAL
    max_unavailable: int = 1

    def describe(self) -> str:
        if self.strategy is RolloutStrategy.MANUAL:
            return "manual"
        return f"evict, maxUnavailable {self.max_unavailable}"


@dataclass(frozen=True, slots=True)
class MigRequest:
    """One MIG instance a slot asks for: a `profile` on the GPU `gpu` (NVML index or UUID)."""

    gpu: DeviceRef
    profile: str

    def __str__(self) -> str:
        return f"gpu {self.gpu} / {self.profile}"


@dataclass(frozen=True, slots=True)
class DeclaredSlot:
    """One entry of a map as declared: explicit devices, or a count resolved at compile time."""

    index: int
    node: str
    devices: tuple[DeviceRef, ...] = ()
    count: int | None = None
    require: Requirement | None = None
    location: Location = field(default=Location(""), compare=False)
    #: DRA device taints its devices may carry (dra enforcement).
    tolerations: tuple[Toleration, ...] = ()
    #: Where each of `tolerations` is written (may be empty: a slot rebuilt from the model).
    toleration_locations: tuple[Location, ...] = field(default=(), compare=False)
    #: The MIG instance the slot asks for (then `devices` is empty and `count` None).
    mig: MigRequest | None = None
    #: Spare GPUs, in order, for declared `devices` that are missing or unhealthy.
    fallback: tuple[DeviceRef, ...] = ()


@dataclass(frozen=True, slots=True)
class PlacementMap:
    key: MapKey
    slots: tuple[DeclaredSlot, ...]
    sharing: Sharing = Sharing.EXCLUSIVE
    indexing: Indexing = Indexing.AUTO
    env_mode: EnvMode = EnvMode.INDEX
    rollout: Rollout = field(default_factory=Rollout)
    source: str = field(default="", compare=False)
    #: Legacy text (`spec.map`) without an explicit `sharing`: lines that name the same GPU share
    #: it (see placement.legacy); exclusive against every other map.
    legacy_sharing: bool = False
    #: Located notes that do not make the map invalid (e.g. a GPU shared by legacy lines).
    warnings: tuple[Diagnostic, ...] = field(default=(), compare=False)
    #: All slots' nodes must carry one value of the GPU clique label (one NVLink domain).
    same_clique: bool = False
    #: spec.indexLabel and spec.podsPerJob (placement/indexing.py).
    ranks: RankRules = field(default_factory=RankRules)
    gang: Gang | None = None
    by_index: Mapping[int, DeclaredSlot] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_index", MappingProxyType({s.index: s for s in self.slots}))
