"""A gang that can never be complete is refused before it merges: a slot on a node that the
cluster's inventory snapshot lacks keeps every rank waiting, so it is an error at the slot's line
(a plain map's unknown node stays a warning: it may be a logical name)."""

from __future__ import annotations

from placement.inventorycheck import check_devices
from placement.occupancy import CellState, GpuCell
from placement.types import NodeName
from placement.validate import parse_map

MAP = """apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm
  namespace: ml
spec:
{gang}  placements:
    - index: 0
      node: gpu-1
      devices: [0]
    - index: 1
      node: gpu-9
      devices: [0]
"""

GPUS = {"gpu-1": [GpuCell(NodeName("gpu-1"), 0, "GPU-a", "H100", CellState.FREE, ())]}


def test_a_gang_slot_on_a_node_the_inventory_lacks_is_an_error_at_its_line() -> None:
    pmap = parse_map(MAP.format(gang="  gang: {timeoutSeconds: 600}\n"), "maps/llm.yaml")
    (found,) = check_devices(pmap, GPUS, "maps/llm.yaml")
    assert found.severity == "error"
    assert found.format().startswith(
        "maps/llm.yaml:12:7: error: spec.placements[1]: map ml/llm index 1: node gpu-9 is not "
        "in inventory.json: the map is a gang"
    )


def test_a_plain_map_slot_on_an_unknown_node_is_a_warning() -> None:
    pmap = parse_map(MAP.format(gang=""), "maps/llm.yaml")
    (found,) = check_devices(pmap, GPUS, "maps/llm.yaml")
    assert found.severity == "warning"
