"""Why a pod waits or a slot is not served: the one vocabulary of reasons.

The values are what users see (the pod's `PodScheduled` condition reason, its Event reason, the
`blocked` of a slot in map status, an agent's check result, the `reason` label of
`gpuplace_unschedulable_total`), so they never change. Compile, the binder's decision, the DRA
allocation and the agent's device checks all name reasons through this type.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # the map and the pod's index
    MAP_NOT_FOUND = "MapNotFound"
    MAP_INVALID = "MapInvalid"
    NOT_GRANTED = "NotGranted"
    INDEX_INVALID = "IndexInvalid"
    INDEX_NOT_IN_MAP = "IndexNotInMap"
    NO_PLACEMENT = "NoPlacement"
    NOT_ADMITTED = "NotAdmitted"  # a map's pod the webhook never admitted (placement/admitted.py)
    # slots
    SLOT_TAKEN = "SlotTaken"
    NO_FREE_SLOT = "NoFreeSlot"
    NO_SERVABLE_SLOT = "NoServableSlot"
    SLOT_CONFLICT = "SlotConflict"
    INSUFFICIENT_DEVICES = "InsufficientDevices"
    # nodes and their inventories
    NODE_NOT_FOUND = "NodeNotFound"
    NODE_NOT_READY = "NodeNotReady"
    NODE_CORDONED = "NodeCordoned"
    INVENTORY_MISSING = "InventoryMissing"
    INVENTORY_STALE = "InventoryStale"
    # devices
    DEVICE_MISSING = "DeviceMissing"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    DEVICE_TAINTED = "DeviceTainted"  # a DRA device taint the slot does not tolerate
    DEVICE_BUSY = "DeviceBusy"
    REQUIREMENT_MISMATCH = "RequirementMismatch"
    NO_NVLINK_SET = "NoNVLinkSet"  # require.nvlink: no free set of GPUs all joined by NVLink
    CLIQUE_MISMATCH = "CliqueMismatch"  # sameClique: the slot's node is in another GPU clique
    # gangs (placement/gang.py)
    GANG_WAITING = "GangWaiting"  # not every slot of the gang has its pod and can be served
    GANG_STUCK = "GangStuck"  # ... for longer than the gang's timeoutSeconds
    GANG_UNRANKED = "GangUnranked"  # a pod of a gang map without a rank of its own
    # dra enforcement
    CLAIM_PENDING = "ClaimPending"
    CLAIM_MISSING = "ClaimMissing"
    CLAIM_CONFLICT = "ClaimConflict"


class EventReason(StrEnum):
    """Reasons of the controller's Events and of the pod conditions it writes (other than why a
    pod waits, which is `Reason`): what `kubectl get events` and alert rules match on."""

    # drift (condition gpuplace.io/Drifted and its Events)
    MATCHES_MAP = "MatchesMap"
    DRIFTED = "Drifted"
    EVICTED_FOR_ROLLOUT = "EvictedForRollout"
    # renumbering (condition DevicesRenumbered)
    INDICES_NAME_OTHER_GPUS = "IndicesNameOtherGPUs"
    INDICES_MATCH = "IndicesMatch"
    DEVICES_RENUMBERED = "DevicesRenumbered"
    DEVICES_NUMBERED_AS_BOUND = "DevicesNumberedAsBound"
    # binding trust (condition gpuplace.io/BindingUnverifiable)
    BINDING_UNVERIFIED = "BindingUnverified"
    BINDING_UNVERIFIABLE = "BindingUnverifiable"
    BINDING_ADOPTED = "BindingAdopted"
    BINDING_VERIFIED = "BindingVerified"
    # grants
    POLICY_INVALID = "PolicyInvalid"
    # the slot cache: two bound pods hold one GPU that neither may share
    GPU_HELD_TWICE = "GPUHeldTwice"
