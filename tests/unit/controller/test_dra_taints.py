"""DRA device taints as health, and the tolerations of a slot: reading taints from slices and
DeviceTaintRules, Kubernetes' toleration semantics, the binder's check, the allocation written,
the map field from text to the model, and MIG instances in ResourceSlices."""

from __future__ import annotations

import copy
import textwrap
from dataclasses import replace
from typing import Any

import pytest

from controller.binder import Binder
from controller.dra import DraTracker
from controller.metrics import ControllerMetrics
from controller.settings import BinderSettings
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.annotations import BindingDecision
from placement.binding import Placement, Status
from placement.compile import Compiler
from placement.devices import GpuId
from placement.dra import (
    DELETE_PROTECTION,
    TYPE_MIG,
    allocation_status,
    slice_devices,
    slice_for,
)
from placement.draalloc import ClaimPlan
from placement.grants import parse_policy, resolve
from placement.inventory import GpuDevice, MigInstance, NodeInventory, device_problems
from placement.keyring import TrustView, new_ring
from placement.maps import DeclaredSlot
from placement.model import decode_map, encode_map
from placement.reasons import Reason
from placement.taints import (
    DeviceTaint,
    TaintEffect,
    Toleration,
    TolerationOperator,
    read_taint_rule,
    read_taints,
    untolerated,
)
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey
from placement.validate import load_maps, parse_map
from tests.unit.controller.test_dra import (
    KEY,
    NODE,
    SETTINGS,
    ClaimApi,
    Slots,
    claim,
    decide_once,
    dra_pod,
    ml_claim,
    pod,
    published,
)
from tests.unit.fakesender import InlineSender
from tests.unit.placement.test_binding_plan import build
from tests.unit.placement.test_binding_plan import inventory as plan_inventory
from tests.unit.webhook_builders import map_header

XID = DeviceTaint("gpu.nvidia.com/xid", "79", "NoSchedule")
EXISTS = TolerationOperator.EXISTS
EQUAL = TolerationOperator.EQUAL


# -- toleration semantics ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (Toleration("gpu.nvidia.com/xid", EXISTS), True),
        (Toleration("gpu.nvidia.com/xid", EQUAL, "79"), True),
        (Toleration("gpu.nvidia.com/xid", EQUAL, "48"), False),
        (Toleration("gpu.nvidia.com/xid"), False),  # Equal with no value: value must be empty
        (Toleration("other", EXISTS), False),
        (Toleration("", EXISTS), True),  # empty key with Exists: every taint
        (Toleration("", EXISTS, effect=TaintEffect.NO_EXECUTE), False),
        (Toleration("gpu.nvidia.com/xid", EXISTS, effect=TaintEffect.NO_SCHEDULE), True),
        (Toleration("", EQUAL, "79"), False),  # no key needs Exists
    ],
)
def test_a_toleration_matches_as_kubernetes_matches_it(
    toleration: Toleration, tolerated: bool
) -> None:
    assert toleration.tolerates(XID) is tolerated


def test_only_blocking_taints_that_no_toleration_tolerates_keep_a_device() -> None:
    informs = DeviceTaint("health", "degraded", "None")
    newer = DeviceTaint("future", "", "SomeNewEffect")  # unknown effects keep the device away
    evicts = DeviceTaint("maintenance", "", "NoExecute")
    taints = [XID, informs, newer, evicts]
    assert untolerated(taints, ()) == (XID, newer, evicts)
    assert untolerated(taints, [Toleration("gpu.nvidia.com/xid", EXISTS)]) == (newer, evicts)
    assert untolerated(taints, [Toleration("", EXISTS)]) == ()
    assert evicts.describe() == "maintenance:NoExecute" and XID.describe() == (
        "gpu.nvidia.com/xid=79:NoSchedule"
    )


def test_tolerations_round_trip_through_their_model_rows() -> None:
    for tol in (Toleration(), Toleration("k", EXISTS, "", TaintEffect.NO_EXECUTE)):
        assert Toleration.decode(tol.encode()) == tol
    assert Toleration("k", EQUAL, "v", TaintEffect.NO_SCHEDULE).to_api() == {
        "key": "k",
        "operator": "Equal",
        "value": "v",
        "effect": "NoSchedule",
    }


# -- reading slices and rules ----------------------------------------------------------------------
def tainted_slice(*taints: dict[str, str], gpu: int = 1) -> dict[str, Any]:
    body = published()
    body["spec"]["devices"][gpu]["taints"] = list(taints)
    return body


def test_slice_devices_keep_their_taints() -> None:
    body = tainted_slice({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"})
    body["spec"]["devices"][1]["taints"].append({"value": "no key"})  # unusable: skipped
    devices = {d.name: d for d in slice_devices([body], SETTINGS)}
    assert devices["gpu-1"].taints == (XID,)
    assert devices["gpu-0"].taints == ()
    assert read_taints({"taints": None}) == ()


def test_a_taint_rule_without_a_selector_selects_nothing_an_empty_one_everything() -> None:
    taint = {"key": "maintenance", "effect": "NoExecute"}
    assert read_taint_rule({"metadata": {"name": "r"}, "spec": {"taint": taint}}) is None
    every = read_taint_rule(
        {"metadata": {"name": "r"}, "spec": {"deviceSelector": {}, "taint": taint}}
    )
    assert every is not None and every.selects("any", "pool", "gpu-9")
    one = read_taint_rule(
        {
            "metadata": {"name": "r"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"},
                "taint": taint,
            },
        }
    )
    assert one is not None and one.taint == DeviceTaint("maintenance", "", "NoExecute")
    assert one.selects("gpu.nvidia.com", NODE, "gpu-1")
    assert not one.selects("gpu.nvidia.com", NODE, "gpu-2")
    assert not one.selects("other.example.com", NODE, "gpu-1")


def mig_inventory() -> NodeInventory:
    parent = GpuUuid("GPU-mig-parent")
    migs = (
        MigInstance("MIG-aaaa", "3g.40gb", 0, 0, 4, 40320),
        MigInstance("MIG-bbbb", "1g.10gb+me", 1, 6, 1, 9856),
    )
    return NodeInventory(
        NODE,
        (GpuDevice(0, parent, "NVIDIA H100 80GB HBM3", 81559, mig_mode=True, mig_instances=migs),),
    )


def test_mig_instances_are_devices_of_type_mig_named_as_dns_labels() -> None:
    devices = slice_devices([slice_for(mig_inventory(), SETTINGS)], SETTINGS)
    assert [(d.name, d.uuid, d.kind, d.parent, d.profile) for d in devices] == [
        ("gpu-0", "GPU-mig-parent", "gpu", None, ""),
        ("gpu-0-mig-3g-40gb-0", "MIG-aaaa", TYPE_MIG, "GPU-mig-parent", "3g.40gb"),
        ("gpu-0-mig-1g-10gb-me-6", "MIG-bbbb", TYPE_MIG, "GPU-mig-parent", "1g.10gb+me"),
    ]


# -- the binder's check ----------------------------------------------------------------------------
def placement_of(*uuids: str) -> Placement:
    held = tuple(GpuUuid(u) for u in uuids)
    decision = BindingDecision(KEY, 0, NODE, held, ",".join(held), 1)
    gpus = tuple(GpuId.of_uuid(u) for u in uuids)
    return Placement(SlotKey(KEY, 0), decision, Sharing.EXCLUSIVE, gpus)


def tracker_with(body: dict[str, Any]) -> tuple[DraTracker, list[set[str]]]:
    woken: list[set[str]] = []
    t = DraTracker(SETTINGS, lambda keys: woken.append(set(keys)))
    t.on_slice("ADDED", body, None)
    t.on_claim("ADDED", claim(), None)
    return t, woken


GPU1 = f"GPU-{NODE}-1"


def test_a_tainted_declared_device_degrades_its_slot_with_the_taint_named() -> None:
    t, _ = tracker_with(
        tainted_slice({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"})
    )
    status = t.check(Pod.of(pod()), placement_of(GPU1), Slots())
    assert isinstance(status, Status)
    assert status.reason is Reason.DEVICE_TAINTED
    assert "gpu.nvidia.com/xid=79:NoSchedule (in its ResourceSlice)" in status.message
    assert f"device {GPU1} ({NODE}/gpu-1)" in status.message
    # Untainted devices of the same node still serve.
    assert isinstance(t.check(Pod.of(pod()), placement_of(f"GPU-{NODE}-2"), Slots()), ClaimPlan)


def test_a_tolerated_taint_serves_and_the_allocation_carries_the_tolerations() -> None:
    t, _ = tracker_with(
        tainted_slice({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"})
    )
    tolerations = (Toleration("gpu.nvidia.com/xid", EXISTS),)
    plan = t.check(Pod.of(pod()), placement_of(GPU1), Slots(), tolerations)
    assert isinstance(plan, ClaimPlan) and plan.tolerations == tolerations
    status = allocation_status(plan.devices, NODE, "web-0", "u1", SETTINGS.driver, tolerations)
    [result] = status["allocation"]["devices"]["results"]
    assert result["tolerations"] == [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]
    untolerating = allocation_status(plan.devices, NODE, "web-0", "u1", SETTINGS.driver)
    assert "tolerations" not in untolerating["allocation"]["devices"]["results"][0]


def test_a_none_effect_taint_only_informs() -> None:
    t, _ = tracker_with(tainted_slice({"key": "health", "value": "degraded", "effect": "None"}))
    assert isinstance(t.check(Pod.of(pod()), placement_of(GPU1), Slots()), ClaimPlan)


def rule(name: str, device: str, effect: str = "NoExecute") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": SETTINGS.driver, "pool": NODE, "device": device},
            "taint": {"key": "example.com/maintenance", "value": "now", "effect": effect},
        },
    }


def test_a_device_taint_rule_degrades_the_devices_it_selects_until_deleted() -> None:
    t, woken = tracker_with(published())
    t.on_taint_rule("ADDED", rule("drain-gpu-1", "gpu-1"), None)
    assert f"inventory:{NODE}" in woken[-1]
    status = t.check(Pod.of(pod()), placement_of(GPU1), Slots())
    assert isinstance(status, Status) and status.reason is Reason.DEVICE_TAINTED
    assert "example.com/maintenance=now:NoExecute (by DeviceTaintRule drain-gpu-1)" in (
        status.message
    )
    tolerated = (Toleration("example.com/maintenance", EQUAL, "now", TaintEffect.NO_EXECUTE),)
    assert isinstance(t.check(Pod.of(pod()), placement_of(GPU1), Slots(), tolerated), ClaimPlan)
    t.on_taint_rule("DELETED", rule("drain-gpu-1", "gpu-1"), None)
    assert isinstance(t.check(Pod.of(pod()), placement_of(GPU1), Slots()), ClaimPlan)


def test_a_rule_edited_to_select_nothing_stops_tainting() -> None:
    t, _ = tracker_with(published())
    t.on_taint_rule("ADDED", rule("r", "gpu-1"), None)
    edited = copy.deepcopy(rule("r", "gpu-1"))
    del edited["spec"]["deviceSelector"]
    t.on_taint_rule("MODIFIED", edited, None)
    assert isinstance(t.check(Pod.of(pod()), placement_of(GPU1), Slots()), ClaimPlan)


def test_a_mig_slot_is_allocated_its_mig_device_and_its_taint_is_its_own() -> None:
    body = slice_for(mig_inventory(), SETTINGS)
    body["spec"]["devices"][2]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    t, _ = tracker_with(body)
    plan = t.check(Pod.of(pod()), placement_of("MIG-aaaa"), Slots())
    assert isinstance(plan, ClaimPlan)
    assert [d.name for d in plan.devices] == ["gpu-0-mig-3g-40gb-0"]
    status = t.check(Pod.of(pod()), placement_of("MIG-bbbb"), Slots())
    assert isinstance(status, Status) and status.reason is Reason.DEVICE_TAINTED


# -- the map field -------------------------------------------------------------------------------
def map_text(tolerations: str) -> str:
    """A one-slot map whose slot has `tolerations` (YAML list items)."""
    items = textwrap.indent(textwrap.dedent(tolerations), " " * 8)
    return (
        map_header()
        + (
            "  placements:\n"
            "    - index: 0\n"
            "      node: gpu-1\n"
            "      devices: [0]\n"
            "      tolerations:\n"
        )
        + items
    )


def test_tolerations_reach_the_compiled_model_and_survive_its_codec() -> None:
    pmap = parse_map(
        map_text("""\
            - {key: gpu.nvidia.com/xid, operator: Exists, effect: NoSchedule}
            - {key: example.com/maintenance, value: now}
        """),
        "m.yaml",
    )
    wanted = (
        Toleration("gpu.nvidia.com/xid", EXISTS, "", TaintEffect.NO_SCHEDULE),
        Toleration("example.com/maintenance", EQUAL, "now"),
    )
    assert pmap.slots[0].tolerations == wanted
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-1"), {})
    compiler.set_map(pmap)
    cmap = compiler.build()[0].maps[pmap.key]
    assert cmap.tolerations == {0: wanted}
    again = decode_map(pmap.key, encode_map(cmap))
    assert again.tolerations == {0: wanted} and again.content_equal(cmap)
    assert "tolerations" not in encode_map(decode_map(MapKey("ml", "x"), _no_tolerations()))


def _no_tolerations() -> dict[str, Any]:
    return {"sharing": "exclusive", "indexing": "auto", "envMode": "index", "slots": []}


@pytest.mark.parametrize(
    ("toleration", "message"),
    [
        ("- {operator: Equal, value: x}", "a toleration without a key must use operator Exists"),
        ("- {key: k, operator: Exists, value: x}", "operator Exists takes no value"),
        ("- {key: 'bad key'}", "'bad key' is not a taint key"),
        ("- {key: k, effect: PreferNoSchedule}", "NoSchedule"),
        ("- {key: k, value: '-x'}", "'-x' is not a taint value"),
    ],
)
def test_a_bad_toleration_is_a_located_error(toleration: str, message: str) -> None:
    result = load_maps(map_text(toleration), "m.yaml")
    assert not result.maps
    [found] = result.diagnostics
    assert message in found.message, found.message
    assert found.location.source == "m.yaml" and found.location.line > 1
    assert "tolerations" in found.location.path


# -- tolerating is a grant: the binder honours only granted tolerations --------------------------
RESERVED = {"key": "example.com/reserved", "value": "platform", "effect": "NoSchedule"}
GRANTED_POLICY = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementPolicy
metadata: {name: cluster}
spec:
  grants:
    - namespaces: [ml]
      nodes: [gpu-1]
"""


def taint_binder(api: ClaimApi, policy: str, *tolerations: Toleration) -> Binder:
    """A binder (dra enforcement) whose model serves map ml/llm index 0 on GPU 0 of gpu-1, which
    the platform tainted `RESERVED`; the slot declares `tolerations` and the model carries the
    grants of `policy`."""
    inventory = plan_inventory("gpu-1", 2)
    body = slice_for(inventory, SETTINGS)
    body["spec"]["devices"][0]["taints"] = [RESERVED]
    t = DraTracker(SETTINGS, lambda keys: None)
    t.on_slice("ADDED", body, None)
    cluster = build([DeclaredSlot(0, "gpu-1", (0,), tolerations=tolerations)])
    grants = resolve(parse_policy(policy, "policy.yaml"), False, {"gpu-1": {}})
    cluster = replace(cluster, model=replace(cluster.model, grants=grants))
    binder = Binder(
        api,  # type: ignore[arg-type]
        BinderSettings(bind_workers=1),
        ControllerMetrics(),
        EventRecorder(api, "gpuplace"),  # type: ignore[arg-type]
        lambda: cluster,
        dra=t,
        sender=lambda: InlineSender(api),
    )
    binder.trust = TrustView.of(new_ring(b"k" * 32, "2026-01-01T00:00:00Z"))
    t._wake = binder.wake
    claimed = api.add(ml_claim())
    claimed["metadata"]["finalizers"] = [DELETE_PROTECTION]
    api.add(claimed)
    t.on_claim("ADDED", claimed, None)
    decide_once(binder, dra_pod(claimed["metadata"]["name"]))
    binder.side.shutdown(wait=True)
    return binder


def test_an_ungranted_exists_toleration_does_not_tolerate_the_platforms_taint() -> None:
    """The attack: a tenant granted the node, not its taints, tolerates everything in its map;
    its pod waits DeviceTainted as if it tolerated nothing, and no claim is allocated."""
    api = ClaimApi()
    taint_binder(api, GRANTED_POLICY, Toleration("", EXISTS))
    assert api.kinds() == ["pod status", "event"]
    condition = api.writes[0][1]["status"]["conditions"][0]
    assert condition["reason"] == Reason.DEVICE_TAINTED
    assert "example.com/reserved=platform:NoSchedule" in condition["message"]


def test_the_allocation_carries_only_the_granted_tolerations() -> None:
    api = ClaimApi()
    policy = GRANTED_POLICY + (
        "      tolerations: [{key: example.com/reserved, effects: [NoSchedule]}]\n"
    )
    granted = Toleration("example.com/reserved", EXISTS, effect=TaintEffect.NO_SCHEDULE)
    taint_binder(api, policy, granted, Toleration("", EXISTS), Toleration("other", EXISTS))
    assert api.kinds() == ["status", "binding"]
    [result] = api.writes[0][1]["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0"
    assert result["tolerations"] == [granted.to_api()]


def test_unhealthy_stays_untolerable_whatever_the_grants() -> None:
    """Health the agent reports is no taint: a slot tolerating every taint, granted every key,
    still does not get an unhealthy GPU."""
    every = Toleration("", EXISTS)
    policy = GRANTED_POLICY + "      tolerations: [{anyKey: true}]\n"
    grants = resolve(parse_policy(policy, "policy.yaml"), True, {"gpu-1": {}})
    assert grants.toleration_refusal("ml", "gpu-1", every) is None
    sick = plan_inventory("gpu-1", 2, unhealthy=(0,))
    problems = device_problems(sick.devices[0], None, "0", tolerations=[every])
    assert [reason for reason, _ in problems] == [Reason.DEVICE_UNHEALTHY]
