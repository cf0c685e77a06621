"""Reasons are what users read in conditions, Events, map status and metrics: their text is fixed."""

from __future__ import annotations

from controller.metrics import UNSCHEDULABLE_REASONS
from placement.reasons import Reason

#: The reason texts as users have seen them; renaming one is a breaking change.
PUBLISHED = {
    "MapNotFound", "MapInvalid", "NotGranted", "IndexInvalid", "IndexNotInMap", "NoPlacement",
    "SlotTaken", "NoFreeSlot", "NoServableSlot", "SlotConflict", "InsufficientDevices",
    "NodeNotFound", "NodeNotReady", "NodeCordoned", "InventoryMissing", "InventoryStale",
    "DeviceMissing", "DeviceUnhealthy", "DeviceTainted", "DeviceBusy", "RequirementMismatch",
    "NoNVLinkSet", "CliqueMismatch",
    "ClaimPending", "ClaimMissing", "ClaimConflict",
    "NotAdmitted",
    "GangWaiting", "GangStuck", "GangUnranked",
}  # fmt: skip


def test_every_reason_keeps_its_published_text() -> None:
    assert {r.value for r in Reason} == PUBLISHED


def test_every_metric_series_is_a_known_reason() -> None:
    assert all(isinstance(r, Reason) for r in UNSCHEDULABLE_REASONS)
    assert len(set(UNSCHEDULABLE_REASONS)) == len(UNSCHEDULABLE_REASONS)
