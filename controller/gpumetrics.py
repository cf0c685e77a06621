"""Per-GPU series, built at scrape time from the inventories and the slot cache (nothing on the
hot path): `gpuplace_gpu_info` for every GPU the agents report and `gpuplace_gpu_holder` for every
pod holding one, labelled as DCGM exporter labels its series (`Hostname`, `gpu`, `UUID`,
`modelName`), so that a PromQL join on `UUID` attributes DCGM's utilisation to gpuplace's pods:

    DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(namespace, pod, map, index) gpuplace_gpu_holder

DCGM itself only knows pods that request `nvidia.com/gpu`, which gpuplace's pods do not. The
series are bounded by the GPUs: one info series each, one holder series per pod holding it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.slotcache import Holding
from placement.devices import GpuId
from placement.inventory import NodeInventory
from placement.model import Model
from placement.status import MapStatus
from placement.types import GpuUuid, MapKey, NodeName

INFO_LABELS = ("Hostname", "gpu", "UUID", "modelName", "healthy")
HOLDER_LABELS = ("Hostname", "gpu", "UUID", "namespace", "pod", "map", "index")
DECLARED_LABELS = ("Hostname", "gpu", "UUID", "namespace", "map", "index")


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
        info = GaugeMetricFamily(
            "gpuplace_gpu_info",
            "A GPU a node's agent reports (1), labelled as DCGM exporter labels it",
            labels=INFO_LABELS,
        )
        for node, inventory in sorted(inventories.items()):
            for device in inventory.devices:
                info.add_metric(
                    [node, str(device.index), device.uuid, device.name, _bool(device.healthy)],
                    1,
                )
        yield info
        holder = GaugeMetricFamily(
            "gpuplace_gpu_holder",
            "A pod holding a GPU (1), from the binder's slot cache; join DCGM's series on UUID",
            labels=HOLDER_LABELS,
        )
        for held in sorted(self.holdings(), key=lambda h: h.pod):
            if held.assumed:
                continue  # its Binding is not stored yet
            namespace, _, pod = held.pod.partition("/")
            node_inventory = inventories.get(held.node)
            for gpu in held.gpus:
                index, uuid = _device(GpuId(gpu), node_inventory)
                holder.add_metric(
                    [
                        held.node,
                        index,
                        uuid,
                        namespace,
                        pod,
                        held.slot.map.name,
                        str(held.slot.index),
                    ],
                    1,
                )
        yield holder
        declared = GaugeMetricFamily(
            "gpuplace_gpu_declared",
            "A GPU a slot of a valid map declares (1), held or not: a map's claim on the device",
            labels=DECLARED_LABELS,
        )
        for key, cmap in sorted(self.model().maps.items()):
            for slot in cmap.slots.values():
                node_inventory = inventories.get(slot.node)
                for gpu in slot.gpus:
                    index, uuid = _device(gpu, node_inventory)
                    declared.add_metric(
                        [slot.node, index, uuid, key.namespace, key.name, str(slot.index)], 1
                    )
        yield declared


def _device(gpu: GpuId, inventory: NodeInventory | None) -> tuple[str, str]:
    """(NVML index, UUID) of a held GPU; "" where the node's inventory does not say."""
    nvml_index = gpu.nvml_index
    if nvml_index is not None:
        device = inventory.by_index.get(nvml_index) if inventory is not None else None
        return str(nvml_index), device.uuid if device is not None else ""
    by_uuid = inventory.by_uuid.get(GpuUuid(gpu)) if inventory is not None else None
    return (str(by_uuid.index) if by_uuid is not None else ""), str(gpu)


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
