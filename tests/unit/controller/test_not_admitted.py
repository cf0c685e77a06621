"""A map's pod is placed only as the webhook admitted it: one that never met the webhook (labelled
after create, or created while the webhook was not installed) waits NotAdmitted, with an Event,
and holds nothing (placement/admitted.py)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.podfacts import facts
from kubeio.pod import Pod
from placement.admitted import CUDA_FIELD_PATH, not_admitted
from placement.annotations import MAP_LABEL
from placement.binding import Code, Status, plan
from placement.reasons import Reason
from tests.unit.controller.test_binder import Apiserver, binder_for, decide, make_pod
from tests.unit.placement.test_binding_plan import TWO_SLOTS, build
from tests.unit.webhook_builders import admitted_container

CUDA_WIRED = {
    "name": "CUDA_VISIBLE_DEVICES",
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": CUDA_FIELD_PATH}},
}


def with_containers(obj: dict[str, Any], *containers: dict[str, Any], init: bool = False) -> Any:
    obj["spec"]["initContainers" if init else "containers"] = list(containers)
    return obj


def test_a_map_pod_without_the_webhooks_wiring_waits_not_admitted_with_an_event() -> None:
    api = Apiserver()
    binder = binder_for(api, build(TWO_SLOTS))
    pod = with_containers(make_pod("web-0").label(MAP_LABEL, "llm").obj(), {"name": "c"})
    decide(binder, pod)
    assert not api.bindings
    [(_path, body)] = api.patches
    [condition] = body["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "NotAdmitted")
    assert "created without the gpuplace webhook" in condition["message"]
    assert "delete the pod and create it again" in condition["message"]
    assert [e["reason"] for e in api.events] == ["NotAdmitted"]
    assert binder.cache.holding(pod["metadata"]["uid"]) is None


@pytest.mark.parametrize(
    "containers",
    [
        # One container wired, another not (the webhook wires every one).
        [admitted_container("a"), {"name": "b"}],
        # The variable with a value of its own, or from another field.
        [{"name": "c", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]}],
        [
            {
                "name": "c",
                "env": [
                    {
                        "name": "CUDA_VISIBLE_DEVICES",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}},
                    }
                ],
            }
        ],
        [],
    ],
)
def test_every_container_must_carry_the_wiring(containers: list[dict[str, Any]]) -> None:
    pod = Pod.of(with_containers(make_pod("web-0").label(MAP_LABEL, "llm").obj(), *containers))
    assert not_admitted("llm", pod.containers())


def test_an_init_container_without_the_wiring_is_named() -> None:
    obj = with_containers(make_pod("web-0").label(MAP_LABEL, "llm").obj(), admitted_container())
    obj = with_containers(obj, {"name": "setup"}, init=True)
    reason = not_admitted("llm", Pod.of(obj).containers())
    assert "initContainers 'setup'" in reason


def test_the_webhooks_wiring_anywhere_in_env_admits() -> None:
    container = {"name": "c", "env": [{"name": "A", "value": "1"}, CUDA_WIRED]}
    pod = Pod.of(with_containers(make_pod("web-0").label(MAP_LABEL, "llm").obj(), container))
    assert not_admitted("llm", pod.containers()) == ""


def test_plan_refuses_a_map_pod_not_admitted_for_good() -> None:
    obj = with_containers(make_pod("web-0").label(MAP_LABEL, "llm").obj(), {"name": "c"})
    cluster = build(TWO_SLOTS)
    binder = binder_for(Apiserver(), cluster)
    outcome = plan(facts(Pod.of(obj), legacy=False), cluster, binder.cache)
    assert isinstance(outcome, Status)
    assert (outcome.code, outcome.reason, outcome.waits_for) == (
        Code.UNRESOLVABLE,
        Reason.NOT_ADMITTED,
        frozenset(),
    )


def test_a_pod_without_the_map_label_is_not_judged_by_the_wiring() -> None:
    obj = with_containers(make_pod("web-0").obj(), {"name": "c"})
    assert facts(Pod.of(obj), legacy=False).not_admitted == ""
