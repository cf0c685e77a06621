"""The controller is wired in one place (controller/builder.py): each reconciler gets what it calls
at construction, and nothing in the controller assigns a callback into an object afterwards."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from controller.builder import build
from controller.manager import Controller
from controller.settings import ControllerSettings
from placement.dra import Enforcement
from placement.types import MapKey, NodeName
from tests.unit.controller.test_binder import Apiserver

CONTROLLER = Path(__file__).resolve().parents[3] / "controller"
#: `thing.on_x = ...`, `obj.wake = ...`, `tracker.taints_of = ...` on another object than self.
ASSIGNED_CALLBACK = re.compile(
    r"^\s*(?!self\.\w+\s*=)[\w.]+\.(on_\w+|_?wake|taints_of|leading|holds_lease|fence)\s*=[^=]"
)


def controller(enforcement: Enforcement = Enforcement.ENV) -> Controller:
    settings = replace(ControllerSettings(), enforcement=enforcement)
    return build(Apiserver(), settings)  # type: ignore[arg-type]


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


def test_the_model_keeper_wakes_the_binder_and_asks_the_elector() -> None:
    c = controller()
    assert c.maps.wake == c.binder.wake
    assert c.maps.holds_lease == c.elector.holds == c.binder.fence
    assert not c.maps.leading()
    c.leading.set()
    assert c.maps.leading()


def test_a_map_whose_trust_report_changed_gets_its_status_written() -> None:
    c = controller()
    key = MapKey("ml", "llm")
    c.binder.report.on_map(key)
    assert c.statuses.take() == {key}


def test_the_elector_starts_and_ends_this_controllers_leadership() -> None:
    c = controller()
    c.binder.stop()  # nothing was started: stopping drains nothing
    assert c.elector.on_stopped() is True
    assert c.lost_leadership.is_set()


def test_dra_taints_reach_the_inventories_and_the_templates_are_kept() -> None:
    c = controller(Enforcement.DRA)
    dra = c.binder.dra
    assert dra is not None
    assert c.tracker.taints_of == dra.taints_on
    assert dra.on_taints(NodeName("node-a")) is None  # the tracker re-serves it (none here)
    assert c.templates is not None


def test_no_templates_outside_dra_enforcement() -> None:
    c = controller()
    assert c.binder.dra is None and c.templates is None
