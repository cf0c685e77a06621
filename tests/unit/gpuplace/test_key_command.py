"""What `gpuplace key` plans: which keys bound pods use, which unverifiable pods it re-adopts,
and which it refuses because another pod holds the same GPU or slot."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplace import keys
from placement.annotations import BindingDecision, signed_binding
from placement.keyring import Trust, TrustView, key_id, new_ring
from placement.types import GpuUuid, MapKey, NodeName

RING_KEY = b"r" * 32
LOST = b"l" * 32
VIEW = TrustView.of(new_ring(RING_KEY, "2026-01-01T00:00:00Z"))


def pod(
    name: str,
    secret: bytes,
    devices: tuple[int, ...],
    map_name: str = "llm",
    index: int = 0,
    phase: str = "Running",
) -> dict[str, Any]:
    uid = f"uid-{name}"
    decision = BindingDecision(
        MapKey("ml", map_name),
        index,
        NodeName("gpu-1"),
        tuple(GpuUuid(f"GPU-{d}") for d in devices),
        ",".join(map(str, devices)),
        1,
    )
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": uid,
            "creationTimestamp": "2026-06-01T00:00:00Z",
            "annotations": signed_binding(secret, key_id(secret), uid, "ml", decision),
        },
        "spec": {"nodeName": "gpu-1"},
        "status": {"phase": phase},
    }


def test_keys_in_use_count_verified_pods_only() -> None:
    bound = keys.judge_all(
        [
            pod("a-0", RING_KEY, (0,)),
            pod("b-0", LOST, (1,)),
            pod("c-0", RING_KEY, (2,), phase="Succeeded"),
        ],
        VIEW,
    )
    assert [(b.name, b.verdict.trust) for b in bound] == [
        ("ml/a-0", Trust.VERIFIED),
        ("ml/b-0", Trust.UNVERIFIABLE),
    ]
    assert keys.keys_in_use(bound) == {key_id(RING_KEY): 1}


def test_adopt_takes_every_unverifiable_pod_that_clashes_with_none() -> None:
    bound = keys.judge_all([pod("a-0", LOST, (0,)), pod("b-1", LOST, (1,), index=1)], VIEW)
    plan = keys.plan_adoption(bound, [])
    assert [b.name for b in plan.adopt] == ["ml/a-0", "ml/b-1"] and not plan.refused


def test_adopt_refuses_a_pod_whose_gpu_another_map_holds() -> None:
    # A hostile tenant's pod under an unknown key claims the GPU a verified pod holds.
    bound = keys.judge_all(
        [pod("own-0", RING_KEY, (0,)), pod("squat-0", LOST, (0,), "other")], VIEW
    )
    plan = keys.plan_adoption(bound, [])
    assert not plan.adopt
    [(refused, why)] = plan.refused
    assert refused.name == "ml/squat-0" and "ml/own-0" in why


def test_adopt_refuses_two_lost_pods_claiming_one_slot() -> None:
    bound = keys.judge_all([pod("a-0", LOST, (0,)), pod("b-0", LOST, (1,))], VIEW)
    plan = keys.plan_adoption(bound, [])
    assert not plan.adopt and len(plan.refused) == 2


def test_adopt_by_name_refuses_what_is_not_unverifiable() -> None:
    bound = keys.judge_all([pod("a-0", RING_KEY, (0,))], VIEW)
    with pytest.raises(LookupError, match="its binding is Verified"):
        keys.plan_adoption(bound, ["ml/a-0"])
    with pytest.raises(LookupError, match="not a running pod bound by gpuplace"):
        keys.plan_adoption(bound, ["ml/nope"])
