"""Per-GPU series, built at scrape time from the inventories and the slot cache (nothing on the
hot path): `gpuplace_gpu_info` for every GPU the agents report, `gpuplace_gpu_holder` for every
such GPU a pod holds and `gpuplace_gpu_declared` for every such GPU a slot declares, labelled as
DCGM exporter labels its series (`Hostname`, `gpu`, `UUID`, `modelName`), so that a PromQL join on
`UUID` attributes DCGM's utilisation to gpuplace's pods:

    DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(namespace, pod, map, index) gpuplace_gpu_holder

DCGM itself only knows pods that request `nvidia.com/gpu`, which gpuplace's pods do not.

Bounded by the GPUs the agents report, whatever the maps and pods say: each family has at most
one series per reported GPU (a MIG device counts as its GPU). The labels that come from a tenant
(namespace, pod, map, index) name the one pod or slot behind a GPU, and are empty where several
differ (a shared GPU); `gpuplace_gpu_declared`'s value counts the slots. Held or declared GPUs no
agent reports (a node without inventory, a device that is gone, a name that never existed) are
counted in `gpuplace_gpus_unreported`, two series in all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.slotcache import Holding
from placement.devices import GpuId
from placement.inventory import GpuDevice, NodeInventory
from placement.model import Model
from placement.status import MapStatus
from placement.types import GpuUuid, MapKey, NodeName

INFO_LABELS = ("Hostname", "gpu", "UUID", "modelName", "healthy")
HOLDER_LABELS = ("Hostname", "gpu", "UUID", "namespace", "pod", "map", "index")
DECLARED_LABELS = ("Hostname", "gpu", "UUID", "namespace", "map", "index")
#: A reported GPU: (node, NVML index, UUID), as the series label it.
GpuKey = tuple[NodeName, int, GpuUuid]


@dataclass(slots=True)
class _Users:
    """The tenant labels of one GPU's series, merged over the pods or slots that use it: a label
    keeps its value while every user agrees on it and is emptied for good when one differs."""

    labels: list[str]
    count: int = 1

    def add(self, labels: tuple[str, ...]) -> None:
        self.count += 1
        for i, value in enumerate(labels):
            if self.labels[i] != value:
                self.labels[i] = ""


def _merge(users: dict[GpuKey, _Users], key: GpuKey, labels: tuple[str, ...]) -> None:
    found = users.get(key)
    if found is None:
        users[key] = _Users(list(labels))
    else:
        found.add(labels)


class GpuCollector(Collector):
    """Reads `inventories()`, `holdings()` and `model()` when Prometheus scrapes. Only the
    leader's slot cache holds anything: a standby exports its GPUs' info, the declared slots of
    the model it serves, and no holders."""

    def __init__(
        self,
        inventories: Callable[[], Mapping[NodeName, NodeInventory]],
        holdings: Callable[[], Iterable[Holding]],
        model: Callable[[], Model] = Model,
    ) -> None:
        self.inventories = inventories
        self.holdings = holdings
        self.model = model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inventories = self.inventories()
        yield _info(inventories)
        unreported: dict[str, set[tuple[NodeName, str]]] = {"held": set(), "declared": set()}
        yield self._holders(inventories, unreported["held"])
        yield self._declared(inventories, unreported["declared"])
        missing = GaugeMetricFamily(
            "gpuplace_gpus_unreported",
            "GPUs pods hold (held) or valid maps' slots declare (declared) that no agent reports",
            labels=("by",),
        )
        for by, gpus in unreported.items():
            missing.add_metric([by], len(gpus))
        yield missing

    def _holders(
        self,
        inventories: Mapping[NodeName, NodeInventory],
        unreported: set[tuple[NodeName, str]],
    ) -> GaugeMetricFamily:
        def held() -> Iterator[tuple[NodeName, GpuId, tuple[str, ...]]]:
            for holding in self.holdings():
                if holding.assumed:
                    continue  # its Binding is not stored yet
                namespace, _, pod = holding.pod.partition("/")
                labels = (namespace, pod, holding.slot.map.name, str(holding.slot.index))
                for gpu in holding.gpus:
                    yield holding.node, GpuId(gpu), labels

        return _family(
            "gpuplace_gpu_holder",
            "A GPU pods hold (1), from the binder's slot cache; join DCGM's series on UUID. "
            "A label is empty where the pods holding the GPU differ in it",
            HOLDER_LABELS,
            _users_by_gpu(held(), inventories, unreported),
            lambda _users: 1,
        )

    def _declared(
        self,
        inventories: Mapping[NodeName, NodeInventory],
        unreported: set[tuple[NodeName, str]],
    ) -> GaugeMetricFamily:
        def declared() -> Iterator[tuple[NodeName, GpuId, tuple[str, ...]]]:
            for key, cmap in self.model().maps.items():
                for slot in cmap.slots.values():
                    labels = (key.namespace, key.name, str(slot.index))
                    for gpu in slot.gpus:
                        yield slot.node, gpu, labels

        return _family(
            "gpuplace_gpu_declared",
            "The slots of valid maps that declare a GPU, held or not: the maps' claims on the "
            "device. A label is empty where those slots differ in it",
            DECLARED_LABELS,
            _users_by_gpu(declared(), inventories, unreported),
            lambda users: users.count,
        )


def _users_by_gpu(
    uses: Iterable[tuple[NodeName, GpuId, tuple[str, ...]]],
    inventories: Mapping[NodeName, NodeInventory],
    unreported: set[tuple[NodeName, str]],
) -> dict[GpuKey, _Users]:
    """Each use of a GPU (its node, the GPU as the user names it, the user's labels) merged into
    the reported GPU it is; a GPU no agent reports goes to `unreported` instead."""
    users: dict[GpuKey, _Users] = {}
    for node, gpu, labels in uses:
        key = _reported(node, gpu, inventories.get(node))
        if key is None:
            unreported.add((node, gpu))
        else:
            _merge(users, key, labels)
    return users


def _family(
    name: str,
    documentation: str,
    labels: tuple[str, ...],
    users: Mapping[GpuKey, _Users],
    value: Callable[[_Users], int],
) -> GaugeMetricFamily:
    """One series per reported GPU in `users`, its tenant labels merged, `value` its value."""
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for (node, index, uuid), merged in sorted(users.items()):
        family.add_metric([node, str(index), uuid, *merged.labels], value(merged))
    return family


def _info(inventories: Mapping[NodeName, NodeInventory]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "gpuplace_gpu_info",
        "A GPU a node's agent reports (1), labelled as DCGM exporter labels it",
        labels=INFO_LABELS,
    )
    for node, inventory in sorted(inventories.items()):
        for device in inventory.devices:
            family.add_metric(
                [node, str(device.index), device.uuid, device.name, _bool(device.healthy)], 1
            )
    return family


def _reported(node: NodeName, gpu: GpuId, inventory: NodeInventory | None) -> GpuKey | None:
    """The reported GPU a held or declared one is (the GPU of a MIG device), None if no agent
    reports it."""
    if inventory is None:
        return None
    nvml_index = gpu.nvml_index
    device: GpuDevice | None
    if nvml_index is not None:
        device = inventory.by_index.get(nvml_index)
    else:
        device = inventory.by_uuid.get(GpuUuid(gpu)) or inventory.mig_parent.get(gpu)
    return None if device is None else (node, device.index, device.uuid)


def _bool(value: bool) -> str:
    return "true" if value else "false"


SLOT_STATES = ("total", "served", "bound", "blocked", "drifted", "renumbered", "unverifiable")


class MapSlotsCollector(Collector):
    """`gpuplace_map_slots{namespace, map, state}`: each map's slot counts as its status last
    reported them (the leader computes statuses; a standby exports none). Bounded by the maps."""

    def __init__(self, statuses: Callable[[], Mapping[MapKey, MapStatus]]) -> None:
        self.statuses = statuses

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpuplace_map_slots",
            "A map's slots by state, as its status reports them",
            labels=("namespace", "map", "state"),
        )
        for key, status in sorted(dict(self.statuses()).items()):
            for state in SLOT_STATES:
                family.add_metric([key.namespace, key.name, state], getattr(status.slots, state))
        yield family
