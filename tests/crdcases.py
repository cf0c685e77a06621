"""PlacementMap and PlacementPolicy objects that the CRDs' schemas accept or refuse, and why.

The unit tests check that gpuplace's own validation (placement/validate.py, the policy reader)
gives each the same verdict; the integration tests check that the apiserver does, naming `field`.
Every rule the CRDs add to the models (placement/crd.py) has a case here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placement.grants import POLICY_CONFIGMAP
from placement.types import API_VERSION, KIND, MAX_PLACEMENTS, POLICY_KIND

UUID = "GPU-5c1d0c3e-8c6a-4f4e-9a1b-2f6e7d8c9b0a"
#: Nodes the cases name (the tests' kwok nodes, so that nothing else refuses them).
NODES = ("it-gpu-01", "it-gpu-02")
DEVICE0 = "spec.placements[0].devices[0]"


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    #: "" for an object both accept; otherwise the field path the apiserver's refusal names.
    field: str = ""
    metadata_name: str = "crd-case"
    #: Refused by the CRD alone: the policy reader does not read metadata.name (the controller
    #: reads only the object named gpuplace-policy).
    crd_only: bool = False

    @property
    def valid(self) -> bool:
        return not self.field

    def __str__(self) -> str:
        return self.name


def placement_map(case: Case, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": case.metadata_name, "namespace": namespace},
        "spec": case.spec,
    }


def placement_policy(case: Case) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": case.metadata_name},
        "spec": case.spec,
    }


def _entry(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "node": NODES[0], **fields}


def _placements(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"placements": list(entries)}


MAP_CASES = (
    Case(
        "devices-count-require",
        {
            "sharing": "shared",
            "envMode": "uuid",
            "rollout": {"strategy": "evict", "maxUnavailable": 2},
            "placements": [
                _entry(devices=[0, 1]),
                {"index": 1, "node": NODES[1], "devices": [UUID]},
                {
                    "index": 2,
                    "node": NODES[1],
                    "count": 2,
                    "require": {"product": "NVIDIA H100 80GB HBM3", "minMemoryMiB": 80000},
                },
            ],
        },
    ),
    Case("legacy-text", {"map": f"0={NODES[0]}:0,1\n1={NODES[1]}:2\n"}),
    Case("count-not-an-integer", _placements(_entry(count="two")), "spec.placements[0].count"),
    Case("count-too-large", _placements(_entry(count=65)), "spec.placements[0].count"),
    Case("devices-and-count", _placements(_entry(devices=[0], count=1)), "spec.placements[0]"),
    Case("neither-devices-nor-count", _placements(_entry()), "spec.placements[0]"),
    Case(
        "duplicate-index",
        _placements(_entry(count=1), {"index": 0, "node": NODES[1], "count": 1}),
        "spec.placements[1]",
    ),
    Case("empty-devices", _placements(_entry(devices=[])), "spec.placements[0].devices"),
    Case("mig", _placements(_entry(mig={"gpu": 0, "profile": "1g.10gb+me"}))),
    Case(
        "mig-and-devices",
        _placements(_entry(devices=[0], mig={"gpu": 0, "profile": "3g.40gb"})),
        "spec.placements[0]",
    ),
    Case(
        "mig-profile-malformed",
        _placements(_entry(mig={"gpu": 0, "profile": "3g.40"})),
        "spec.placements[0].mig.profile",
    ),
    Case(
        "mig-gpu-not-a-uuid",
        _placements(_entry(mig={"gpu": "GPU-1", "profile": "3g.40gb"})),
        "spec.placements[0].mig.gpu",
    ),
    Case("device-index-too-large", _placements(_entry(devices=[256])), DEVICE0),
    Case("device-index-negative", _placements(_entry(devices=[-1])), DEVICE0),
    Case("device-not-a-uuid", _placements(_entry(devices=["GPU-1"])), DEVICE0),
    Case("device-by-pci-bus-id", _placements(_entry(devices=["0000:18:00.0", "00000000:3B:00.0"]))),
    Case("device-pci-function-8", _placements(_entry(devices=["0000:18:00.8"])), DEVICE0),
    Case("node-not-a-name", _placements(_entry(node="gpu a", count=1)), "spec.placements[0].node"),
    Case("index-negative", _placements(_entry(index=-1, count=1)), "spec.placements[0].index"),
    Case("missing-node", _placements({"index": 0, "count": 1}), "spec.placements[0].node"),
    Case("unknown-sharing", {"sharing": "sometimes", "map": "0=n:0"}, "spec.sharing"),
    Case("placements-and-map", {**_placements(_entry(count=1)), "map": "0=n:0"}, "spec"),
    Case("neither-placements-nor-map", {"sharing": "shared"}, "spec"),
    Case(
        "too-many-placements",
        {"placements": [_entry(index=i, count=1) for i in range(MAX_PLACEMENTS + 1)]},
        "spec.placements",
    ),
    Case("name-not-a-label", {"map": "0=n:0"}, "metadata.name", "crd.case"),
    Case("name-too-long", {"map": "0=n:0"}, "metadata.name", "m" * 64),
)


def _grant(**fields: Any) -> dict[str, Any]:
    return {"namespaces": ["team-a"], **fields}


POLICY_CASES = (
    Case("empty", {}, metadata_name=POLICY_CONFIGMAP),
    Case(
        "every-field",
        {
            "grants": [
                _grant(nodes=[NODES[0], "node7"], devices=[0, UUID]),
                _grant(
                    nodeSelector={
                        "matchLabels": {"pool": "train"},
                        "matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["z1"]},
                            {"key": "gpu", "operator": "Exists"},
                        ],
                    }
                ),
                {"namespaces": [], "nodes": [NODES[1]]},
                _grant(
                    nodes=[NODES[1]],
                    tolerations=[
                        {"key": "example.com/reserved", "effects": ["NoSchedule"]},
                        {"key": "gpu.nvidia.com/xid"},
                        {"anyKey": True, "effects": ["NoExecute", "NoSchedule"]},
                    ],
                ),
            ]
        },
        metadata_name=POLICY_CONFIGMAP,
    ),
    Case("another-name", {}, "metadata.name", "cluster", crd_only=True),
    Case("grant-without-nodes", {"grants": [_grant()]}, "spec.grants[0]", POLICY_CONFIGMAP),
    Case(
        "grant-with-empty-nodes", {"grants": [_grant(nodes=[])]}, "spec.grants[0]", POLICY_CONFIGMAP
    ),
    Case(
        "grant-without-namespaces",
        {"grants": [{"nodes": [NODES[0]]}]},
        "spec.grants[0].namespaces",
        POLICY_CONFIGMAP,
    ),
    Case(
        "namespace-not-a-label",
        {"grants": [_grant(namespaces=["Team_A"], nodes=[NODES[0]])]},
        "spec.grants[0].namespaces[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "node-not-a-name",
        {"grants": [_grant(nodes=["gpu a"])]},
        "spec.grants[0].nodes[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "empty-devices",
        {"grants": [_grant(nodes=[NODES[0]], devices=[])]},
        "spec.grants[0].devices",
        POLICY_CONFIGMAP,
    ),
    Case(
        "device-not-a-uuid",
        {"grants": [_grant(nodes=[NODES[0]], devices=["six"])]},
        "spec.grants[0].devices[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "unknown-operator",
        {"grants": [_grant(nodeSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]})]},
        "spec.grants[0].nodeSelector.matchExpressions[0].operator",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-key-and-any-key",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"key": "a", "anyKey": True}])]},
        "spec.grants[0].tolerations[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-without-key",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"effects": ["NoSchedule"]}])]},
        "spec.grants[0].tolerations[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-any-key-false",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"anyKey": False}])]},
        "spec.grants[0].tolerations[0].anyKey",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-key-not-a-key",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"key": "a key"}])]},
        "spec.grants[0].tolerations[0].key",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-unknown-effect",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"key": "a", "effects": ["None"]}])]},
        "spec.grants[0].tolerations[0].effects[0]",
        POLICY_CONFIGMAP,
    ),
    Case(
        "toleration-grant-empty-effects",
        {"grants": [_grant(nodes=[NODES[0]], tolerations=[{"key": "a", "effects": []}])]},
        "spec.grants[0].tolerations[0].effects",
        POLICY_CONFIGMAP,
    ),
    Case(
        "label-value-not-a-string",
        {"grants": [_grant(nodeSelector={"matchLabels": {"pool": 1}})]},
        "spec.grants[0].nodeSelector.matchLabels.pool",
        POLICY_CONFIGMAP,
    ),
)
