"""The maps `gpuplace status` and `explain` show: both forms, the custom resource's verdict read
from its status, superseded ConfigMaps, and a cluster without the CRD. Objects are made with the
controller's own codecs (MapStatus.to_json, resource_status)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from controller.sources import Form
from gpuplace import inspect, mapviews
from gpuplace.mapviews import configmap_view, describe, resource_view, serving
from kubeio.client import Kube
from kubeio.errors import APINotFoundError
from placement.resourcestatus import resource_status
from placement.status import GangStatus, MapStatus, Phase, SlotCounts

VALID = MapStatus(Phase.VALID, 4, message="4 slots, 3 bound", slots=SlotCounts(4, 4, 3, 0, 1))
SUPERSEDED = MapStatus(
    Phase.VALID,
    message="superseded by PlacementMap inference/llm: the custom resource of the same content "
    "serves this map; this ConfigMap can be deleted. 4 slots, 3 bound",
)


def configmap(name: str = "llm", status: MapStatus | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "inference",
        "labels": {"gpuplace.io/placement-map": "true"},
    }
    if status is not None:
        meta["annotations"] = {"gpuplace.io/status": status.to_json()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}}


def resource(
    name: str = "llm", status: MapStatus | None = None, *, generation: int = 3, read: int = 3
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementMap",
        "metadata": {"name": name, "namespace": "inference", "generation": generation},
        "spec": {},
    }
    if status is not None:
        obj["status"] = resource_status(status, read, None, "2026-12-01T10:00:00Z")
    return obj


def test_a_configmap_shows_the_verdict_of_its_annotation() -> None:
    view = configmap_view(configmap(status=VALID))
    assert (view.key, view.form, view.phase, view.note) == (
        "inference/llm",
        Form.CONFIGMAP,
        "Valid",
        "4 slots, 3 bound",
    )
    assert view.status == VALID
    assert configmap_view(configmap()).phase == "Pending"
    broken = configmap()
    broken["metadata"]["annotations"] = {"gpuplace.io/status": "{not json"}
    assert configmap_view(broken).status is None


def test_a_resource_shows_the_verdict_of_its_status() -> None:
    view = resource_view(resource(status=VALID))
    assert (view.form, view.phase, view.note, view.unread_generation) == (
        Form.RESOURCE,
        "Valid",
        "4 slots, 3 bound",
        0,
    )
    assert view.status is not None and view.status.slots == VALID.slots
    assert resource_view(resource()).status is None


def test_a_resource_the_controller_has_not_read_yet_says_so() -> None:
    view = resource_view(resource(status=VALID, generation=5, read=4))
    assert view.unread_generation == 5
    assert view.note == "waiting for the controller to read generation 5"
    assert view.phase == "Valid"  # the verdict on generation 4, still in service


def test_a_superseded_configmap_is_shown_as_such_and_the_resource_serves() -> None:
    cm = configmap_view(configmap(status=SUPERSEDED))
    cr = resource_view(resource(status=VALID))
    assert cm.superseded and not cr.superseded
    assert cm.phase == "Superseded"
    assert serving([cm, cr]) == [("inference/llm", cr.status)]
    rows = mapviews.views_rows([cr, cm])
    assert rows[0][:4] == ("inference/llm", "Valid", "4", "3")
    assert rows[0][-2] == "resource"
    assert rows[1][:4] == ("inference/llm", "Superseded", "-", "-")
    assert rows[1][-2] == "configmap"
    assert rows[1][-1].startswith("superseded by PlacementMap inference/llm")
    assert describe([cr, cm]) == (
        "Valid: 4 slots, 3 bound (PlacementMap; its ConfigMap is superseded)"
    )


def test_describe_names_the_form_that_serves() -> None:
    assert describe([]) == "missing"
    assert describe([configmap_view(configmap(status=VALID))]) == (
        "Valid: 4 slots, 3 bound (ConfigMap)"
    )
    assert describe([resource_view(resource())]) == "no status yet (PlacementMap)"
    stale = resource_view(resource(status=VALID, generation=5, read=4))
    assert describe([stale]) == ("waiting for the controller to read generation 5 (PlacementMap)")


def test_the_json_of_a_view_carries_form_and_status() -> None:
    data = configmap_view(configmap(status=SUPERSEDED)).to_json()
    assert (data["map"], data["form"], data["superseded"]) == ("inference/llm", "configmap", True)
    assert data["status"]["phase"] == "Valid"
    assert resource_view(resource()).to_json()["status"] is None


class FakeKube:
    """GET by path: a dict of objects and lists; a missing path answers 404."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.asked: list[str] = []

    def get(self, path: str, **query: Any) -> Any:
        self.asked.append(path)
        if path not in self.objects:
            raise APINotFoundError(404, "NotFound", path)
        return self.objects[path]


CM_LIST = "/api/v1/configmaps"
CR_LIST = "/apis/gpuplace.io/v1alpha1/placementmaps"


def test_a_cluster_without_the_crd_lists_its_configmaps() -> None:
    kube = FakeKube({CM_LIST: {"items": [configmap(status=VALID), configmap("b")]}})
    views = mapviews.map_views(cast(Kube, kube))
    assert [(v.key, v.form) for v in views] == [
        ("inference/b", Form.CONFIGMAP),
        ("inference/llm", Form.CONFIGMAP),
    ]
    assert CR_LIST in kube.asked  # asked, answered 404, skipped


def test_both_forms_are_listed_the_resource_first() -> None:
    kube = FakeKube(
        {
            CM_LIST: {"items": [configmap(status=SUPERSEDED)]},
            CR_LIST: {"items": [resource(status=VALID), resource("new")]},
        }
    )
    views = mapviews.map_views(cast(Kube, kube))
    assert [(v.key, v.form.value) for v in views] == [
        ("inference/llm", "resource"),
        ("inference/llm", "configmap"),
        ("inference/new", "resource"),
    ]


@pytest.mark.parametrize(
    ("objects", "expected"),
    [
        ({}, "missing"),
        (
            {"/api/v1/namespaces/inference/configmaps/llm": configmap(status=VALID)},
            "Valid: 4 slots, 3 bound (ConfigMap)",
        ),
        (
            {
                "/apis/gpuplace.io/v1alpha1/namespaces/inference/placementmaps/llm": resource(
                    status=VALID
                ),
                "/api/v1/namespaces/inference/configmaps/llm": configmap(status=SUPERSEDED),
            },
            "Valid: 4 slots, 3 bound (PlacementMap; its ConfigMap is superseded)",
        ),
        # A ConfigMap of that name that is not a map (no label) is not the pod's map.
        (
            {"/api/v1/namespaces/inference/configmaps/llm": {"metadata": {"name": "llm"}}},
            "missing",
        ),
    ],
)
def test_explain_reads_the_pods_map_in_either_form(objects: dict[str, Any], expected: str) -> None:
    kube = cast(Kube, FakeKube(objects))
    assert describe(mapviews.views_of(kube, "inference", "llm")) == expected


def test_the_policy_exists_in_either_form() -> None:
    policy_cr = "/apis/gpuplace.io/v1alpha1/placementpolicies/gpuplace-policy"
    policy_cm = "/api/v1/namespaces/gpuplace-system/configmaps/gpuplace-policy"
    assert mapviews.placement_policy_form(cast(Kube, FakeKube({}))) is None
    assert mapviews.placement_policy_form(cast(Kube, FakeKube({policy_cm: {}}))) is Form.CONFIGMAP
    both = FakeKube({policy_cm: {}, policy_cr: {}})
    assert mapviews.placement_policy_form(cast(Kube, both)) is Form.RESOURCE


GANG = GangStatus(4, 3, ((3, "NodeCordoned"),), False, 600)


def test_explain_shows_how_the_pods_gang_stands() -> None:
    waiting = MapStatus(Phase.VALID, message="4 slots", gang=GANG)
    pod = {
        "metadata": {
            "name": "train-3-abcde",
            "namespace": "inference",
            "uid": "u3",
            "labels": {"gpuplace.io/map": "llm"},
        },
        "spec": {"schedulerName": "gpuplace", "containers": [{"name": "c"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "GangWaiting",
                    "message": "map inference/llm gang: 3 of 4 ranks ready; ...",
                }
            ],
        },
    }
    objects = {
        "/api/v1/namespaces/inference/pods/train-3-abcde": pod,
        "/apis/gpuplace.io/v1alpha1/namespaces/inference/placementmaps/llm": resource(
            status=waiting
        ),
        "/api/v1/namespaces/inference/events": {"items": []},
    }
    found = inspect.explanation(cast(Kube, FakeKube(objects)), "inference", "train-3-abcde")
    assert found is not None
    assert found.gang == "gang: 3 of 4 ranks ready; slot 3 waits NodeCordoned"
    assert "  gang: 3 of 4 ranks ready; slot 3 waits NodeCordoned" in found.lines()
    assert found.to_dict()["gang"] == found.gang
    objects["/apis/gpuplace.io/v1alpha1/namespaces/inference/placementmaps/llm"] = resource(
        status=VALID
    )
    bound = inspect.explanation(cast(Kube, FakeKube(objects)), "inference", "train-3-abcde")
    assert bound is not None and bound.gang == ""
