"""The controller is wired in one place (controller/builder.py): each reconciler gets what it calls
at construction, nothing in the controller assigns a callback into an object afterwards or hands one
a closure over a name bound further down, and each concern has a queue of its own."""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.builder import build, node_handler
from controller.changequeue import ChangeQueue
from controller.changes import NodeChanged
from controller.manager import Controller
from controller.settings import ControllerSettings
from controller.trim import trim_node
from controller.workqueue import Workers, WorkQueue
from kubeio.informer import ADDED, DELETED, MODIFIED
from kubeio.pod import Pod
from placement.annotations import MAP_LABEL
from placement.dra import Enforcement
from placement.keyring import TrustView, new_ring
from placement.types import MapKey, NodeName
from tests.unit.controller.test_binder import KEY, Apiserver, make_pod

CONTROLLER = Path(__file__).resolve().parents[3] / "controller"
#: `thing.on_x = ...`, `obj.wake = ...`, `tracker.taints_of = ...` on another object than self.
ASSIGNED_CALLBACK = re.compile(
    r"^\s*(?!self\.\w+\s*=)[\w.]+\.(on_\w+|_?wake|taints_of|leading|holds_lease|fence)\s*=[^=]"
)


@contextmanager
def controller(enforcement: Enforcement = Enforcement.ENV) -> Iterator[Controller]:
    """Built and never started; closed after (its ports' sockets)."""
    settings = replace(ControllerSettings(), enforcement=enforcement, metrics_port=0)
    c = build(Apiserver(), settings)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.close()


def late_bound(source: str) -> list[str]:
    """Closures (lambdas, nested functions) that read a name of their enclosing function which is
    first bound below them: a cycle closed by the order of assignment, not by construction."""
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        bound: dict[str, int] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound[node.id] = min(bound.get(node.id, node.lineno), node.lineno)
        closures = [
            n
            for n in ast.walk(func)
            if n is not func and isinstance(n, ast.Lambda | ast.FunctionDef)
        ]
        for closure in closures:
            own = {a.arg for a in ast.walk(closure.args) if isinstance(a, ast.arg)} | {
                n.id
                for n in ast.walk(closure)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
            found += [
                f"{func.name}:{closure.lineno}: {node.id}"
                for node in ast.walk(closure)
                if isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Load)
                and node.id not in own
                and bound.get(node.id, 0) > closure.lineno
            ]
    return sorted(set(found))


def test_no_callback_is_assigned_into_an_object_after_it_is_built() -> None:
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(CONTROLLER.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ASSIGNED_CALLBACK.match(line)
    ]
    assert found == []


def test_the_check_finds_an_assigned_callback() -> None:
    assert ASSIGNED_CALLBACK.match("        self.binder.report.on_map = self._on_trust_change")
    assert ASSIGNED_CALLBACK.match("        maps.wake = self.binder.wake")
    assert not ASSIGNED_CALLBACK.match("        self.on_map = on_map")
    assert not ASSIGNED_CALLBACK.match("        if maps.wake == other:")


def test_no_closure_in_the_controller_reads_a_name_bound_below_it() -> None:
    found = [
        f"{path.name}:{where}"
        for path in sorted(CONTROLLER.glob("*.py"))
        for where in late_bound(path.read_text())
    ]
    assert found == []
    assert not [p.name for p in CONTROLLER.glob("*.py") if "bound below" in p.read_text()]


def test_the_check_finds_a_late_bound_closure() -> None:
    source = (
        "def build():\n"
        "    elector = Elector(lambda: controller.start())\n"
        "    def wake(keys):\n"
        "        binder.wake(keys)\n"
        "    binder = Binder(wake)\n"
        "    controller = Controller(elector, binder)\n"
        "    ok = lambda: binder.alive()\n"
    )
    assert late_bound(source) == ["build:2: controller", "build:3: binder"]


def queues(workers: list[Workers[Any]]) -> list[str]:
    return [w.queue.name for w in workers]


def test_each_concern_has_its_own_queue_and_reconciler() -> None:
    with controller(Enforcement.DRA) as c:
        assert queues([*c.workers]) == ["model", "expiry", "taints", "dra-wakes"]
        assert queues([*c.leadership.workers]) == ["status", "drift", "key-ring", "templates"]
        owners = [w.reconcile.__self__ for w in (*c.workers, *c.leadership.workers)]  # type: ignore[attr-defined]
        assert len({id(o) for o in owners}) == len(owners) - 1  # the tracker: expiry and taints


def test_the_model_keeper_wakes_the_binder_and_asks_the_lease() -> None:
    with controller() as c:
        lead = c.leadership
        assert lead.maps.wake == lead.binder.wake
        assert lead.maps.holds_lease == c.elector.hold.holds == lead.binder.fence
        assert not lead.maps.leading()
        lead.leading.set()
        assert lead.maps.leading()


def test_a_map_whose_trust_report_changed_gets_its_status_written() -> None:
    with controller() as c:
        key = MapKey("ml", "llm")
        c.leadership.binder.report.on_map(key)
        assert c.leadership.statuses.get(timeout=0) == [key]


def test_the_elector_starts_and_ends_this_controllers_leadership() -> None:
    with controller() as c:
        assert c.elector.on_started == c.leadership.start
        c.leadership.binder.stop()  # nothing was started: stopping drains nothing
        assert c.elector.on_stopped() is True
        assert c.lost_leadership.is_set()


def test_dra_taints_reach_the_inventories_through_their_queue() -> None:
    with controller(Enforcement.DRA) as c:
        dra = c.leadership.binder.dra
        assert dra is not None
        assert c.leadership.tracker.taints_of == dra.taints_on
        dra.on_taints(NodeName("node-a"))
        (taints,) = [w for w in c.workers if w.queue.name == "taints"]
        assert taints.queue.get(timeout=0) == [NodeName("node-a")]
        assert taints.reconcile == c.leadership.tracker.retaint_all


def test_no_templates_outside_dra_enforcement() -> None:
    with controller() as c:
        assert c.leadership.binder.dra is None
        assert "templates" not in queues([*c.leadership.workers])


def test_a_node_heartbeat_puts_no_change_in_the_model_inbox() -> None:
    inbox = ChangeQueue(WorkQueue("model"))
    handle = node_handler(inbox)
    node = trim_node({"metadata": {"name": "n1", "resourceVersion": "1", "labels": {"a": "b"}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
    beat = {**node, "metadata": {**node["metadata"], "resourceVersion": "2"}}
    cordoned = {**beat, "spec": {"unschedulable": True}}
    handle(ADDED, node, None)
    handle(MODIFIED, beat, node)
    handle(MODIFIED, cordoned, beat)
    handle(DELETED, cordoned, cordoned)
    assert inbox.take() == [
        NodeChanged(node, deleted=False),
        NodeChanged(cordoned, deleted=False),
        NodeChanged(cordoned, deleted=True),
    ]


def test_a_pod_created_while_the_leader_reads_its_pods_is_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leadership's start reads the pods the informers hold and switches the binder on: a pod
    whose event comes between the two is in neither, unless the informers hold their events back
    for the whole step. The event is sent from another thread while the snapshot is read."""
    with controller() as c:
        lead = c.leadership
        lead.binder.trust = TrustView.of(new_ring(KEY, "2026-01-01T00:00:00Z"), (), "1")
        (informer, *_) = c.informers.pods
        informer._apply(ADDED, make_pod("web-0").label(MAP_LABEL, "llm").obj())
        read = Pod.of
        late: list[threading.Thread] = []

        def of(obj: dict[str, Any]) -> Pod:
            if not late:  # the snapshot's first pod: a new pod's event comes now
                created = make_pod("web-1").label(MAP_LABEL, "llm").obj()
                late.append(threading.Thread(target=informer._apply, args=(ADDED, created)))
                late[0].start()
                late[0].join(0.5)  # delivered at once, or held back until the step ends
            return read(obj)

        monkeypatch.setattr(Pod, "of", of)
        lead._rebuild_from_pods()
        monkeypatch.setattr(Pod, "of", read)
        late[0].join(10)
        assert not late[0].is_alive()
        assert sorted(lead.binder.queue.added_at) == ["uid-web-0", "uid-web-1"]
