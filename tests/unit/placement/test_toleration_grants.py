"""Tolerating a taint is a grant: the policy's toleration grants, their place in the grant view,
the refusal of a map's ungranted toleration at apply time (with its location), and the use of
only granted tolerations by the compiler and the binder."""

from __future__ import annotations

import textwrap

import pytest

from placement.compile import Compiler
from placement.errors import PlacementError
from placement.grants import (
    ANY_KEY,
    GrantView,
    TolerationGrant,
    check_map,
    granted_map,
    parse_policy,
    resolve,
)
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import Model, decode_model, encode_model
from placement.resource import map_from_resource
from placement.taints import TaintEffect, Toleration, TolerationOperator
from placement.types import MapKey, NodeName
from placement.validate import parse_map
from tests.unit.controller.test_resource_maps import review
from webhook.mapcheck import check_resource

EXISTS = TolerationOperator.EXISTS
EQUAL = TolerationOperator.EQUAL
NO_SCHEDULE = TaintEffect.NO_SCHEDULE
NO_EXECUTE = TaintEffect.NO_EXECUTE
RESERVED = "example.com/reserved"
NODES = {"gpu-node-03": {"gpu-node-name": "node3"}, "gpu-node-04": {}}

POLICY = textwrap.dedent("""\
    apiVersion: gpuplace.io/v1alpha1
    kind: PlacementPolicy
    metadata:
      name: cluster
    spec:
      grants:
        - namespaces: [tenant]
          nodes: [gpu-node-03]
        - namespaces: [platform]
          nodes: [gpu-node-03]
          tolerations:
            - key: example.com/reserved
              effects: [NoSchedule]
            - key: gpu.nvidia.com/xid
        - namespaces: [ops]
          nodes: [node3]
          tolerations:
            - anyKey: true
""")


def view_of(policy: str = POLICY, deny: bool = False) -> GrantView:
    return resolve(parse_policy(policy, "policy.yaml"), deny, NODES)


def map_text(namespace: str, *entries: str) -> str:
    body = "".join(f"    - {e}\n" for e in entries)
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: m\n  namespace: {namespace}\nspec:\n  placements:\n{body}"
    )


# -- the policy's field ------------------------------------------------------------------------
def test_toleration_grants_are_read_per_grant() -> None:
    policy = parse_policy(POLICY, "policy.yaml")
    assert policy.grants[0].tolerations == ()
    assert policy.grants[1].tolerations == (
        TolerationGrant(RESERVED, frozenset({"NoSchedule"})),
        TolerationGrant("gpu.nvidia.com/xid"),
    )
    assert policy.grants[2].tolerations == (TolerationGrant(ANY_KEY),)


def grant_with(tolerations: str) -> str:
    return POLICY.replace("        - key: gpu.nvidia.com/xid\n", f"        - {tolerations}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            grant_with("{key: a, anyKey: true}"),
            "policy.yaml:14:11: error: spec.grants[1].tolerations[1]: a toleration grant needs "
            "exactly one of 'key' and 'anyKey: true'",
        ),
        (
            grant_with("{effects: [NoSchedule]}"),
            "policy.yaml:14:11: error: spec.grants[1].tolerations[1]: a toleration grant needs",
        ),
        (
            grant_with("{anyKey: false}"),
            "spec.grants[1].tolerations[1].anyKey: anyKey is true or omitted",
        ),
        (grant_with("{key: 'a key'}"), "spec.grants[1].tolerations[1].key: 'a key' is not a"),
        (
            grant_with("{key: a, effects: [PreferNoSchedule]}"),
            "spec.grants[1].tolerations[1].effects[0]: effect 'PreferNoSchedule' is not one of",
        ),
        (grant_with("{key: a, effects: []}"), "spec.grants[1].tolerations[1].effects: expected"),
        (grant_with("{key: a, operator: Exists}"), "tolerations[1].operator: unknown field"),
        (
            POLICY.replace("tolerations:\n        - anyKey: true", "tolerations: {anyKey: true}"),
            "spec.grants[2].tolerations",
        ),
    ],
)
def test_a_bad_toleration_grant_is_a_located_error(text: str, message: str) -> None:
    with pytest.raises(PlacementError) as caught:
        parse_policy(text, "policy.yaml")
    assert message in caught.value.format(), caught.value.format()


# -- the view ----------------------------------------------------------------------------------
def test_the_view_grants_keys_and_effects_per_namespace_and_node() -> None:
    view = view_of()
    reserved = Toleration(RESERVED, EXISTS, effect=NO_SCHEDULE)
    assert view.toleration_refusal("platform", "gpu-node-03", reserved) is None
    assert (
        view.toleration_refusal(
            "platform", "gpu-node-03", Toleration(RESERVED, EQUAL, "x", NO_SCHEDULE)
        )
        is None
    )
    # Another effect, or every effect, is not granted by a grant of NoSchedule only.
    evicting = view.toleration_refusal(
        "platform", "gpu-node-03", Toleration(RESERVED, EXISTS, effect=NO_EXECUTE)
    )
    assert "may not tolerate taint key example.com/reserved with effect NoExecute" in str(evicting)
    every_effect = view.toleration_refusal("platform", "gpu-node-03", Toleration(RESERVED, EXISTS))
    assert "(no effect named: every effect)" in str(every_effect)
    # A key granted without effects: every effect of it.
    xid = Toleration("gpu.nvidia.com/xid", EXISTS)
    assert view.toleration_refusal("platform", "gpu-node-03", xid) is None
    # Not on another node, not for another namespace of the same node.
    assert view.toleration_refusal("platform", "gpu-node-04", reserved) is not None
    assert "namespace tenant may not tolerate" in str(
        view.toleration_refusal("tenant", "gpu-node-03", reserved)
    )
    # A toleration without a key tolerates every taint: only anyKey grants it.
    every = Toleration("", EXISTS)
    assert "may not tolerate every taint" in str(
        view.toleration_refusal("platform", "gpu-node-03", every)
    )
    assert "anyKey: true" in str(view.toleration_refusal("platform", "gpu-node-03", every))
    assert view.toleration_refusal("ops", "gpu-node-03", every) is None  # by logical name
    assert view.toleration_refusal("ops", "node3", every) is None
    assert view.toleration_refusal("ops", "node3", reserved) is None


def test_without_a_policy_or_for_a_namespace_it_does_not_name_tolerations_stay_allowed() -> None:
    every = Toleration("", EXISTS)
    assert GrantView().toleration_refusal("anyone", "n", every) is None
    assert view_of().toleration_refusal("unnamed", "gpu-node-03", every) is None
    denied = view_of(deny=True).toleration_refusal("unnamed", "gpu-node-03", every)
    assert "has no grant" in str(denied) and "may tolerate no taint" in str(denied)
    assert "has no grant" in str(
        GrantView(deny_by_default=True).toleration_refusal("a", "n", Toleration(RESERVED, EXISTS))
    )


def test_granted_tolerations_keeps_only_the_granted() -> None:
    view = view_of()
    granted = Toleration(RESERVED, EXISTS, effect=NO_SCHEDULE)
    held = (granted, Toleration("", EXISTS), Toleration("other", EXISTS))
    assert view.granted_tolerations("platform", "gpu-node-03", held) == (granted,)
    assert view.granted_tolerations("tenant", "gpu-node-03", held) == ()
    assert GrantView().granted_tolerations("tenant", "gpu-node-03", held) == held


def test_the_view_round_trips_through_json_and_the_model() -> None:
    view = view_of(deny=True)
    assert view.tolerations["platform"]["gpu-node-03"] == {
        RESERVED: frozenset({"NoSchedule"}),
        "gpu.nvidia.com/xid": None,
    }
    again = GrantView.from_json(view.to_json())
    assert again.tolerations == view.tolerations
    assert again == GrantView(
        view.deny_by_default, view.namespaces, tolerations=view.tolerations, aliases=view.aliases
    )
    assert decode_model(encode_model(Model(2, {}, view))).grants == again
    # A view that grants no toleration writes none (as before the field existed).
    plain = resolve(
        parse_policy(POLICY.split("    - namespaces: [platform]")[0], "p"), False, NODES
    )
    assert "tolerations" not in plain.to_json()
    assert GrantView.from_json(plain.to_json()).tolerations == {}


# -- at apply time -----------------------------------------------------------------------------
def test_the_attack_an_exists_toleration_on_a_granted_node_is_refused_where_written() -> None:
    """A tenant granted a node, not its taints, writes `tolerations: [{operator: Exists}]` to use
    the GPU the platform tainted (DeviceTaintRule example.com/reserved=platform:NoSchedule)."""
    text = map_text(
        "tenant",
        "{index: 0, node: gpu-node-03, devices: [1]}",
        "{index: 1, node: gpu-node-03, devices: [0], tolerations: [{operator: Exists}]}",
    )
    pmap = parse_map(text, "m.yaml")
    [refused] = check_map(view_of(), pmap)
    assert refused.location.path == "spec.placements[1].tolerations[0]"
    assert (refused.location.line, refused.location.column) == (9, 65)
    assert refused.format().startswith(
        "m.yaml:9:65: error: spec.placements[1].tolerations[0]: index 1: toleration "
        "{operator: Exists}: namespace tenant may not tolerate every taint on node gpu-node-03"
    ), refused.format()
    assert refused.hint
    # Without a policy the same map is accepted, as before.
    assert check_map(GrantView(), pmap) == []


def test_each_ungranted_toleration_is_refused_at_its_own_line() -> None:
    text = map_text(
        "platform",
        "index: 0\n      node: gpu-node-03\n      devices: [0]\n      tolerations:\n"
        "        - {key: example.com/reserved, operator: Exists, effect: NoSchedule}\n"
        "        - {key: example.com/reserved, operator: Exists}\n"
        "        - {key: gpu.nvidia.com/xid, value: '79'}",
    )
    diagnostics = check_map(view_of(), parse_map(text, "m.yaml"))
    assert [d.location.path for d in diagnostics] == ["spec.placements[0].tolerations[1]"]
    assert diagnostics[0].location.line == 13
    assert "toleration {key: example.com/reserved, operator: Exists}" in diagnostics[0].message


def test_the_resource_form_refuses_it_at_its_field_too() -> None:
    obj = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementMap",
        "metadata": {"name": "m", "namespace": "tenant"},
        "spec": {
            "placements": [
                {
                    "index": 0,
                    "node": "gpu-node-03",
                    "devices": [0],
                    "tolerations": [{"operator": "Exists"}],
                }
            ]
        },
    }
    [refused] = check_map(view_of(), map_from_resource(obj))
    assert refused.location.path == "spec.placements[0].tolerations[0]"


# -- at compile time and binding time ----------------------------------------------------------
KEY = MapKey("tenant", "m")


def tolerating_map(*tolerations: Toleration) -> PlacementMap:
    return PlacementMap(KEY, (DeclaredSlot(0, "gpu-node-03", (0,), tolerations=tolerations),))


def test_granted_map_drops_only_ungranted_tolerations() -> None:
    pmap = tolerating_map(Toleration("", EXISTS))
    assert granted_map(GrantView(), pmap) is pmap
    assert granted_map(view_of(), pmap).slots[0].tolerations == ()
    platform = PlacementMap(
        MapKey("platform", "m"),
        (
            DeclaredSlot(
                0,
                "gpu-node-03",
                (0,),
                tolerations=(
                    Toleration(RESERVED, EXISTS, effect=NO_SCHEDULE),
                    Toleration("", EXISTS),
                ),
            ),
        ),
    )
    assert granted_map(view_of(), platform).slots[0].tolerations == (
        Toleration(RESERVED, EXISTS, effect=NO_SCHEDULE),
    )


def test_the_compiled_model_keeps_only_granted_tolerations_and_follows_the_grants() -> None:
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-node-03"), {})
    compiler.set_grants(view_of())
    compiler.set_map(tolerating_map(Toleration("", EXISTS)))
    model, _ = compiler.build()
    assert model.maps[KEY].tolerations == {}
    # A policy that grants it: the map compiles again with it (no new offer needed).
    compiler.set_grants(view_of(POLICY.replace("[ops]", "[ops, tenant]")))
    model, _ = compiler.build()
    assert model.maps[KEY].tolerations == {0: (Toleration("", EXISTS),)}


def test_the_model_hands_out_only_the_tolerations_its_grants_give() -> None:
    compiler = Compiler()
    compiler.set_node(NodeName("gpu-node-03"), {})
    compiler.set_map(tolerating_map(Toleration("", EXISTS)))
    model, _ = compiler.build()  # compiled with no policy: the toleration is kept
    assert model.tolerations(KEY, 0) == (Toleration("", EXISTS),)
    # Read under grants that do not give it (a model written before the policy): ignored.
    governed = Model(model.generation, model.maps, view_of())
    assert governed.tolerations(KEY, 0) == ()
    assert governed.tolerations(KEY, 1) == () and governed.tolerations(MapKey("x", "y"), 0) == ()


def test_admission_refuses_the_map_naming_the_toleration() -> None:
    obj = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementMap",
        "metadata": {"name": "m", "namespace": "tenant"},
        "spec": {
            "placements": [
                {
                    "index": 0,
                    "node": "gpu-node-03",
                    "devices": [0],
                    "tolerations": [{"operator": "Exists"}],
                }
            ]
        },
    }
    refused = check_resource(review(obj), view_of())
    assert not refused.allowed
    assert "spec.placements[0].tolerations[0]: index 0: toleration {operator: Exists}" in (
        refused.message
    )
    assert check_resource(review(obj), GrantView()).allowed
