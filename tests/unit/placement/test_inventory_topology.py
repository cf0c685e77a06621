"""The inventory's MIG and topology fields: what agents write, what the controller reads back."""

from __future__ import annotations

import json

import pytest

from placement.inventory import GpuDevice, MigInstance, NodeInventory
from placement.types import GpuUuid, NodeName

U0 = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00")
U1 = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e01")
M0 = "MIG-1b0e2a44-7f3c-5d61-8a90-0c1d2e3f4a50"
M1 = "MIG-1b0e2a44-7f3c-5d61-8a90-0c1d2e3f4a51"


def inventory() -> NodeInventory:
    return NodeInventory(
        NodeName("gpu-a-01"),
        (
            GpuDevice(
                0,
                U0,
                "NVIDIA H100 80GB HBM3",
                81559,
                mig_mode=True,
                mig_instances=(
                    MigInstance(M0, "3g.40gb", 0, 0, 4, 40192),
                    MigInstance(M1, "1g.10gb", 1, 6, 1, 9728),
                ),
                nvlink_peers=(U1,),
                pcie_switch_peers=(U1,),
            ),
            GpuDevice(1, U1, "NVIDIA H100 80GB HBM3", 81559, nvlink_peers=(U0,)),
        ),
    )


def test_mig_and_peers_round_trip() -> None:
    inv = inventory()
    assert NodeInventory.from_json(inv.to_json()) == inv


def test_written_keys_follow_the_contract() -> None:
    device = json.loads(inventory().to_json())["devices"][0]
    assert device["migMode"] is True
    assert device["migInstances"][0] == {
        "uuid": M0,
        "profile": "3g.40gb",
        "index": 0,
        "start": 0,
        "size": 4,
        "memoryMiB": 40192,
    }
    assert device["nvlinkPeers"] == [U1]
    assert device["pcieSwitchPeers"] == [U1]


def test_mig_lookup_names_instance_and_parent() -> None:
    inv = inventory()
    assert inv.mig_by_uuid[M1].profile == "1g.10gb"
    assert inv.mig_parent[M1].uuid == U0
    assert M0 not in NodeInventory(NodeName("n"), (GpuDevice(0, U0),)).mig_by_uuid


def test_an_older_agents_inventory_reads_as_no_mig_and_no_peers() -> None:
    text = json.dumps({"node": "n", "devices": [{"index": 0, "uuid": U0}]})
    (device,) = NodeInventory.from_json(text).devices
    assert (device.mig_mode, device.mig_instances) == (False, ())
    assert (device.nvlink_peers, device.pcie_switch_peers) == ((), ())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"migMode": "false"}, "migMode is not a boolean"),
        ({"migInstances": {"uuid": M0}}, "migInstances is not a list"),
        ({"migInstances": [{"uuid": M0}]}, "profile"),
        ({"nvlinkPeers": U1}, "nvlinkPeers is not a list"),
    ],
)
def test_malformed_fields_are_refused_with_the_key(extra: dict[str, object], message: str) -> None:
    text = json.dumps({"node": "n", "devices": [{"index": 0, "uuid": U0, **extra}]})
    with pytest.raises(ValueError, match=message):
        NodeInventory.from_json(text)
