"""build_response on pods: the pure AdmissionReview -> answer function, without HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_LABEL,
    LEGACY_ANNOTATION,
    STATEFULSET_INDEX_LABEL,
)
from placement.model import Model
from placement.types import EnvMode, Indexing
from tests.unit.webhook_builders import (
    MAP,
    NS,
    env_of,
    make_model,
    make_pod,
    patch_of,
    patched,
    review,
)
from webhook.admission import build_response
from webhook.pods import describe_indices, wired_env
from webhook.settings import AdmissionSettings

SETTINGS = AdmissionSettings()
MODEL = (
    make_model()
    .map("llm", range(4))
    .map("uuid-map", range(2), env_mode=EnvMode.UUID)
    .map("by-label", range(2), indexing=Indexing.LABEL)
    .map("ordinal", range(2), indexing=Indexing.ORDINAL)
    .map("pool", range(8), indexing=Indexing.ALLOCATE)
    .map(
        "blocked", range(2), blocked={1: ("SlotConflict", "index 0 of map inference/llm holds it")}
    )
    .obj()
)
CUDA_FIELD = f"metadata.annotations['{CUDA_ANNOTATION}']"
DEVICES_FIELD = f"metadata.annotations['{DEVICES_ANNOTATION}']"
WIRED_INDEX = [
    {
        "name": "CUDA_VISIBLE_DEVICES",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": CUDA_FIELD}},
    },
    {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
]
WIRED_UUID = [
    *WIRED_INDEX,
    {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": DEVICES_FIELD}},
    },
]


def answer(
    pod: dict[str, Any], model: Model = MODEL, settings: AdmissionSettings = SETTINGS
) -> dict[str, Any]:
    return build_response(review(pod), model, settings)


@dataclass(frozen=True)
class Denied:
    name: str
    pod: dict[str, Any]
    says: tuple[str, ...]  # fragments the message must contain
    code: int = 403
    settings: AdmissionSettings = field(default=SETTINGS)


DENIED = [
    Denied(
        "missing map",
        make_pod("web-3").label(MAP, "nope").label(STATEFULSET_INDEX_LABEL, "3").obj(),
        ("inference/web-3", "(index 3)", "placement map inference/nope", "does not exist"),
    ),
    Denied(
        "map in another namespace is not ours",
        make_pod("web-0", namespace="other").label(MAP, "llm").obj(),
        ("other/web-0", "placement map other/llm", "does not exist"),
    ),
    Denied(
        "ordinal label beyond the map",
        make_pod("web-7").label(MAP, "llm").label(STATEFULSET_INDEX_LABEL, "7").obj(),
        (
            "inference/web-7",
            "inference/llm has no index 7",
            STATEFULSET_INDEX_LABEL,
            "declares 0-3",
        ),
    ),
    Denied(
        "explicit index beyond the map",
        make_pod("x").label(MAP, "llm").label(INDEX_LABEL, "12").obj(),
        ("has no index 12", f"label {INDEX_LABEL}", "0-3"),
    ),
    Denied(
        "statefulset name suffix beyond the map",
        make_pod("web-9").label(MAP, "llm").owner("StatefulSet", "web").obj(),
        ("has no index 9", "name's ordinal suffix"),
    ),
    Denied(
        "explicit index that is not a number",
        make_pod("x").label(MAP, "llm").label(INDEX_LABEL, "three").obj(),
        ("placement map inference/llm", "'three' is not an index"),
    ),
    Denied(
        "indexing label without the label",
        make_pod("web-0").label(MAP, "by-label").obj(),
        ("inference/by-label", "indexing: label", INDEX_LABEL),
    ),
    Denied(
        "indexing ordinal without a suffix",
        make_pod("worker").label(MAP, "ordinal").obj(),
        ("indexing: ordinal", "'worker'"),
    ),
    Denied(
        "nodeName set by the user",
        make_pod("web-0").label(MAP, "llm").label(INDEX_LABEL, "0").node("gpu-node-00").obj(),
        ("spec.nodeName 'gpu-node-00'", "remove spec.nodeName"),
    ),
    Denied(
        "legacy annotation whose own line is broken",
        make_pod("web-1")
        .annotation(LEGACY_ANNOTATION, "0=node1:0,1\n1=node2:x\n")
        .scheduler("gpu-scheduler")
        .obj(),
        (f"pod inference/web-1 annotation {LEGACY_ANNOTATION}:2:9: error:", "'x'"),
        code=422,
    ),
    Denied(
        "legacy index without a line",
        make_pod("web-5")
        .annotation(LEGACY_ANNOTATION, "0=node1:0\n1=node2:1")
        .scheduler("gpu-scheduler")
        .obj(),
        ("no line for index 5", "declares 0-1"),
    ),
    Denied(
        "legacy pod without an ordinal",
        make_pod("web").annotation(LEGACY_ANNOTATION, "0=node1:0").scheduler("gpu-scheduler").obj(),
        ("'-<n>' suffix",),
    ),
    Denied(
        "legacy annotation without entries",
        make_pod("web-0")
        .annotation(LEGACY_ANNOTATION, "# nothing\n")
        .scheduler("gpu-scheduler")
        .obj(),
        ("no entries",),
        code=422,
    ),
    Denied(
        "labels that are not strings",
        {**make_pod("web-0").obj(), "metadata": {"name": "web-0", "labels": {MAP: 3}}},
        ("metadata.labels['gpuplace.io/map'] must be a string",),
        code=400,
    ),
    Denied(
        "env that is not a list",
        make_pod("web-0").label(MAP, "llm").container("main", env={"CUDA": "1"}).obj(),  # type: ignore[arg-type]
        ("spec.containers[0].env must be a list",),
        code=400,
    ),
]


@pytest.mark.parametrize("case", DENIED, ids=lambda c: c.name)
def test_denied(case: Denied) -> None:
    out = build_response(review(case.pod), MODEL, case.settings)
    response = out["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == case.code
    for fragment in case.says:
        assert fragment in response["status"]["message"], response["status"]["message"]


@pytest.mark.parametrize(
    "pod",
    [
        make_pod("plain").obj(),
        make_pod("plain").label("app", "web").annotation(CUDA_ANNOTATION, "0").obj(),
        # legacy annotation, but another scheduler: not ours
        make_pod("web-0").annotation(LEGACY_ANNOTATION, "0=node1:0").obj(),
    ],
    ids=["unlabelled", "unlabelled-with-gpuplace-annotation", "legacy-other-scheduler"],
)
def test_pods_that_did_not_opt_in_pass_unchanged(pod: dict[str, Any]) -> None:
    out = answer(pod)
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}


def test_answer_is_an_admission_review_for_the_request_uid() -> None:
    r = review(make_pod("web-0").label(MAP, "llm").obj(), uid="abc-123")
    out = build_response(r, MODEL, SETTINGS)
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "abc-123"
    assert out["response"]["allowed"] is True


def test_labelled_pod_without_env_gets_scheduler_and_env() -> None:
    pod = make_pod("web-2").label(MAP, "llm").label(STATEFULSET_INDEX_LABEL, "2").obj()
    out = answer(pod)
    result = patched(pod, out)
    assert result["spec"]["schedulerName"] == "gpuplace"
    assert env_of(result) == WIRED_INDEX
    assert out["response"].get("warnings") is None


def test_scheduler_name_comes_from_settings() -> None:
    pod = make_pod("web-0").label(MAP, "llm").obj()
    settings = AdmissionSettings(scheduler_name="placer")
    assert patched(pod, answer(pod, settings=settings))["spec"]["schedulerName"] == "placer"


def test_uuid_mode_adds_nvidia_visible_devices() -> None:
    pod = make_pod("web-1").label(MAP, "uuid-map").label(INDEX_LABEL, "1").obj()
    assert env_of(patched(pod, answer(pod))) == WIRED_UUID


def test_user_values_are_replaced_and_ours_come_first() -> None:
    user_env = [
        {"name": "MODEL", "value": "llama"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1,2,3"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "CUDA_DEVICE_ORDER", "value": "FASTEST_FIRST"},
        {"name": "DEVICES", "value": "$(CUDA_VISIBLE_DEVICES)"},
    ]
    pod = make_pod("web-0").label(MAP, "llm").container("main", user_env).obj()
    out = answer(pod)
    env = env_of(patched(pod, out))
    assert env == [
        *WIRED_INDEX,
        {"name": "MODEL", "value": "llama"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "DEVICES", "value": "$(CUDA_VISIBLE_DEVICES)"},
    ]
    warnings = " ".join(out["response"]["warnings"])
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        assert f"env {name} in container(s) main replaced" in warnings


def test_duplicate_user_entries_all_go() -> None:
    user_env = [{"name": "CUDA_VISIBLE_DEVICES", "value": str(i)} for i in range(3)]
    pod = make_pod("web-0").label(MAP, "uuid-map").container("main", user_env).obj()
    assert env_of(patched(pod, answer(pod))) == WIRED_UUID


def test_env_from_is_kept_and_overridden_by_explicit_env() -> None:
    env_from = [{"configMapRef": {"name": "gpu-env"}}]
    pod = make_pod("web-0").label(MAP, "llm").container("main", env_from=env_from).obj()
    result = patched(pod, answer(pod))
    assert result["spec"]["containers"][0]["envFrom"] == env_from
    assert env_of(result) == WIRED_INDEX


def test_empty_and_null_env() -> None:
    pod = make_pod("web-0").label(MAP, "llm").container("a", []).container("b").obj()
    pod["spec"]["containers"][1]["env"] = None
    result = patched(pod, answer(pod))
    assert env_of(result, 0) == WIRED_INDEX
    assert env_of(result, 1) == WIRED_INDEX


def test_every_container_and_init_container_of_many() -> None:
    builder = make_pod("web-0").label(MAP, "uuid-map")
    for i in range(3):
        builder.container(
            f"init-{i}", init=True, env=[{"name": "A", "value": str(i)}] if i else None
        )
    for i in range(25):
        env = [{"name": "CUDA_VISIBLE_DEVICES", "value": "9"}] if i % 3 == 0 else None
        builder.container(f"c-{i}", env=env)
    pod = builder.obj()
    result = patched(pod, answer(pod))
    for i in range(3):
        assert env_of(result, i, init=True)[:3] == WIRED_UUID
    assert env_of(result, 1, init=True)[3:] == [{"name": "A", "value": "1"}]
    for i in range(25):
        assert env_of(result, i) == WIRED_UUID


def test_spoofed_annotations_are_removed_with_pointer_escaping() -> None:
    pod = (
        make_pod("web-0")
        .label(MAP, "llm")
        .annotation(CUDA_ANNOTATION, "0,1,2,3,4,5,6,7")
        .annotation(DEVICES_ANNOTATION, "GPU-x")
        .annotation("gpuplace.io/odd~name/with~1slash", "x")
        .annotation("example.com/keep", "yes")
        .annotation("prometheus.io~scrape", "true")
        .obj()
    )
    out = answer(pod)
    paths = {op["path"] for op in patch_of(out) if op["op"] == "remove"}
    assert "/metadata/annotations/gpuplace.io~1cuda-visible-devices" in paths
    assert "/metadata/annotations/gpuplace.io~1odd~0name~1with~01slash" in paths
    result = patched(pod, out)
    assert result["metadata"]["annotations"] == {
        "example.com/keep": "yes",
        "prometheus.io~scrape": "true",
    }
    assert any("gpuplace.io/cuda-visible-devices" in w for w in out["response"]["warnings"])


def test_wiring_is_idempotent() -> None:
    """A pod already wired (re-invocation, or re-created from `kubectl get -o yaml`) gets no patch."""
    pod = (
        make_pod("web-0")
        .label(MAP, "uuid-map")
        .container(
            "a", [{"name": "X", "value": "1"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "3"}]
        )
        .container("b")
        .container("i", init=True)
        .annotation(DEVICES_ANNOTATION, "spoof")
        .obj()
    )
    once = patched(pod, answer(pod))
    again = answer(once)
    assert patch_of(again) == []
    assert again["response"].get("warnings") is None


def test_other_scheduler_name_is_replaced_with_a_warning() -> None:
    pod = make_pod("web-0").label(MAP, "llm").scheduler("volcano").obj()
    out = answer(pod)
    assert patched(pod, out)["spec"]["schedulerName"] == "gpuplace"
    assert any("'volcano' replaced by 'gpuplace'" in w for w in out["response"]["warnings"])


def test_default_scheduler_is_replaced_silently() -> None:
    pod = make_pod("web-0").label(MAP, "llm").scheduler("default-scheduler").obj()
    out = answer(pod)
    assert patched(pod, out)["spec"]["schedulerName"] == "gpuplace"
    assert out["response"].get("warnings") is None


def test_deployment_pod_is_left_to_allocation() -> None:
    pod = make_pod("").generate_name("web-7c9f-").label(MAP, "llm").owner("ReplicaSet").obj()
    out = answer(pod)
    assert out["response"]["allowed"] is True
    assert env_of(patched(pod, out)) == WIRED_INDEX


def test_name_suffix_counts_only_for_statefulset_pods() -> None:
    """A Deployment pod named like web-99 is allocated, not refused for index 99."""
    pod = make_pod("web-99").label(MAP, "llm").owner("ReplicaSet").obj()
    assert answer(pod)["response"]["allowed"] is True


def test_bare_pod_takes_the_index_its_name_says() -> None:
    """A pod without a controller named web-99 asks for index 99, as a StatefulSet pod would."""
    out = answer(make_pod("web-99").label(MAP, "llm").obj())
    assert out["response"]["allowed"] is False
    assert (
        "has no index 99 (from the pod name's ordinal suffix)"
        in out["response"]["status"]["message"]
    )
    assert answer(make_pod("web-3").label(MAP, "llm").obj())["response"]["allowed"] is True


def test_bare_pod_with_a_generated_name_is_allocated() -> None:
    pod = make_pod("").generate_name("web-").label(MAP, "llm").obj()
    assert answer(pod)["response"]["allowed"] is True


def test_statefulset_pod_in_range_is_admitted() -> None:
    pod = make_pod("web-3").label(MAP, "llm").owner("StatefulSet", "web").obj()
    assert answer(pod)["response"]["allowed"] is True


def test_blocked_slot_is_admitted_with_a_warning() -> None:
    pod = make_pod("web-1").label(MAP, "blocked").label(STATEFULSET_INDEX_LABEL, "1").obj()
    out = answer(pod)
    assert out["response"]["allowed"] is True
    assert any(
        "inference/blocked index 1 is not served now (SlotConflict: index 0" in w
        for w in out["response"]["warnings"]
    )


def test_index_label_under_allocate_is_ignored_with_a_warning() -> None:
    pod = make_pod("w").label(MAP, "pool").label(INDEX_LABEL, "99").obj()
    out = answer(pod)
    assert out["response"]["allowed"] is True
    assert any("'indexing: allocate'" in w for w in out["response"]["warnings"])


def test_legacy_pod_gets_env_but_keeps_its_scheduler() -> None:
    pod = (
        make_pod("trainer-1")
        .annotation(LEGACY_ANNOTATION, "0=node1:0,1\n1=node2:2,3\n")
        .annotation(CUDA_ANNOTATION, "spoof")
        .scheduler("gpu-scheduler")
        .container("main", [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])
        .obj()
    )
    out = answer(pod, model=Model())
    result = patched(pod, out)
    assert result["spec"]["schedulerName"] == "gpu-scheduler"
    assert env_of(result) == WIRED_INDEX
    assert result["metadata"]["annotations"] == {LEGACY_ANNOTATION: "0=node1:0,1\n1=node2:2,3\n"}


def test_legacy_scheduler_names_are_a_setting() -> None:
    pod = make_pod("t-0").annotation(LEGACY_ANNOTATION, "0=n:0").scheduler("old-placer").obj()
    assert patch_of(answer(pod)) == []
    settings = AdmissionSettings(legacy_scheduler_names=("gpu-scheduler", "old-placer"))
    assert env_of(patched(pod, answer(pod, settings=settings))) == WIRED_INDEX


def test_legacy_mode_off_leaves_legacy_pods_alone() -> None:
    pod = make_pod("t-0").annotation(LEGACY_ANNOTATION, "broken").scheduler("gpu-scheduler").obj()
    out = answer(pod, settings=AdmissionSettings(legacy_mode=False))
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}


def test_label_wins_over_legacy_annotation() -> None:
    pod = (
        make_pod("web-0")
        .label(MAP, "llm")
        .annotation(LEGACY_ANNOTATION, "garbage")
        .scheduler("gpu-scheduler")
        .obj()
    )
    out = answer(pod)
    assert patched(pod, out)["spec"]["schedulerName"] == "gpuplace"
    assert any(LEGACY_ANNOTATION in w for w in out["response"]["warnings"])


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(operation: str) -> None:
    pod = make_pod("web-9").label(MAP, "nope").obj()
    r = review(pod if operation != "DELETE" else None, operation=operation, old=pod)
    out = build_response(r, MODEL, SETTINGS)
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}


def test_namespace_comes_from_the_request_when_the_pod_has_none() -> None:
    pod = make_pod("web-0").label(MAP, "llm").obj()
    del pod["metadata"]["namespace"]
    out = build_response(review(pod, namespace=NS), MODEL, SETTINGS)
    assert out["response"]["allowed"] is True


def test_wired_env_is_fresh_each_call() -> None:
    """Entries are built per call: a caller mutating one answer cannot change the next."""
    first = wired_env(EnvMode.INDEX)
    first[0]["name"] = "MUTATED"
    assert wired_env(EnvMode.INDEX)[0]["name"] == "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        ([], "none"),
        ([0], "0"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 1, 3, 5, 6, 7, 10], "0-1, 3, 5-7, 10"),
        (list(range(0, 40, 2)), "0, 2, 4, 6, 8, 10, 12, 14, ..."),
    ],
)
def test_describe_indices(indices: list[int], text: str) -> None:
    assert describe_indices(indices) == text
