"""The one gate (placement/gate.py): every way a pod comes to hold a GPU is judged on the node
and devices it actually gets, from the compiler, the binder, the pre-bound adoption and the
webhook alike; and the three attacks of a hostile tenant (edit role in its own namespace)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.podfacts import prebound_legacy
from controller.slotcache import SlotCache
from kubeio.pod import Pod
from placement.annotations import LEGACY_ANNOTATION
from placement.binding import (
    Cluster,
    InventoryState,
    NodeState,
    Placement,
    PodFacts,
    Status,
    plan,
)
from placement.compile import Compiler
from placement.gate import Device, Path, identify, judge
from placement.grants import Grant, GrantView, PlacementPolicy, check_map, resolve
from placement.inventory import GpuDevice, MigInstance, NodeInventory
from placement.maps import DeclaredSlot, MigRequest, PlacementMap
from placement.model import Model
from placement.reasons import Reason
from placement.types import DeviceRef, GpuUuid, MapKey, NodeName
from tests.unit.webhook_builders import make_pod, review
from webhook.admission import build_response
from webhook.settings import AdmissionSettings

TENANT = "tenant-a"
PROD = "prod"
OURS = NodeName("gpu-node-01")  # granted to the tenant
THEIRS = NodeName("gpu-node-03")  # granted to prod
H100 = "NVIDIA H100 80GB HBM3"


NUMBERS = {OURS: 1, THEIRS: 3, "tenant-box": 5}


def uuid_of(node: str, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{NUMBERS[node]:08x}-0000-4000-8000-{index:012x}")


def mig_uuid(node: str, index: int) -> str:
    return f"MIG-{NUMBERS[node]:08x}-{index:04x}-4000-8000-000000000000"


def inventory(node: str, n: int = 4, *, mig: tuple[int, ...] = ()) -> NodeInventory:
    return NodeInventory(
        NodeName(node),
        tuple(
            GpuDevice(
                i,
                uuid_of(node, i),
                H100,
                81559,
                f"00000000:{0x18 + i * 0x10:02X}:00.0",
                mig_mode=i in mig,
                mig_instances=(
                    (MigInstance(mig_uuid(node, i), "3g.40gb", 0, 0, 4, 40960),) if i in mig else ()
                ),
            )
            for i in range(n)
        ),
    )


def policy(*, tenant_devices: tuple[DeviceRef, ...] = ()) -> PlacementPolicy:
    return PlacementPolicy(
        (Grant((PROD,), (THEIRS,)), Grant((TENANT,), (OURS,), devices=tenant_devices))
    )


NODES: dict[str, dict[str, str]] = {OURS: {}, THEIRS: {}}
GRANTED = resolve(policy(), False, NODES)
DENYING = resolve(policy(), True, NODES)
#: grants on, off, and deny-by-default: the squat is refused under each
VIEWS = pytest.mark.parametrize(
    "view", [GRANTED, DENYING, GrantView()], ids=["grants", "deny-by-default", "no-policy"]
)


def cluster_of(
    model: Model, *nodes: NodeInventory, aliases: dict[str, str] | None = None
) -> Cluster:
    alias_of = aliases or {}
    return Cluster(
        model,
        {i.node: NodeState(i.node, alias=alias_of.get(i.node)) for i in nodes},
        {a: frozenset({NodeName(n)}) for n, a in alias_of.items()},
        {i.node: InventoryState(i) for i in nodes},
    )


# ---------------------------------------------------------------------------- the function


def test_a_gpu_is_granted_by_its_index_or_its_uuid_as_the_inventory_maps_them() -> None:
    view = resolve(policy(tenant_devices=(0, uuid_of(OURS, 1))), False, NODES)
    inv = inventory(OURS)
    # Written as a UUID, granted by index; written as an index, granted by UUID.
    assert judge(view, TENANT, Path.MAP, OURS, identify(inv, [uuid_of(OURS, 0), 1])) is None
    refused = judge(view, TENANT, Path.MAP, OURS, identify(inv, [2]))
    assert refused is not None
    assert refused.namespace == TENANT and refused.node == OURS
    assert refused.devices == (Device(uuid_of(OURS, 2), 2),)
    assert f"namespace {TENANT} may not use GPU(s) 2 ({uuid_of(OURS, 2)}) of node {OURS}" in str(
        refused
    )
    # Without the inventory a GPU keeps only the name it was written as: never granted by the other.
    assert judge(view, TENANT, Path.LEGACY, OURS, identify(None, [1])) is not None


def test_a_mig_instance_is_judged_as_its_parent_gpu() -> None:
    inv = inventory(OURS, mig=(0, 1))
    assert identify(inv, [mig_uuid(OURS, 1)]) == (Device(uuid_of(OURS, 1), 1),)
    view = resolve(policy(tenant_devices=(0,)), False, NODES)
    assert judge(view, TENANT, Path.MIG, OURS, identify(inv, [mig_uuid(OURS, 0)])) is None
    assert judge(view, TENANT, Path.MIG, OURS, identify(inv, [mig_uuid(OURS, 1)])) is not None


def test_namespaces_and_nodes_outside_the_grants() -> None:
    devices = (Device(uuid_of(THEIRS, 0), 0),)
    refused = judge(GRANTED, TENANT, Path.MAP, THEIRS, devices)
    assert refused is not None
    assert f"namespace {TENANT} may not place on node {THEIRS}" in str(refused)
    assert judge(GRANTED, "elsewhere", Path.MAP, THEIRS, devices) is None  # allowed by default
    assert "deny by default" in str(judge(DENYING, "elsewhere", Path.MAP, THEIRS, devices))
    assert judge(GrantView(), TENANT, Path.MAP, THEIRS, devices) is None
    assert judge(GRANTED, PROD, Path.DRA, THEIRS, devices) is None


# ---------------------------------------------------------------------- attack 1: pre-bound


def squatter(node: str = THEIRS, line: str = f"0={OURS}:0,1", name: str = "squat-0") -> Pod:
    return Pod.of(
        {
            "metadata": {
                "namespace": TENANT,
                "name": name,
                "uid": f"uid-{name}",
                "annotations": {LEGACY_ANNOTATION: line},
            },
            "spec": {"nodeName": node, "schedulerName": "gpu-scheduler"},
        }
    )


@VIEWS
def test_a_prebound_pod_on_another_node_than_its_line_holds_nothing(view: GrantView) -> None:
    cluster = cluster_of(Model(1, {}, view), inventory(OURS), inventory(THEIRS))
    refused = prebound_legacy(squatter(), cluster)
    assert isinstance(refused, str)
    assert f"runs on node {THEIRS}, but node {OURS!r} resolves to node {OURS}" in refused
    assert f"pod {TENANT}/squat-0" in refused


def test_a_prebound_pod_on_its_lines_node_holds_its_gpus_by_uuid() -> None:
    cluster = cluster_of(Model(1, {}, GRANTED), inventory(OURS), inventory(THEIRS))
    held = prebound_legacy(squatter(node=OURS), cluster)
    assert not isinstance(held, str) and held is not None
    assert held.node == OURS and held.gpus == (uuid_of(OURS, 0), uuid_of(OURS, 1))
    # A logical name counts as the node the resolver picks for it.
    aliased = cluster_of(
        Model(1, {}, GRANTED), inventory(OURS), inventory(THEIRS), aliases={OURS: "box1"}
    )
    held = prebound_legacy(squatter(node=OURS, line="0=box1:0"), aliased)
    assert not isinstance(held, str) and held is not None and held.node == OURS
    # On its own line's node, but outside the grants: nothing either.
    outside = prebound_legacy(squatter(line=f"0={THEIRS}:0"), cluster)
    assert isinstance(outside, str) and f"may not place on node {THEIRS}" in outside


def admit(pod: dict[str, Any], view: GrantView) -> dict[str, Any]:
    settings = AdmissionSettings(legacy_scheduler_names=("gpu-scheduler",))
    answer: dict[str, Any] = build_response(review(pod), Model(1, {}, view), settings)["response"]
    return answer


@pytest.mark.parametrize("view", [GRANTED, DENYING], ids=["grants", "deny-by-default"])
def test_the_webhook_refuses_a_prebound_pod_off_its_lines_node(view: GrantView) -> None:
    squat = (
        make_pod("squat-0", TENANT)
        .annotation(LEGACY_ANNOTATION, f"0={OURS}:0,1")
        .scheduler("gpu-scheduler")
        .node(THEIRS)
        .obj()
    )
    out = admit(squat, view)
    assert out["allowed"] is False
    assert (
        f"runs on node {THEIRS}, but node {OURS!r} resolves to node {OURS}"
        in (out["status"]["message"])
    )
    honest = (
        make_pod("honest-0", TENANT)
        .annotation(LEGACY_ANNOTATION, f"0={OURS}:0,1")
        .scheduler("gpu-scheduler")
        .node(OURS)
        .obj()
    )
    assert admit(honest, view)["allowed"] is True


def test_the_webhook_resolves_a_lines_logical_name_through_the_published_grants() -> None:
    view = resolve(policy(), False, {OURS: {"gpu-node-name": "box1"}, THEIRS: {}})
    pod = (
        make_pod("t-0", TENANT).annotation(LEGACY_ANNOTATION, "0=box1:0").scheduler("gpu-scheduler")
    )
    assert admit(pod.node(OURS).obj(), view)["allowed"] is True
    assert admit(pod.node(THEIRS).obj(), view)["allowed"] is False


# --------------------------------------------------------- attack 2: logical name = real name


#: The tenant's node carries, as its logical name, the real name of prod's node.
CONFUSING = {"tenant-box": {"gpu-node-name": THEIRS}, THEIRS: {}}


def confusing_policy() -> PlacementPolicy:
    return PlacementPolicy((Grant((TENANT,), ("tenant-box",)), Grant((PROD,), (THEIRS,))))


def test_a_grant_means_the_node_the_resolver_picks() -> None:
    view = resolve(confusing_policy(), True, CONFUSING)
    assert view.refusal(TENANT, "tenant-box", [0]) is None
    # The name resolves to prod's node (a node's own name wins), which the tenant is not granted.
    assert f"may not place on node {THEIRS}" in str(view.refusal(TENANT, THEIRS, [0]))
    assert view.refusal(PROD, THEIRS, [0]) is None
    assert "may not place on node tenant-box" in str(view.refusal(PROD, "tenant-box", [0]))
    squat = PlacementMap(MapKey(TENANT, "m"), (DeclaredSlot(0, THEIRS, (0,)),))
    assert [d.message for d in check_map(view, squat)] == [
        f"index 0: namespace {TENANT} may not place on node {THEIRS}: no grant in "
        "gpuplace-system/gpuplace-policy gives it that node"
    ]


def test_a_logical_name_on_several_nodes_grants_none_of_them() -> None:
    nodes = {"a": {"gpu-node-name": "pool"}, "b": {"gpu-node-name": "pool"}}
    view = resolve(PlacementPolicy((Grant((TENANT,), ("pool",)),)), False, nodes)
    assert view.refusal(TENANT, "a", [0]) is not None
    assert view.refusal(TENANT, "pool", [0]) is not None


def compiled(view: GrantView, *slots: DeclaredSlot, namespace: str = TENANT) -> Model:
    compiler = Compiler()
    for name, labels in CONFUSING.items():
        compiler.set_node(NodeName(name), labels)
    compiler.set_inventory(inventory("tenant-box"))
    compiler.set_inventory(inventory(THEIRS, mig=(3,)))
    compiler.set_grants(view)
    compiler.set_map(PlacementMap(MapKey(namespace, "m"), slots))
    model, _ = compiler.build()
    return model


def test_the_compiler_blocks_a_slot_on_the_node_it_actually_compiles_onto() -> None:
    view = resolve(confusing_policy(), False, CONFUSING)
    model = compiled(view, DeclaredSlot(0, THEIRS, (0,)))
    slot = model.slot(MapKey(TENANT, "m"), 0)
    assert slot is not None and slot.node == THEIRS
    assert slot.blocked == Reason.NOT_GRANTED
    assert f"may not place on node {THEIRS}" in slot.message
    # Blocked slots claim nothing: prod's own map keeps its GPU.
    assert model.declared_by(THEIRS, uuid_of(THEIRS, 0)) == ()


# --------------------------------------------- the compiler's paths: count, fallback, MIG


@pytest.mark.parametrize(
    ("slot", "devices", "granted"),
    [
        (DeclaredSlot(0, THEIRS, count=2), (), True),
        (DeclaredSlot(0, "tenant-box", count=2), (), False),  # a pick on a node not granted
        (DeclaredSlot(0, THEIRS, (uuid_of(THEIRS, 1),)), (0, 1), True),  # UUID, granted by index
        (DeclaredSlot(0, THEIRS, (1,)), (uuid_of(THEIRS, 1),), True),  # index, granted by UUID
        (DeclaredSlot(0, THEIRS, (2,)), (0, 1), False),
        (DeclaredSlot(0, THEIRS, mig=MigRequest(3, "3g.40gb")), (3,), True),  # via parent GPU 3
        (DeclaredSlot(0, THEIRS, mig=MigRequest(3, "3g.40gb")), (0, 1), False),
    ],
)
def test_each_compiled_path_is_judged_on_its_resolved_devices(
    slot: DeclaredSlot, devices: tuple[DeviceRef, ...], granted: bool
) -> None:
    view = resolve(PlacementPolicy((Grant((PROD,), (THEIRS,), devices=devices),)), True, CONFUSING)
    served = compiled(view, slot, namespace=PROD).slot(MapKey(PROD, "m"), 0)
    assert served is not None and served.resolved
    assert (served.blocked == Reason.NOT_GRANTED) is not granted, served.message
    if not granted:
        assert f"namespace {PROD} may" in served.message


def test_a_spare_that_stands_in_outside_the_grant_blocks_the_slot() -> None:
    view = resolve(PlacementPolicy((Grant((PROD,), (THEIRS,), devices=(0, 1)),)), False, CONFUSING)
    # GPU 3 is in MIG mode: not whole, so the spare 2 would stand in for it.
    model = compiled(view, DeclaredSlot(0, THEIRS, (3,), fallback=(2,)), namespace=PROD)
    served = model.slot(MapKey(PROD, "m"), 0)
    assert served is not None and served.blocked == Reason.NOT_GRANTED
    assert "GPU(s) 2" in served.message


# ------------------------------------------------ attack 3: a legacy line on a map's GPU


def test_a_legacy_line_waits_for_a_gpu_an_exclusive_map_declares_while_its_pod_is_away() -> None:
    compiler = Compiler()
    compiler.set_node(THEIRS, {})
    compiler.set_inventory(inventory(THEIRS))
    compiler.set_map(PlacementMap(MapKey(PROD, "serve"), (DeclaredSlot(0, THEIRS, (0, 1)),)))
    model, _ = compiler.build()
    cluster = cluster_of(model, inventory(THEIRS))
    # prod's pod is away (restarting): nobody holds the GPUs, the model still declares them.
    squat = PodFacts(TENANT, "squat-0", "u1", {}, legacy_map=f"0={THEIRS}:1")
    status = plan(squat, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_BUSY
    assert f"is declared by map {PROD}/serve index 0" in status.message
    free = PodFacts(TENANT, "fine-0", "u2", {}, legacy_map=f"0={THEIRS}:2")
    assert isinstance(plan(free, cluster, SlotCache()), Placement)


def test_a_legacy_line_serves_the_slot_its_own_namespaces_map_declares_at_its_index() -> None:
    """A map made from the same gpu-scheduling-map text (its pods not migrated yet): the line of
    pod serve-i in the map's namespace serves index i of map serve; another index, another
    namespace or pods of another name still wait."""
    compiler = Compiler()
    compiler.set_node(THEIRS, {})
    compiler.set_inventory(inventory(THEIRS))
    declared = (DeclaredSlot(0, THEIRS, (0, 1)), DeclaredSlot(1, THEIRS, (2,)))
    compiler.set_map(PlacementMap(MapKey(PROD, "serve"), declared))
    model, _ = compiler.build()
    cluster = cluster_of(model, inventory(THEIRS))
    same = PodFacts(PROD, "serve-0", "u1", {}, legacy_map=f"0={THEIRS}:0,1")
    assert isinstance(plan(same, cluster, SlotCache()), Placement)
    other_index = PodFacts(PROD, "serve-1", "u2", {}, legacy_map=f"1={THEIRS}:0")
    status = plan(other_index, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_BUSY
    other_namespace = PodFacts(TENANT, "serve-0", "u3", {}, legacy_map=f"0={THEIRS}:0,1")
    status = plan(other_namespace, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_BUSY
    other_name = PodFacts(PROD, "waiter-0", "u4", {}, legacy_map=f"0={THEIRS}:0,1")
    status = plan(other_name, cluster, SlotCache())
    assert isinstance(status, Status) and status.reason == Reason.DEVICE_BUSY
