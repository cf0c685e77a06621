"""Grants: the PlacementPolicy format, its resolution against nodes, and the checks on maps."""

from __future__ import annotations

import textwrap

import pytest

from placement.errors import PlacementError
from placement.grants import GrantView, check_map, parse_policy, resolve
from placement.model import Model, decode_model, encode_model
from placement.types import GpuUuid
from placement.validate import parse_map

POLICY = textwrap.dedent("""\
    apiVersion: gpuplace.io/v1alpha1
    kind: PlacementPolicy
    metadata:
      name: cluster
    spec:
      grants:
        - namespaces: [inference]
          nodes: [gpu-a-01, node7]
        - namespaces: [training, inference]
          nodeSelector:
            matchLabels: {pool: train}
            matchExpressions:
              - {key: zone, operator: In, values: [z1]}
        - namespaces: [research]
          nodes: [gpu-a-01]
          devices: [6, 7]
""")
NODES = {
    "gpu-a-01": {"pool": "serve"},
    "gpu-a-02": {"pool": "serve"},
    "gpu-b-01": {"pool": "train", "zone": "z1", "gpu-node-name": "node3"},
    "gpu-b-02": {"pool": "train", "zone": "z2"},
    "gpu-c-07": {"gpu-node-name": "node7"},
}


def map_text(namespace: str, *entries: str) -> str:
    body = "".join(f"    - {e}\n" for e in entries)
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: m\n  namespace: {namespace}\nspec:\n  placements:\n{body}"
    )


def test_policy_resolves_names_aliases_and_selectors() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), False, NODES)
    assert view.refusal("inference", "gpu-a-01", [0]) is None
    assert view.refusal("inference", "node7", [0]) is None  # logical name ...
    assert view.refusal("inference", "gpu-c-07", [0]) is None  # ... grants the node it names
    assert view.refusal("inference", "gpu-b-01", [0]) is None  # selector
    assert view.refusal("inference", "node3", [0]) is None  # selector, by logical name
    assert "may not place on node gpu-b-02" in str(view.refusal("training", "gpu-b-02", [0]))
    assert "may not place on node gpu-a-02" in str(view.refusal("inference", "gpu-a-02", [0]))
    # A namespace no grant names: allowed by default, refused when grants deny by default.
    assert view.refusal("elsewhere", "gpu-a-02", [0]) is None
    denying = resolve(parse_policy(POLICY, "policy.yaml"), True, NODES)
    assert "has no grant" in str(denying.refusal("elsewhere", "gpu-a-02", [0]))
    assert denying.refusal("inference", "gpu-a-01", [0]) is None


def test_device_grants() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), False, NODES)
    assert view.refusal("research", "gpu-a-01", [6, 7]) is None
    assert "GPU(s) 5 of node gpu-a-01" in str(view.refusal("research", "gpu-a-01", [5, 6]))
    assert "instead of 'count'" in str(view.refusal("research", "gpu-a-01", [], count=True))
    assert "GPU(s) GPU-" in str(view.refusal("research", "gpu-a-01", [GpuUuid("GPU-1")]))


def test_a_new_install_allows_everything() -> None:
    assert GrantView().allows_everything
    assert resolve(parse_policy(POLICY, "p").__class__(), False, NODES).allows_everything
    assert not resolve(parse_policy(POLICY, "p").__class__(), True, NODES).allows_everything


def test_map_outside_its_grants_is_refused_at_each_entry() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), False, NODES)
    text = map_text(
        "inference",
        "{index: 0, node: gpu-a-01, devices: [0]}",
        "{index: 1, node: gpu-a-02, devices: [1]}",
        "{index: 2, node: gpu-b-02, count: 2}",
    )
    diagnostics = check_map(view, parse_map(text, "m.yaml"))
    assert [(d.location.line, d.location.column) for d in diagnostics] == [(9, 7), (10, 7)]
    assert "index 1: namespace inference may not place on node gpu-a-02" in diagnostics[0].message
    assert diagnostics[0].format().startswith("m.yaml:9:7: error: ")


def test_offline_check_skips_what_only_a_selector_could_grant() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), False, None)
    assert view.refusal("training", "gpu-b-02", [0]) is None  # selector: needs node labels
    assert view.refusal("research", "gpu-a-02", [0]) is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            POLICY.replace("nodes: [gpu-a-01, node7]", "nodez: [a]"),
            "policy.yaml:8:7: error: spec.grants[0].nodez: unknown field",
        ),
        (POLICY.replace("operator: In", "operator: Near"), "operator 'Near'"),
        (POLICY.replace("devices: [6, 7]", "devices: [six]"), "device 'six'"),
        (POLICY.replace("kind: PlacementPolicy", "kind: Policy"), "expected kind PlacementPolicy"),
        (POLICY.replace("[inference]", "[Inference_1]"), "is not a namespace name"),
    ],
)
def test_policy_errors_are_located(text: str, message: str) -> None:
    with pytest.raises(PlacementError) as caught:
        parse_policy(text, "policy.yaml")
    assert message in caught.value.format()
    assert "policy.yaml:" in caught.value.format()


def test_model_carries_the_grants() -> None:
    view = resolve(parse_policy(POLICY, "policy.yaml"), True, NODES)
    model = Model(3, {}, view)
    decoded = decode_model(encode_model(model))
    # The logical names travel too: the webhook judges a line's name on the node it resolves to.
    assert decoded.grants == GrantView(view.deny_by_default, view.namespaces, aliases=view.aliases)
    assert decoded.grants.aliases == {"node3": "gpu-b-01", "node7": "gpu-c-07"}
    assert "gpuplace-grants" not in encode_model(Model(3, {}))
