"""The real webhook (over HTTPS, our CA) registered with the real apiserver.

The model is written straight into ConfigMaps with `encode_model`, as the controller would, so
these tests do not depend on the controller. Everything runs in namespaces labelled for this module
and the configurations are removed at the end, so other tests never meet this webhook.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import (
    CUDA_ANNOTATION,
    INDEX_LABEL,
    LEGACY_ANNOTATION,
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    BindingDecision,
    encode_binding,
)
from placement.devices import DeclaredDevices
from placement.model import MODEL_LABEL, CompiledMap, CompiledSlot, Model, encode_model
from placement.types import EnvMode, GpuUuid, MapKey, NodeName
from tests.integration import controllerkit
from tests.integration.webhookkit import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import (
    MUTATING_PATH,
    VALIDATING_PATH,
    Endpoint,
    mutating_configuration,
    validating_configuration,
)
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration

SCOPE_LABEL = "gpuplace.io/webhook-it"
CONFIGURATION = "gpuplace-webhook-it"
MODEL_NAMESPACE = "gpuplace-webhook-it-model"
CUDA_FIELD = f"metadata.annotations['{CUDA_ANNOTATION}']"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    return controllerkit.wait_for(what, check, timeout=timeout, interval=0.1)


def put(cluster: LocalCluster, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create or replace (unconditionally) a namespaced object."""
    status, body = cluster.request("PUT", f"{collection}/{obj['metadata']['name']}", obj)
    if status == 404:
        status, body = cluster.request("POST", collection, obj)
    assert status in (200, 201), body
    return dict(body)


def write_model(cluster: LocalCluster, model: Model, namespace: str = MODEL_NAMESPACE) -> None:
    """What the controller leader writes: the shards first, then the manifest naming them."""
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    encoded = encode_model(model)
    manifest = "gpuplace-model"
    for name in [n for n in encoded if n != manifest] + [manifest]:
        put(
            cluster,
            collection,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": {MODEL_LABEL: "true"}},
                "data": encoded[name],
            },
        )


def compiled(
    namespace: str, name: str, indices: range, env_mode: EnvMode = EnvMode.INDEX
) -> CompiledMap:
    key = MapKey(namespace, name)
    slots = {
        i: CompiledSlot(
            i,
            NodeName(f"it-gpu-0{1 + i % 4}"),
            (
                GpuUuid(f"GPU-00000000-0000-0000-0000-{2 * i:012d}"),
                GpuUuid(f"GPU-00000000-0000-0000-0000-{2 * i + 1:012d}"),
            ),
            (0, 1),
            DeclaredDevices((0, 1)),
        )
        for i in indices
    }
    return CompiledMap(key, slots, env_mode=env_mode, generation=1)


def pod(
    name: str, namespace: str, *, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.0-base"}],
            **spec,
        },
    }


def create_pod(
    cluster: LocalCluster, obj: dict[str, Any], dry_run: bool = False
) -> tuple[int, dict[str, Any]]:
    path = f"/api/v1/namespaces/{obj['metadata']['namespace']}/pods"
    if dry_run:
        path += "?dryRun=All"
    status, body = cluster.request("POST", path, obj)
    return status, body


def calls(webhook: RunningWebhook) -> float:
    """How many pod reviews the webhook has answered, from its /metrics."""
    status, text = webhook.get("/metrics")
    assert status == 200
    pattern = r'gpuplace_webhook_decisions_total\{operation="mutate",result="\w+"\} ([0-9.]+)'
    return sum(float(v) for v in re.findall(pattern, text))


def scoped_namespace(cluster: LocalCluster) -> str:
    name = f"webhook-it-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name, labels={SCOPE_LABEL: "true"})
    return name


def register(cluster: LocalCluster, url: str, ca_pem: bytes, name: str = CONFIGURATION) -> None:
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    endpoint = Endpoint(ca_bundle=ca_pem, url=url)
    selector = {"matchLabels": {SCOPE_LABEL: "true"}}
    apply_configuration(
        kube,
        mutating_configuration(
            name, endpoint, legacy_scheduler_names=["gpu-scheduler"], namespace_selector=selector
        ),
    )
    apply_configuration(kube, validating_configuration(name, endpoint, namespace_selector=selector))


def unregister(cluster: LocalCluster, name: str = CONFIGURATION) -> None:
    for collection in (MUTATING_PATH, VALIDATING_PATH):
        cluster.request("DELETE", f"{collection}/{name}")


def wait_webhook_active(cluster: LocalCluster, namespace: str, map_name: str) -> None:
    """The apiserver picks up configurations asynchronously: probe with dry-run pods."""

    def mutated() -> bool:
        probe = pod(f"probe-{uuid.uuid4().hex[:6]}", namespace, labels={MAP_LABEL: map_name})
        status, body = create_pod(cluster, probe, dry_run=True)
        return status == 201 and body["spec"].get("schedulerName") == "gpuplace"

    wait_for("the apiserver to call the webhook", mutated)


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster) -> Iterator[RunningWebhook]:
    cluster.create_namespace(MODEL_NAMESPACE)
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, MODEL_NAMESPACE).start()
    running = RunningWebhook(
        cluster, generate_ca("webhook-it-ca", timedelta(days=2)), models, port=free_port()
    )
    running.start()
    try:
        register(cluster, f"https://127.0.0.1:{running.port}", running.ca.cert_pem)
        yield running
    finally:
        unregister(cluster)
        running.stop()
        models.stop()


@pytest.fixture
def ns(cluster: LocalCluster, webhook: RunningWebhook) -> Iterator[str]:
    name = scoped_namespace(cluster)
    write_model(
        cluster,
        Model(
            int(time.time() * 1000),
            {
                MapKey(name, "llm"): compiled(name, "llm", range(4)),
                MapKey(name, "uuid-map"): compiled(name, "uuid-map", range(2), EnvMode.UUID),
            },
        ),
    )
    wait_webhook_active(cluster, name, "llm")
    yield name
    cluster.delete_namespace(name)


def test_labelled_pod_gets_env_wiring_and_scheduler(cluster: LocalCluster, ns: str) -> None:
    obj = pod(
        "web-1",
        ns,
        labels={MAP_LABEL: "uuid-map", INDEX_LABEL: "1"},
        initContainers=[{"name": "init", "image": "busybox"}],
    )
    obj["metadata"]["annotations"] = {CUDA_ANNOTATION: "0,1,2,3,4,5,6,7", "team": "ml"}
    obj["spec"]["containers"].append(
        {
            "name": "sidecar",
            "image": "busybox",
            "env": [{"name": "A", "value": "1"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "all"}],
        }
    )
    status, created = create_pod(cluster, obj)
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "gpuplace"
    assert created["metadata"]["annotations"] == {"team": "ml"}
    wired = [
        {
            "name": "CUDA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": CUDA_FIELD}},
        },
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {
                "fieldRef": {
                    "apiVersion": "v1",
                    "fieldPath": "metadata.annotations['gpuplace.io/devices']",
                }
            },
        },
    ]
    assert created["spec"]["initContainers"][0]["env"] == wired
    assert created["spec"]["containers"][0]["env"] == wired
    assert created["spec"]["containers"][1]["env"] == [*wired, {"name": "A", "value": "1"}]


def test_warnings_reach_kubectl(cluster: LocalCluster, ns: str) -> None:
    manifest = pod("web-2", ns, labels={MAP_LABEL: "llm"}, schedulerName="volcano")
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert "Warning: spec.schedulerName 'volcano' replaced by 'gpuplace'" in result.stderr


def test_unlabelled_pod_is_untouched(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    obj = pod("plain", ns, labels={"app": "web"})
    obj["metadata"]["annotations"] = {"team/owner": "web"}
    before = calls(webhook)
    status, created = create_pod(cluster, obj)
    assert calls(webhook) == before  # the objectSelector keeps it from reaching the webhook
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert "env" not in created["spec"]["containers"][0]
    assert created["metadata"]["annotations"] == {"team/owner": "web"}
    # A binding annotation is not the webhook's to strip here: the apiserver's own admission
    # policy refuses it, for pods that never reach the webhook too.
    obj["metadata"]["name"] = "plain-forged"
    obj["metadata"]["annotations"] = {CUDA_ANNOTATION: "0"}
    status, body = create_pod(cluster, obj)
    assert calls(webhook) == before
    assert status == 403, body
    assert f"annotation(s) {CUDA_ANNOTATION} may not be set" in body["message"]


def test_pod_naming_a_missing_map_is_rejected(cluster: LocalCluster, ns: str) -> None:
    status, body = create_pod(cluster, pod("web-0", ns, labels={MAP_LABEL: "nope"}))
    assert status == 403, body
    message = body["message"]
    assert 'admission webhook "pods.gpuplace.io" denied the request' in message
    assert f"pod {ns}/web-0" in message
    assert f"placement map {ns}/nope, which does not exist" in message


def test_pod_with_an_index_outside_the_map_is_rejected(cluster: LocalCluster, ns: str) -> None:
    labels = {MAP_LABEL: "llm", "apps.kubernetes.io/pod-index": "9"}
    status, body = create_pod(cluster, pod("web-9", ns, labels=labels))
    assert status == 403, body
    assert f"placement map {ns}/llm has no index 9" in body["message"]
    assert "it declares 0-3" in body["message"]


def test_model_changes_are_seen_through_the_watch(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    status, _ = create_pod(cluster, pod("late-0", ns, labels={MAP_LABEL: "late"}), dry_run=True)
    assert status == 403
    generation = int(time.time() * 1000)
    model = Model(
        generation,
        {
            MapKey(ns, "llm"): compiled(ns, "llm", range(4)),
            MapKey(ns, "late"): compiled(ns, "late", range(1)),
        },
    )
    write_model(cluster, model)
    wait_for("the model cache", lambda: webhook.models.current().generation == generation)
    status, body = create_pod(cluster, pod("late-0", ns, labels={MAP_LABEL: "late"}))
    assert status == 201, body


def test_invalid_placement_map_fails_server_side_dry_run(cluster: LocalCluster, ns: str) -> None:
    good = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: llm\n  namespace: {ns}\n"
        "spec:\n  placements:\n    - index: 0\n      node: gpu-a-01\n      devices: [0, 1]\n"
    )
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llm", "namespace": ns, "labels": {PLACEMENT_MAP_LABEL: "true"}},
        "data": {"placement.yaml": good.replace("[0, 1]", "[0, banana]")},
    }
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(configmap), check=False
    )
    assert result.returncode != 0
    assert 'admission webhook "placementmaps.gpuplace.io" denied the request' in result.stderr
    assert (
        f"configmap {ns}/llm placement.yaml:10:20: error: spec.placements[0].devices[1]"
        in result.stderr
    )
    configmap["data"] = {"placement.yaml": good}
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(configmap))
    configmap["data"] = {"other.yaml": good}
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(configmap), check=False
    )
    assert "data has no key 'placement.yaml'" in result.stderr


def merge_key_bomb(namespace: str, levels: int = 12) -> str:
    """About 550 bytes whose merge keys, copied as PyYAML copies them, are 4**11 entries."""
    lines = [
        "apiVersion: gpuplace.io/v1alpha1",
        "kind: PlacementMap",
        f"metadata: {{name: bomb, namespace: {namespace}}}",
        "a0: &a0 {x: 1, y: 2}",
    ]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 4) + "]}")
    return "\n".join([*lines, "spec: {placements: []}", ""])


def test_merge_key_bomb_is_refused_with_a_short_message(cluster: LocalCluster, ns: str) -> None:
    text = merge_key_bomb(ns)
    assert len(text) < 600
    status, body = cluster.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        controllerkit.placement_configmap(ns, "bomb", text),
    )
    assert status == 422, body
    message = body["message"]
    assert "YAML anchors are not allowed in a PlacementMap" in message
    assert f"configmap {ns}/bomb placement.yaml:4:5" in message
    assert len(message) < 400
    assert cluster.request("GET", f"/api/v1/namespaces/{ns}/configmaps/bomb")[0] == 404


def test_a_one_mebibyte_map_is_validated_by_the_webhook(cluster: LocalCluster, ns: str) -> None:
    header = (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata: {{name: big, namespace: {ns}}}\nspec:\n  placements:\n"
    )
    entries = [
        f"  - {{index: {i}, node: g-{i // 8:04d}, devices: [{i % 8}]}}\n" for i in range(21_746)
    ]
    text = header + "".join(entries)
    assert 1_000_000 < len(text) < 1_048_000
    good = controllerkit.placement_configmap(ns, "big", text)
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All", good, timeout=60
    )
    assert status == 201, str(body)[:500]
    # The same map with one bad entry at its end: the webhook read all of it.
    last = entries[-1].replace("devices: [", "devices: [banana, ")
    bad = controllerkit.placement_configmap(ns, "big", header + "".join(entries[:-1]) + last)
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All", bad, timeout=60
    )
    assert status == 422, str(body)[:500]
    assert f"placement.yaml:{21_746 + 5}:" in body["message"]


def resolve_field_ref(obj: dict[str, Any], field_path: str) -> str:
    """What the kubelet does with `metadata.annotations['<key>']` when the container starts."""
    match = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", field_path)
    assert match, field_path
    return str(obj["metadata"].get("annotations", {}).get(match.group(1), ""))


def test_bound_pod_resolves_cuda_visible_devices(
    cluster: LocalCluster, ns: str, gpu_nodes: list[str]
) -> None:
    status, created = create_pod(cluster, pod("web-0", ns, labels={MAP_LABEL: "llm"}))
    assert status == 201, created
    env = {e["name"]: e for e in created["spec"]["containers"][0]["env"]}
    field_path = env["CUDA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field_path == CUDA_FIELD
    assert resolve_field_ref(created, field_path) == ""  # unbound: no GPU, never a wrong one
    decision = BindingDecision(
        MapKey(ns, "llm"),
        0,
        NodeName(gpu_nodes[0]),
        (
            GpuUuid("GPU-00000000-0000-0000-0000-000000000000"),
            GpuUuid("GPU-00000000-0000-0000-0000-000000000001"),
        ),
        "0,1",
        1,
    )
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "web-0", "namespace": ns, "annotations": encode_binding(decision)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": gpu_nodes[0]},
    }
    status, body = cluster.request("POST", f"/api/v1/namespaces/{ns}/pods/web-0/binding", binding)
    assert status == 201, body
    _, bound = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods/web-0")
    assert bound["spec"]["nodeName"] == gpu_nodes[0]
    assert bound["metadata"]["annotations"][CUDA_ANNOTATION] == "0,1"
    assert resolve_field_ref(bound, field_path) == "0,1"


def test_legacy_pods(cluster: LocalCluster, ns: str, webhook: RunningWebhook) -> None:
    legacy = pod("trainer-1", ns, schedulerName="gpu-scheduler")
    legacy["metadata"]["annotations"] = {LEGACY_ANNOTATION: "0=node1:0,1\n1=node2:2,3\n"}
    status, created = create_pod(cluster, legacy)
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "gpu-scheduler"
    assert [e["name"] for e in created["spec"]["containers"][0]["env"]] == [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    ]
    # The pod's own line is read at admission, located as in the whole text.
    broken = pod("trainer-2", ns, schedulerName="gpu-scheduler")
    broken["metadata"]["annotations"] = {LEGACY_ANNOTATION: "0=node1:0,1\n2=node2:two\n"}
    status, body = create_pod(cluster, broken)
    assert status == 422, body
    assert (
        f"pod {ns}/trainer-2 annotation gpu-scheduling-map:2:9: error: device 'two'"
        in body["message"]
    )
    # Another pod's broken line is the binder's to report (the admission reads a bounded part).
    fine = pod("trainer-0", ns, schedulerName="gpu-scheduler")
    fine["metadata"]["annotations"] = {LEGACY_ANNOTATION: "0=node1:0,1\n1=node2:two\n"}
    status, body = create_pod(cluster, fine)
    assert status == 201, body
    # A name without an ordinal is refused before the text is read.
    unnumbered = pod("trainer", ns, schedulerName="gpu-scheduler")
    unnumbered["metadata"]["annotations"] = {LEGACY_ANNOTATION: "0=node1:0\n" * 1000}
    status, body = create_pod(cluster, unnumbered)
    assert status != 201 and "has none" in body["message"], body
    # Another scheduler: the CEL match conditions keep the pod from reaching the webhook at all.
    other = pod("other-0", ns)
    other["metadata"]["annotations"] = {LEGACY_ANNOTATION: "garbage"}
    before = calls(webhook)
    status, created = create_pod(cluster, other)
    assert status == 201, created
    assert calls(webhook) == before
    assert "env" not in created["spec"]["containers"][0]


def test_readiness_and_metrics_over_https(ns: str, webhook: RunningWebhook) -> None:
    assert webhook.get("/readyz") == (200, "ok\n")
    status, text = webhook.get("/metrics")
    assert status == 200
    assert re.search(
        r'gpuplace_webhook_decisions_total\{operation="mutate",result="patched"\} [1-9]', text
    )
    assert 'gpuplace_webhook_admission_duration_seconds_count{operation="mutate"}' in text


def test_a_burst_from_more_connections_than_workers_is_answered_in_full(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    """16 creating threads against 8 workers: the apiserver keeps a connection per concurrent
    call, and a worker serving its connection's next request must leave none of the others
    waiting for an answer past the apiserver's timeout."""
    count = 160
    before = calls(webhook)

    def create(i: int) -> tuple[int, dict[str, Any]]:
        labels = {MAP_LABEL: "llm", INDEX_LABEL: str(i % 4)}
        return create_pod(cluster, pod(f"burst-{i}", ns, labels=labels), dry_run=True)

    with ThreadPoolExecutor(16) as threads:
        results = list(threads.map(create, range(count)))
    assert [status for status, _ in results] == [201] * count, results[:3]
    assert all(body["spec"]["schedulerName"] == "gpuplace" for _, body in results)
    assert all(body["spec"]["containers"][0]["env"] for _, body in results)
    assert calls(webhook) - before == count


def test_stopped_webhook_refuses_labelled_pods_only(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    webhook.stop()
    try:
        status, body = create_pod(cluster, pod("web-3", ns, labels={MAP_LABEL: "llm"}))
        assert status >= 500, body
        assert 'failed calling webhook "pods.gpuplace.io"' in body["message"]
        status, body = create_pod(cluster, pod("plain", ns))
        assert status == 201, body
    finally:
        webhook.start()  # the same port, so the registration stays valid
    wait_webhook_active(cluster, ns, "llm")


def test_model_cache_loads_keeps_the_last_good_model_and_recovers(cluster: LocalCluster) -> None:
    namespace = f"webhook-model-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    cache = ModelCache(kube, namespace).start()
    try:
        # Nothing written yet (a fresh install): loaded, with no maps, so the webhook is ready.
        assert cache.wait_loaded(30)
        assert cache.current() == Model()
        first = Model(1, {MapKey("a", "m"): compiled("a", "m", range(2))})
        write_model(cluster, first, namespace)
        wait_for("generation 1", lambda: cache.current().generation == 1)
        assert cache.current() == first
        # A manifest whose shard does not match (a write seen half-way): keep generation 1.
        second = Model(2, {MapKey("a", "m"): compiled("a", "m", range(3))})
        encoded = encode_model(second)
        collection = f"/api/v1/namespaces/{namespace}/configmaps"
        written = put(
            cluster,
            collection,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "gpuplace-model",
                    "namespace": namespace,
                    "labels": {MODEL_LABEL: "true"},
                },
                "data": encoded["gpuplace-model"],
            },
        )
        # Once the watch has delivered that manifest and the cache has read it, the model must
        # still be generation 1.
        seen = ("gpuplace-model", written["metadata"]["resourceVersion"])
        wait_for("the half-written model read", lambda: seen in (cache._watch._versions or ()))
        assert cache.current() == first
        write_model(cluster, second, namespace)
        wait_for("generation 2", lambda: cache.current().generation == 2)
        assert cache.current() == second
    finally:
        cache.stop()
        cluster.delete_namespace(namespace)
