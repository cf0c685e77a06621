"""The PlacementPolicy model (placement/policyschema.py, the source of the CRD's schema) accepts
exactly what the policy reader (placement/grants.py) accepts, on every policy the tests use."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from placement.errors import PlacementError
from placement.grants import parse_policy
from placement.policyschema import PolicyDocument
from tests.crdcases import POLICY_CASES, UUID, Case, placement_policy
from tests.unit.placement.test_grants import POLICY

HEADER = "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: p}\n"


def grants(*items: str) -> str:
    body = "".join(f"    - {textwrap.indent(i, '      ').lstrip()}\n" for i in items)
    return f"{HEADER}spec:\n  grants:\n{body}"


TEXTS = {
    "grants-test": POLICY,
    "grants-test-unknown-field": POLICY.replace("nodes: [gpu-a-01, node7]", "nodez: [a]"),
    "grants-test-operator": POLICY.replace("operator: In", "operator: Near"),
    "grants-test-device": POLICY.replace("devices: [6, 7]", "devices: [six]"),
    "grants-test-kind": POLICY.replace("kind: PlacementPolicy", "kind: Policy"),
    "grants-test-namespace": POLICY.replace("[inference]", "[Inference_1]"),
    "no-spec": HEADER,
    "null-spec": f"{HEADER}spec: null\n",
    "null-grants": f"{HEADER}spec: {{grants: null}}\n",
    "grant-not-a-mapping": grants("just-a-string"),
    "grants-not-a-list": f"{HEADER}spec: {{grants: {{namespaces: [a]}}}}\n",
    "empty-grant": grants("{}"),
    "null-namespaces": grants("{namespaces: null, nodes: [n1]}"),
    "empty-namespace": grants("{namespaces: [''], nodes: [n1]}"),
    "empty-node": grants("{namespaces: [a], nodes: ['']}"),
    "logical-node-name": grants("{namespaces: [a], nodes: [Node_7]}"),
    "long-node-name": grants("{namespaces: [a], nodes: [" + "n" * 254 + "]}"),
    "empty-selector": grants("{namespaces: [a], nodeSelector: {}}"),
    "null-match-labels": grants("{namespaces: [a], nodeSelector: {matchLabels: null}}"),
    "expression-without-key": grants(
        "{namespaces: [a], nodeSelector: {matchExpressions: [{operator: Exists}]}}"
    ),
    "expression-empty-key": grants(
        "{namespaces: [a], nodeSelector: {matchExpressions: [{key: '', operator: Exists}]}}"
    ),
    "expression-without-operator": grants(
        "{namespaces: [a], nodeSelector: {matchExpressions: [{key: a}]}}"
    ),
    "expression-empty-value": grants(
        "{namespaces: [a], nodeSelector: {matchExpressions: [{key: a, operator: In, values: ['']}]}}"
    ),
    "expression-null-values": grants(
        "{namespaces: [a], nodeSelector: {matchExpressions: [{key: a, operator: In, values: null}]}}"
    ),
    "devices-bool": grants("{namespaces: [a], nodes: [n1], devices: [true]}"),
    "devices-float": grants("{namespaces: [a], nodes: [n1], devices: [1.5]}"),
    "devices-repeated": grants(f"{{namespaces: [a], nodes: [n1], devices: [0, 0, {UUID}]}}"),
    "devices-bounds": grants("{namespaces: [a], nodes: [n1], devices: [0, 255]}"),
    "devices-past-bound": grants("{namespaces: [a], nodes: [n1], devices: [256]}"),
    "devices-null": grants("{namespaces: [a], nodes: [n1], devices: null}"),
    "unknown-top-level": f"{HEADER}spec: {{}}\nstatus: {{}}\n",
    "any-metadata": "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: 3\n",
    "wrong-api-version": "apiVersion: gpuplace.io/v1\nkind: PlacementPolicy\n",
}


def reader_accepts(text: str) -> bool:
    try:
        parse_policy(text, "policy.yaml")
    except PlacementError:
        return False
    return True


def model_accepts(value: Any) -> bool:
    try:
        PolicyDocument.model_validate(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_model_and_reader_agree_on_policy_texts(name: str) -> None:
    text = TEXTS[name]
    assert model_accepts(yaml.safe_load(text)) == reader_accepts(text)


@pytest.mark.parametrize("case", POLICY_CASES, ids=str)
def test_model_and_reader_agree_with_the_crd_cases(case: Case) -> None:
    document = placement_policy(case)
    text = yaml.safe_dump(document)
    expected = case.valid or case.crd_only
    assert reader_accepts(text) == expected
    assert model_accepts(document) == expected


def test_the_texts_cover_both_verdicts() -> None:
    verdicts = {reader_accepts(t) for t in TEXTS.values()}
    assert verdicts == {True, False}
