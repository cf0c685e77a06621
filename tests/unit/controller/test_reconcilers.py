"""The controller's reconcilers, each on its own, against fake informers, a recording apiserver and
a fake binder: what each decides and writes for the changes it is handed."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import pytest

from controller import podfacts
from controller.bindingkey import KeySecret
from controller.changequeue import MODEL, ChangeQueue
from controller.changes import InventoryChanged, NodeChanged, SourceChanged, SourceDeleted
from controller.counts import MapCounts
from controller.grantkeeper import GrantKeeper
from controller.keywatch import KEY_RING, KeyWatch
from controller.metrics import ControllerMetrics
from controller.modelkeeper import ModelKeeper
from controller.nodekeeper import NodeKeeper
from controller.podwatch import BOUND_SETTLE_SECONDS, PodWatch
from controller.renumber import RenumberTracker
from controller.settings import ControllerSettings
from controller.snapshot import Published
from controller.statuswriter import POLICY as POLICY_KEY
from controller.statuswriter import StatusKey, StatusWriter
from controller.templatesync import TEMPLATES
from controller.workqueue import RETRY, WorkQueue
from controller.writer import ModelWriter
from kubeio.errors import APINotFoundError, APIServerError
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.annotations import (
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    STATUS_ANNOTATION,
    BindingDecision,
    signed_binding,
)
from placement.compile import Compiler
from placement.keyring import TrustView, new_ring
from placement.status import MapStatus, Phase, SlotCounts
from placement.types import GpuUuid, MapKey, NodeName
from placement.wake import WakeKey
from tests.unit.placement.test_grants import (
    POLICY,  # inference: gpu-a-01, node7 and pool train only
)

INFERENCE = MapKey("inference", "llm")

#: No pod is bound, drifted, renumbered, unverifiable or in a gang.
ZERO = MapCounts(
    bound=lambda _k: 0,
    drifted=lambda _k: 0,
    rollout=lambda _k: None,
    renumbered=lambda _k: 0,
    unverifiable=lambda _k: 0,
    gang=lambda _k: None,
    bound_total=lambda: 0,
    drifted_total=lambda: 0,
)


def taken(queue: WorkQueue[Any]) -> set[Any]:
    """Every key ready in `queue` now, each marked done."""
    keys: set[Any] = set()
    while batch := queue.get(100, timeout=0):
        keys.update(batch)
        for key in batch:
            queue.done(key)
    return keys


class Apiserver:
    """Records writes; answers reads of what it holds."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def create(self, path: str, body: dict[str, Any], guard: Any = None) -> dict[str, Any]:
        if path.endswith("/events"):
            self.events.append(body)
            return body
        self.writes.append(("create", path, body))
        name = body["metadata"]["name"]
        self.objects[f"{path}/{name}"] = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": "1"},
        }
        return self.objects[f"{path}/{name}"]

    def put(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.writes.append(("put", path, body))
        self.objects[path] = body
        return body

    def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.writes.append(("patch", path, body))
        return {}

    def update(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.writes.append(("update", path, body))
        self.objects[path] = body
        return body

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        if path not in self.objects:
            raise APINotFoundError(404, "NotFound", path)
        return self.objects[path]

    def delete(self, path: str, **_: Any) -> dict[str, Any]:
        self.writes.append(("delete", path, None))
        if self.objects.pop(path, None) is None:
            raise APINotFoundError(404, "NotFound", path)
        return {}


class FakeInformer:
    def __init__(self, objects: Sequence[dict[str, Any]] = ()) -> None:
        self.lock = threading.RLock()
        self.store = {
            (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects
        }

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.get((namespace, name))


def source(text: str, namespace: str = "inference", name: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {PLACEMENT_MAP_LABEL: "true"}},
        "data": {"placement.yaml": text},
    }


def map_text(namespace: str = "inference", node: str = "gpu-1", devices: str = "[0]") -> str:
    return (
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
        f"metadata:\n  name: llm\n  namespace: {namespace}\nspec:\n  placements:\n"
        f"    - index: 0\n      node: {node}\n      devices: {devices}\n"
    )


def node(name: str, alias: str | None = None, ready: bool = True) -> dict[str, Any]:
    labels = {"gpu-node-name": alias} if alias else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Keepers:
    """The compile side, wired as the manager wires it."""

    def __init__(self, settings: ControllerSettings | None = None) -> None:
        self.settings = settings or ControllerSettings()
        self.api = Apiserver()
        self.events = EventRecorder(self.api, "test")  # type: ignore[arg-type]
        self.compiler = Compiler(self.settings.alias_label)
        self.grants = GrantKeeper(self.settings, self.compiler, self.events)
        self.nodes = NodeKeeper(
            self.api,  # type: ignore[arg-type]
            self.settings.inventory_namespace,
            self.settings.alias_label,
            self.compiler,
            self.grants,
        )
        self.models: WorkQueue[str] = WorkQueue("model")
        self.inbox = ChangeQueue(self.models)
        self.published = Published()
        self.statuses: WorkQueue[StatusKey] = WorkQueue("status")
        self.drifts: WorkQueue[MapKey] = WorkQueue("drift")
        self.templates: WorkQueue[str] = WorkQueue("templates")
        self.woken: list[set[WakeKey]] = []
        self.lease = True
        self.maps = ModelKeeper(
            self.compiler,
            self.grants,
            self.nodes,
            RenumberTracker(self.api, self.events, lambda _n: None),  # type: ignore[arg-type]
            ModelWriter(self.api, self.settings.system_namespace),  # type: ignore[arg-type]
            ControllerMetrics(),
            self.inbox,
            self.published,
            statuses=self.statuses,
            drift=self.drifts,
            templates=self.templates,
            stored=dict,
            wake=self.woken.append,
            leading=lambda: self.lease,
            holds_lease=lambda: self.lease,
        )

    def apply(self, *batch: Any) -> set[StatusKey]:
        """One batch applied and its snapshot published; the status keys it queued."""
        self.maps.apply_all(batch)
        self.maps.flush()
        return taken(self.statuses)


# -- ModelKeeper ----------------------------------------------------------------------------------


def test_a_source_is_compiled_once_and_its_own_echo_changes_nothing() -> None:
    k = Keepers()
    obj = source(map_text())
    assert k.apply(SourceChanged(obj)) == {INFERENCE}
    assert k.maps.uncompiled and k.published.current.sources[INFERENCE].valid is not None
    assert k.maps.publish(dict, first=True)
    assert k.woken == []  # nobody is told before the snapshot is swapped
    k.maps.flush()
    assert INFERENCE in k.maps.model.maps and k.published.current.model is k.maps.model
    assert taken(k.drifts) == {INFERENCE} and taken(k.templates) == {TEMPLATES}
    assert WakeKey.map(INFERENCE) in k.woken[-1]
    # Our own status patch comes back: the same text, nothing to apply or compile.
    echoed = {**obj, "metadata": {**obj["metadata"], "annotations": {STATUS_ANNOTATION: "{}"}}}
    assert k.maps.apply(SourceChanged(echoed)) is None


def test_a_standby_compiles_nothing_and_keeps_what_is_pending() -> None:
    k = Keepers()
    k.lease = False
    k.maps.apply_all([SourceChanged(source(map_text()))])
    assert k.maps.publish(dict, first=True) is False
    assert k.maps.uncompiled and k.api.writes == [] and not k.maps.model.maps


def test_a_pass_of_the_model_queue_applies_what_the_inbox_holds_and_publishes_it() -> None:
    k = Keepers()
    k.inbox.put(SourceChanged(source(map_text())))
    k.inbox.put(NodeChanged(node("gpu-1")))
    assert k.models.get(10, timeout=0) == [MODEL]  # two changes, one key
    k.maps.reconcile([MODEL])
    assert INFERENCE in k.published.current.model.maps and k.maps.ready.is_set()
    assert {w[0] for w in k.api.writes} == {"put"}  # the model ConfigMaps
    assert INFERENCE in taken(k.statuses)


def test_a_pass_that_changed_nothing_publishes_no_new_snapshot() -> None:
    k = Keepers()
    k.apply(NodeChanged(node("gpu-1")), SourceChanged(source(map_text())))
    before = k.published.current
    k.apply(NodeChanged(node("gpu-1")))  # a heartbeat
    assert k.published.current is before
    k.apply(NodeChanged(node("gpu-1", ready=False)))
    assert k.published.current is not before


def test_the_others_are_told_only_after_the_snapshot_they_read_is_swapped() -> None:
    k = Keepers()
    seen: list[bool] = []

    class Watching(WorkQueue[StatusKey]):
        def add_all(self, keys: Any) -> None:
            keys = set(keys)
            seen.append(INFERENCE in keys and INFERENCE in k.published.current.sources)
            super().add_all(keys)

    k.maps.statuses = Watching("status")
    k.apply(SourceChanged(source(map_text())))
    assert seen == [True]


def test_an_invalid_version_keeps_the_last_valid_one_in_service() -> None:
    k = Keepers()
    k.apply(SourceChanged(source(map_text())))
    k.maps.publish(dict, first=True)
    generation = k.maps.model.generation
    k.apply(SourceChanged(source(map_text(devices="[0, 0]"))))
    k.maps.publish(dict, first=False)
    assert k.maps.model.generation == generation
    state = k.maps.sources[INFERENCE]
    assert state.errors and state.valid is not None


def test_a_deleted_source_leaves_the_model_and_its_status_bookkeeping() -> None:
    k = Keepers()
    obj = source(map_text())
    k.apply(SourceChanged(obj))
    k.maps.publish(dict, first=True)
    k.maps.flush()
    taken(k.statuses)
    k.maps.apply_all([SourceDeleted(obj)])
    k.maps.publish(dict, first=False)
    k.maps.flush()
    assert INFERENCE not in k.maps.model.maps and INFERENCE not in k.maps.sources
    assert INFERENCE in taken(k.statuses)  # the status writer forgets it
    assert INFERENCE not in k.published.current.sources


def test_an_inventory_change_wakes_the_nodes_pods() -> None:
    k = Keepers()
    k.maps.apply_all([InventoryChanged(NodeName("gpu-1"), None)])
    k.maps.publish(dict, first=False)
    k.maps.flush()
    assert any(WakeKey.inventory(NodeName("gpu-1")) in keys for keys in k.woken)


# -- GrantKeeper ----------------------------------------------------------------------------------


def test_a_map_outside_its_grants_is_withheld_and_named_for_its_status() -> None:
    k = Keepers()
    k.apply(NodeChanged(node("gpu-1")), SourceChanged(source(map_text())))
    assert k.grants.apply_policy(
        source(POLICY, "gpuplace-system", "gpuplace-policy") | {"data": {"policy.yaml": POLICY}}
    )
    assert k.apply() == {INFERENCE, POLICY_KEY}  # the map, and the policy's verdict
    assert INFERENCE in k.published.current.denied  # inference is granted gpu-2 only
    k.maps.publish(dict, first=True)
    assert INFERENCE not in k.maps.model.maps


def test_an_invalid_policy_is_reported_and_the_last_valid_one_applies() -> None:
    k = Keepers()
    good = {"metadata": {"name": "gpuplace-policy", "namespace": "gpuplace-system", "uid": "u"}}
    assert k.grants.apply_policy({**good, "data": {"policy.yaml": POLICY}})
    before = k.grants.policy
    assert not k.grants.apply_policy({**good, "data": {"policy.yaml": "spec: [unclosed"}})
    assert k.grants.policy == before
    assert [e["reason"] for e in k.api.events] == ["PolicyInvalid"]
    assert "policy.yaml" in k.api.events[0]["message"]


def test_a_node_label_change_resolves_the_grants_again_only_under_a_policy() -> None:
    k = Keepers()
    k.grants.dirty = False
    k.grants.set_node(NodeName("gpu-1"), {"pool": "a"})
    k.grants.set_node(NodeName("gpu-1"), {"pool": "b"})
    assert not k.grants.dirty  # no policy: labels cannot change a grant
    k.grants.apply_policy({"metadata": {"name": "p"}, "data": {"policy.yaml": POLICY}})
    k.grants.dirty = False
    k.grants.set_node(NodeName("gpu-1"), {"pool": "c"})
    assert k.grants.dirty


# -- NodeKeeper -----------------------------------------------------------------------------------


def test_a_heartbeat_changes_nothing_and_an_alias_wakes_its_legacy_pods() -> None:
    k = Keepers()
    keys = k.nodes.apply(node("gpu-1", alias="node1"), deleted=False, leading=True)
    assert keys == {
        WakeKey.node(NodeName("gpu-1")),
        WakeKey.nodes(),
        WakeKey.node(NodeName("node1")),
    }
    assert k.nodes.apply(node("gpu-1", alias="node1"), deleted=False, leading=True) is None
    k.nodes.refresh_aliases()
    assert k.nodes.aliases == {"node1": frozenset({NodeName("gpu-1")})}


def test_a_deleted_nodes_inventory_and_lease_go_on_the_leader_only() -> None:
    k = Keepers()
    k.nodes.apply(node("gpu-1"), deleted=False, leading=True)
    k.nodes.apply(node("gpu-1"), deleted=True, leading=False)
    assert [w for w in k.api.writes if w[0] == "delete"] == []
    k.nodes.apply(node("gpu-2"), deleted=False, leading=True)
    k.nodes.apply(node("gpu-2"), deleted=True, leading=True)
    deleted = sorted(w[1] for w in k.api.writes if w[0] == "delete")
    assert deleted == [
        "/api/v1/namespaces/gpuplace-inventory/configmaps/gpu-2",
        "/apis/coordination.k8s.io/v1/namespaces/gpuplace-inventory/leases/gpu-2",
    ]
    assert NodeName("gpu-2") not in k.nodes.nodes


# -- StatusWriter ---------------------------------------------------------------------------------


def status(bound: int) -> MapStatus:
    return MapStatus(
        Phase.VALID, 1, "v1", "2 slots", slots=SlotCounts(total=2, served=2, bound=bound)
    )


def status_writer(
    api: Apiserver, sources: FakeInformer | None, published: Published | None = None
) -> StatusWriter:
    return StatusWriter(
        api,  # type: ignore[arg-type]
        EventRecorder(api, "test"),  # type: ignore[arg-type]
        ControllerMetrics(),
        published or Published(),
        ZERO,
        sources=sources,  # type: ignore[arg-type]
        bound_seconds=60.0,
    )


def test_a_status_whose_only_news_is_the_bound_count_waits_for_the_next_pass() -> None:
    api = Apiserver()
    informer = FakeInformer([source(map_text())])
    writer = status_writer(api, informer)
    assert writer._write_one(INFERENCE, status(0)) is None
    patched = [w for w in api.writes if w[0] == "patch"]
    assert len(patched) == 1
    # The annotation came back on the object.
    informer.store[("inference", "llm")]["metadata"]["annotations"] = {
        STATUS_ANNOTATION: status(0).to_json()
    }
    assert writer._write_one(INFERENCE, status(0)) is None  # unchanged: nothing written
    held = writer._write_one(INFERENCE, status(1))  # held back for the rest of the minute
    assert held is not None and 0 < held <= 60
    assert len([w for w in api.writes if w[0] == "patch"]) == 1
    assert (
        writer._write_one(INFERENCE, replace(status(1), phase=Phase.DEGRADED, message="x")) is None
    )
    assert len([w for w in api.writes if w[0] == "patch"]) == 2
    # The first patch is a transition (a new map: Valid), the second one too (Degraded).
    assert [e["reason"] for e in api.events] == ["Valid", "Degraded"]


def test_a_map_from_git_has_no_object_to_patch() -> None:
    api = Apiserver()
    writer = status_writer(api, None)
    assert writer._write_one(INFERENCE, status(0)) is None
    assert api.writes == [] and api.events == []


def test_a_status_reconcile_reads_the_snapshot_and_asks_again_for_what_failed() -> None:
    k = Keepers()
    k.apply(SourceChanged(source(map_text())))
    k.maps.publish(dict, first=True)
    k.maps.flush()

    class Refusing(Apiserver):
        def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
            raise APIServerError(503, "ServiceUnavailable", path)

    down = Refusing()
    writer = status_writer(down, FakeInformer([source(map_text())]), k.published)
    assert writer.reconcile([INFERENCE]) == {INFERENCE: RETRY}  # after its backoff
    api = Apiserver()
    writer = status_writer(api, FakeInformer([source(map_text())]), k.published)
    assert writer.reconcile([INFERENCE]) == {}
    assert [w[0] for w in api.writes] == ["patch"]
    assert writer.latest[INFERENCE].phase is Phase.DEGRADED  # gpu-1 has no inventory
    writer.published = Published()  # the map's source is gone: its bookkeeping goes
    assert writer.reconcile([INFERENCE]) == {} and INFERENCE not in writer.latest


def test_a_status_writer_that_lost_the_lease_writes_nothing() -> None:
    api = Apiserver()
    writer = status_writer(api, FakeInformer([source(map_text())]))
    writer.holds_lease = lambda: False
    assert writer.reconcile([INFERENCE, POLICY_KEY]) is None
    assert api.writes == []


# -- PodWatch and KeyWatch against a fake binder -------------------------------------------------


class FakeCache:
    def holdings(self) -> list[Any]:
        return []

    def bound_count(self, _key: MapKey) -> int:
        return 0


class FakeBinder:
    def __init__(self, trust: TrustView | None = None) -> None:
        self.active = threading.Event()
        self.trust = trust
        self.seen: list[tuple[str, str]] = []
        self.cache = FakeCache()
        self.retrusted: list[TrustView] = []

    def on_pod(self, event: str, pod: Pod, _shared: set[str], bound: Any = None) -> None:
        self.seen.append((event, pod.name))
        if bound is not None:  # as the real binder does with a pod it does not hold yet
            bound.holding(set())
            bound.judged()

    def retrust(self, view: TrustView, _pods: Any, _shared: Any) -> None:
        self.retrusted.append(view)


KEY = b"k" * 32


def bound_pod(ring: TrustView, phase: str = "Running") -> dict[str, Any]:
    decision = BindingDecision(INFERENCE, 0, NodeName("gpu-1"), (GpuUuid("GPU-a"),), "0", 1)
    signer = ring.ring.signer
    annotations = signed_binding(signer.secret, signer.id, "uid-0", "inference", decision)
    return {
        "metadata": {
            "namespace": "inference",
            "name": "llm-0",
            "uid": "uid-0",
            "labels": {MAP_LABEL: "llm"},
            "annotations": annotations,
        },
        "spec": {"nodeName": "gpu-1", "schedulerName": "gpuplace"},
        "status": {"phase": phase},
    }


class Clock:
    """A queue's clock that the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settled(queue: WorkQueue[Any], clock: Clock) -> set[Any]:
    """`taken` once the keys a bound pod queued (`BOUND_SETTLE_SECONDS` later) are due."""
    clock.now += BOUND_SETTLE_SECONDS
    return taken(queue)


DRIFT_CLOCK = Clock()


def pod_watch(binder: FakeBinder) -> tuple[PodWatch, WorkQueue[MapKey]]:
    api = Apiserver()
    events = EventRecorder(api, "test")  # type: ignore[arg-type]
    drifts: WorkQueue[MapKey] = WorkQueue("drift", clock=DRIFT_CLOCK)
    watch = PodWatch(
        binder,  # type: ignore[arg-type]
        RenumberTracker(api, events, lambda _n: None),  # type: ignore[arg-type]
        Published(),
        WorkQueue("status"),
        drifts,
    )
    return watch, drifts


def test_a_bound_pods_repeated_events_are_judged_once_while_leading() -> None:
    ring = TrustView.of(new_ring(KEY, "2026-01-01T00:00:00Z"), (), "1")
    binder = FakeBinder(ring)
    watch, drifts = pod_watch(binder)
    pod = bound_pod(ring)
    watch.on_pod("ADDED", pod)
    assert binder.seen == [] and watch.is_running("uid-0")  # standby: the binder sees nothing
    assert taken(drifts) == set()  # due once the drain's binds of the map have settled
    assert settled(drifts, DRIFT_CLOCK) == {INFERENCE}
    binder.active.set()
    watch.on_pod("MODIFIED", pod)
    assert settled(drifts, DRIFT_CLOCK) == {INFERENCE}
    watch.on_pod("MODIFIED", pod)  # the kubelet wrote its status: same binding
    assert settled(drifts, DRIFT_CLOCK) == set()
    assert binder.seen == [("MODIFIED", "llm-0"), ("MODIFIED", "llm-0")]
    watch.on_pod("DELETED", pod)
    assert not watch.is_running("uid-0")


def test_the_key_ring_is_followed_only_by_the_leader_and_an_unreadable_one_is_counted() -> None:
    ring = TrustView.of(new_ring(KEY, "2026-01-01T00:00:00Z"), (), "1")
    binder = FakeBinder(ring)
    api = Apiserver()
    metrics = ControllerMetrics()
    broken = {
        "metadata": {"name": "gpuplace-binding-key", "namespace": "gpuplace-system"},
        "data": {"keyring.json": "bm90IGpzb24="},
    }
    queue: WorkQueue[str] = WorkQueue("key-ring")
    keys = KeyWatch(
        api,  # type: ignore[arg-type]
        KeySecret("gpuplace-system", "gpuplace-binding-key"),
        binder,  # type: ignore[arg-type]
        metrics,
        lambda: nullcontext([]),
        Published(),
        FakeInformer([broken]),  # type: ignore[arg-type]
        queue,
    )
    keys.on_secret("MODIFIED", broken, None)
    keys.on_secret("MODIFIED", broken, None)
    assert taken(queue) == {KEY_RING}  # the informer's events only add the key
    keys.reconcile([KEY_RING])
    assert metrics.key_ring_errors._value.get() == 0  # standby: not its to read
    binder.active.set()
    keys.reconcile([KEY_RING])
    assert metrics.key_ring_errors._value.get() == 1
    assert binder.retrusted == [] and binder.trust is ring


def test_loading_the_ring_retries_until_stopped() -> None:
    class Down(Apiserver):
        def get(self, path: str, **_: Any) -> dict[str, Any]:
            raise APIServerError(503, "ServiceUnavailable", path)

    keys = KeyWatch(
        Down(),  # type: ignore[arg-type]
        KeySecret("gpuplace-system", "gpuplace-binding-key"),
        FakeBinder(),  # type: ignore[arg-type]
        ControllerMetrics(),
        lambda: nullcontext([]),
        Published(),
        FakeInformer(),  # type: ignore[arg-type]
        WorkQueue("key-ring"),
    )
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(APIServerError, match="ServiceUnavailable"):
        keys.load(stop, retry_seconds=0.05)
    assert time.monotonic() - started >= 0.25


def test_a_bound_pods_first_event_decodes_and_judges_its_binding_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = TrustView.of(new_ring(KEY, "2026-01-01T00:00:00Z"), (), "1")
    binder = FakeBinder(ring)
    binder.active.set()
    watch, _ = pod_watch(binder)
    decoded: list[str] = []
    judged: list[str] = []
    real_decode = podfacts.decode_binding
    real_judge = TrustView.judge

    def decode(namespace: str, annotations: Any) -> Any:
        decoded.append(namespace)
        return real_decode(namespace, annotations)

    def judge(self: TrustView, uid: str, *rest: Any) -> Any:
        judged.append(uid)
        return real_judge(self, uid, *rest)

    monkeypatch.setattr(podfacts, "decode_binding", decode)
    monkeypatch.setattr(TrustView, "judge", judge)
    watch.on_pod("ADDED", bound_pod(ring))
    assert binder.seen == [("ADDED", "llm-0")]
    assert decoded == ["inference"] and judged == ["uid-0"]
