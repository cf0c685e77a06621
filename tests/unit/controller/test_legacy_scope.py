"""The legacy namespace selector holds for the controller as for the webhook: a pod of the earlier
tools' schedulerName in a namespace the selector does not choose is neither placed nor held by its
own gpu-scheduling-map line (controller/legacyscope.py)."""

from __future__ import annotations

from typing import Any

import pytest

from controller import podfacts
from controller.legacyscope import LegacyScope
from controller.settings import BinderSettings
from kubeio.pod import Pod
from placement.annotations import LEGACY_ANNOTATION
from placement.binding import Code, Status, plan
from placement.errors import PlacementError
from placement.grants import parse_label_selector
from placement.reasons import Reason
from tests.unit.controller.test_binder import Apiserver, binder_for
from tests.unit.placement.test_binding_plan import TWO_SLOTS, build

SELECTOR = parse_label_selector(
    '{"matchLabels": {"gpuplace.io/legacy": "enabled"}, "matchExpressions": '
    '[{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}',
    "--legacy-namespace-selector",
)
SETTINGS = BinderSettings(legacy_namespace_selector=SELECTOR)


class Namespaces:
    """The namespaces informer's read side (`get`), as the trimmed store holds them."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels = labels

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert namespace == ""
        if name not in self.labels:
            return None
        # The apiserver labels every namespace with its name.
        labels = {**self.labels[name], "kubernetes.io/metadata.name": name}
        return {"metadata": {"name": name, "labels": labels}}


SCOPE = LegacyScope(
    SELECTOR,
    Namespaces(  # type: ignore[arg-type]
        {
            "legacy-ok": {"gpuplace.io/legacy": "enabled"},
            "other": {},
            "kube-system": {"gpuplace.io/legacy": "enabled"},
        }
    ),
)


def legacy_pod(namespace: str, node: str = "") -> Pod:
    obj: dict[str, Any] = {
        "metadata": {
            "namespace": namespace,
            "name": "train-0",
            "uid": f"u-{namespace}",
            "annotations": {LEGACY_ANNOTATION: "0=gpu-1:0"},
        },
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }
    if node:
        obj["spec"]["nodeName"] = node
    return Pod.of(obj)


@pytest.mark.parametrize(
    ("namespace", "selected"),
    [("legacy-ok", True), ("other", False), ("kube-system", False), ("unseen", False)],
)
def test_the_selector_chooses_namespaces_by_their_labels(namespace: str, selected: bool) -> None:
    assert SCOPE.selects(namespace) is selected
    assert podfacts.is_legacy(legacy_pod(namespace), SETTINGS, SCOPE) is selected


def test_without_a_selector_every_namespace_is_chosen() -> None:
    assert LegacyScope().selects("anything")
    assert podfacts.is_legacy(legacy_pod("anything"), BinderSettings())


def test_a_legacy_pod_outside_the_selector_waits_not_granted_naming_the_setting() -> None:
    cluster = build(TWO_SLOTS)
    facts = podfacts.facts_for(legacy_pod("other"), SETTINGS, SCOPE)
    assert facts.legacy_map is None
    outcome = plan(facts, cluster, binder_for(Apiserver(), cluster).cache)
    assert isinstance(outcome, Status)
    assert (outcome.code, outcome.reason) == (Code.UNRESOLVABLE, Reason.NOT_GRANTED)
    assert "namespace other is not selected by the legacy namespace selector" in outcome.message
    chosen = podfacts.facts_for(legacy_pod("legacy-ok"), SETTINGS, SCOPE)
    assert chosen.legacy_map == "0=gpu-1:0" and chosen.legacy_refused == ""


def test_a_prebound_legacy_pod_outside_the_selector_holds_nothing() -> None:
    cluster = build(TWO_SLOTS)
    api = Apiserver()
    binder = binder_for(api, cluster)
    binder.legacy_scope = SCOPE
    binder.settings = SETTINGS
    node = next(iter(cluster.nodes))
    pod = legacy_pod("other", node=node)
    binder.on_pod("ADDED", pod)
    assert binder.cache.holding(pod.uid) is None


def test_a_selector_that_is_not_one_is_refused_with_its_location() -> None:
    with pytest.raises(PlacementError) as caught:
        parse_label_selector(
            '{"matchExpressions": [{"key": "a", "operator": "Near"}]}',
            "--legacy-namespace-selector",
        )
    assert "--legacy-namespace-selector" in caught.value.format()
    assert "operator 'Near' is not one of In, NotIn, Exists, DoesNotExist" in caught.value.format()
