"""A pod created already bound never takes a GPU that a served map slot declares while the slot's
pod is away: the webhook refuses it at create naming the slot, and the binder never counts its
hold (`placement.declared`, docs/trust.md). The same slot written both ways (pod `<map>-<i>` of
the map's namespace) is the one exception."""

from __future__ import annotations

from typing import Any

import pytest

from controller.podfacts import is_legacy, prebound_legacy
from controller.settings import BinderSettings
from kubeio.pod import Pod
from placement.annotations import LEGACY_ANNOTATION
from placement.compile import Compiler
from placement.declared import declared_elsewhere, own_slot
from placement.gate import Device
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import Model
from placement.types import MapKey, NodeName, SlotKey
from tests.unit.placement.test_gate import PROD, TENANT, THEIRS, cluster_of, inventory, uuid_of
from tests.unit.webhook_builders import make_pod, review
from webhook.admission import build_response
from webhook.settings import AdmissionSettings

SERVE = MapKey(PROD, "serve")


def served() -> Model:
    """prod's map `serve` declares GPUs 3 and 4 of THEIRS (index 0) and GPU 5 (index 1)."""
    compiler = Compiler()
    compiler.set_node(THEIRS, {})
    compiler.set_inventory(inventory(THEIRS, 8))
    compiler.set_map(
        PlacementMap(SERVE, (DeclaredSlot(0, THEIRS, (3, 4)), DeclaredSlot(1, THEIRS, (5,))))
    )
    model, _ = compiler.build()
    return model


# ------------------------------------------------------------------------------ the function


def test_a_declared_gpu_is_found_by_its_index_or_its_uuid() -> None:
    model = served()
    by_index = declared_elsewhere(model, TENANT, "squat-0", THEIRS, (Device(index=3),))
    assert by_index is not None and by_index.slot == SlotKey(SERVE, 0)
    assert f"is declared by map {SERVE} index 0" in str(by_index)
    by_uuid = declared_elsewhere(model, TENANT, "squat-0", THEIRS, (Device(uuid_of(THEIRS, 5)),))
    assert by_uuid is not None and by_uuid.slot == SlotKey(SERVE, 1)
    assert declared_elsewhere(model, TENANT, "squat-0", THEIRS, (Device(index=6),)) is None
    assert declared_elsewhere(model, TENANT, "squat-0", "elsewhere", (Device(index=3),)) is None


@pytest.mark.parametrize(
    ("namespace", "name", "mine"),
    [
        (PROD, "serve-0", True),  # index 0 of map serve, its own namespace: the same slot
        (PROD, "serve-1", False),  # another index of the same map
        (TENANT, "serve-0", False),  # the same name in another namespace
        (PROD, "other-0", False),  # another map's pods
        (PROD, "serve", False),  # no ordinal
    ],
)
def test_only_the_same_slot_written_both_ways_is_not_elsewhere(
    namespace: str, name: str, mine: bool
) -> None:
    found = declared_elsewhere(served(), namespace, name, THEIRS, (Device(index=3),))
    assert (found is None) is mine


def test_own_slot_reads_the_name_as_map_and_index() -> None:
    assert own_slot(PROD, "serve-12") == SlotKey(SERVE, 12)
    assert own_slot(PROD, "a-b-3") == SlotKey(MapKey(PROD, "a-b"), 3)
    assert own_slot(PROD, "serve") is None
    assert own_slot(PROD, "-3") is None


# ------------------------------------------------------------------------------- the webhook


def admit(pod: dict[str, Any], model: Model) -> dict[str, Any]:
    settings = AdmissionSettings(legacy_scheduler_names=("gpu-scheduler",))
    answer: dict[str, Any] = build_response(review(pod), model, settings)["response"]
    return answer


def squat(name: str = "squat-0", namespace: str = TENANT, line: str = f"0={THEIRS}:3") -> Any:
    return make_pod(name, namespace).annotation(LEGACY_ANNOTATION, line).scheduler("gpu-scheduler")


def test_the_webhook_refuses_a_prebound_pod_on_a_declared_gpu_naming_the_slot() -> None:
    out = admit(squat().node(THEIRS).obj(), served())
    assert out["allowed"] is False
    message = out["status"]["message"]
    assert f"pod {TENANT}/squat-0 annotation {LEGACY_ANNOTATION}:1: error:" in message
    assert f"GPU 3 on node {THEIRS} is declared by map {SERVE} index 0" in message
    assert "spec.nodeName" in message


def test_the_webhook_admits_what_is_not_a_squat() -> None:
    model = served()
    # Not pre-bound: the binder places it when the GPU is free of declarations (it waits).
    assert admit(squat().obj(), model)["allowed"] is True
    # Pre-bound on an undeclared GPU of the node.
    assert admit(squat(line=f"0={THEIRS}:6").node(THEIRS).obj(), model)["allowed"] is True
    # The map's own pod, written both ways.
    own = squat("serve-0", PROD).node(THEIRS).obj()
    assert admit(own, model)["allowed"] is True
    # With no map served, nothing is declared.
    assert admit(squat().node(THEIRS).obj(), Model(1, {}))["allowed"] is True


# ---------------------------------------------------------------------------- the controller


def bound_pod(name: str, namespace: str, line: str, scheduler: str = "gpu-scheduler") -> Pod:
    return Pod.of(
        {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": f"uid-{name}",
                "annotations": {LEGACY_ANNOTATION: line},
            },
            "spec": {"nodeName": THEIRS, "schedulerName": scheduler},
        }
    )


def test_a_pod_bound_before_the_map_declared_its_gpu_keeps_it() -> None:
    """The webhook refuses a pod created bound onto a declared GPU; one that exists anyway was
    bound before the declaration (by the earlier tools): it holds, on every rebuild alike."""
    cluster = cluster_of(served(), inventory(THEIRS, 8))
    earlier = prebound_legacy(bound_pod("old-0", TENANT, f"0={THEIRS}:4"), cluster)
    assert earlier is not None and not isinstance(earlier, str)
    assert earlier.gpus == (uuid_of(THEIRS, 4),)
    # The same slot written both ways holds, by UUID; an undeclared GPU holds too.
    own = prebound_legacy(bound_pod("serve-0", PROD, f"0={THEIRS}:3,4"), cluster)
    assert own is not None and not isinstance(own, str)
    assert own.gpus == (uuid_of(THEIRS, 3), uuid_of(THEIRS, 4))
    free = prebound_legacy(bound_pod("squat-0", TENANT, f"0={THEIRS}:6"), cluster)
    assert free is not None and not isinstance(free, str) and free.node == NodeName(THEIRS)


def test_only_the_earlier_tools_pods_hold_by_a_line_of_their_own() -> None:
    """A pod of the binder's schedulerName carrying a line skipped the webhook's legacy checks."""
    settings = BinderSettings()
    line = f"0={THEIRS}:6"
    assert is_legacy(bound_pod("a-0", TENANT, line), settings)
    assert not is_legacy(bound_pod("a-0", TENANT, line, scheduler="gpuplace"), settings)
    assert not is_legacy(bound_pod("a-0", TENANT, line), BinderSettings(legacy=False))
