"""The allocation decision of `dra` enforcement, as a pure function: whether a pod's claim can get
the devices its placement decided, and how (`plan_claim`), the gate's judgement included.

The controller's `DraTracker` holds what its watches saw (the DRA driver's ResourceSlices, the
claims, the DeviceTaintRules) and asks under its lock, through a `DraView` of its maps; the claim
writes that carry a `ClaimPlan` out are the controller's too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from placement.binding import Code, Held, Placement, Status
from placement.dra import (
    POD_CLAIM_NAME,
    ClaimState,
    DraDevice,
    allocation_matches,
    judge_claim,
    template_name,
)
from placement.grants import GrantView
from placement.inventory import NodeInventory
from placement.reasons import Reason
from placement.taints import DeviceTaint, TaintRule, Toleration, untolerated
from placement.types import GpuUuid, NodeName, Sharing
from placement.wake import WakeKey

DeviceId = tuple[str, str, str]  # (driver, pool, device)
ClaimKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The allocation a pod's claim gets before its Binding."""

    claim: ClaimState
    node: NodeName
    devices: tuple[DraDevice, ...]
    done: bool  # already allocated exactly so and reserved for the pod (a failover)
    tolerations: tuple[Toleration, ...] = ()  # the slot's, written into each allocation result


class ClaimingPod(Protocol):
    """The parts of a pod the decision reads (`kubeio.pod.Pod` has them)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    def has_claim(self, name: str) -> bool:
        """Whether spec.resourceClaims has an entry `name`."""
        ...

    def generated_claim(self, name: str) -> str | None:
        """The claim generated for entry `name` of spec.resourceClaims, once there is one."""
        ...


class GpuHolders(Protocol):
    """The slot cache's part the decision reads (`placement.binding.SlotView` has it)."""

    def gpu_holders(self, node: NodeName, gpu: str) -> Mapping[str, Sharing]:
        """The pods that hold the GPU by a slot, by uid, and how."""
        ...

    def holding(self, uid: str) -> Held | None:
        """The slot the pod `uid` holds (its `pod` is namespace/name)."""
        ...


@dataclass(frozen=True, slots=True)
class DraView:
    """What the watches hold, as the decision reads it."""

    driver: str
    #: The devices each node's ResourceSlices publish, by GPU or MIG UUID.
    devices: Mapping[NodeName, Mapping[GpuUuid, DraDevice]]
    claims: Mapping[ClaimKey, ClaimState]
    #: The claims whose allocation names each device.
    allocated: Mapping[DeviceId, Collection[ClaimKey]]
    #: DeviceTaintRules by name (none where the API is not served).
    rules: Mapping[str, TaintRule]


def device_taints(
    device: DraDevice, rules: Mapping[str, TaintRule], driver: str
) -> list[tuple[DeviceTaint, str]]:
    """The device's taints and where each comes from (its slice, or a rule)."""
    found = [(t, "in its ResourceSlice") for t in device.taints]
    for name in sorted(rules):
        rule = rules[name]
        if rule.selects(driver, device.pool, device.name):
            found.append((rule.taint, f"by DeviceTaintRule {name}"))
    return found


def _wait(reason: Reason, message: str, *keys: WakeKey) -> Status:
    return Status(Code.UNSCHEDULABLE, reason, message, frozenset(keys))


def plan_claim(
    pod: ClaimingPod,
    placement: Placement,
    slots: GpuHolders,
    view: DraView,
    tolerations: tuple[Toleration, ...] = (),
    grants: GrantView | None = None,
    inventory: NodeInventory | None = None,
) -> ClaimPlan | Status:
    """Whether the pod's claim can get the placement's devices, and how. A device tainted
    NoSchedule or NoExecute (by its driver or a DeviceTaintRule) serves only a slot that
    tolerates the taint.

    The gate judges the allocation on the devices the driver publishes for the node (a MIG
    instance as its parent GPU, each named as the node's `inventory` names it) before it is
    written: outside the pod's namespace's `grants` it is refused, NotGranted. Every other
    claim's allocation of a device holds it, whoever wrote it (one owner per GPU; a tenant's
    claim cannot get a managed GPU from kube-scheduler past the chart's `gpu-claims` admission
    policy, docs/trust.md); only the claims of pods sharing it by a shared slot do not."""
    allowed = grants if grants is not None else GrantView()
    decision = placement.decision
    node, uid = decision.node, pod.uid
    where = f"map {placement.slot.map} index {placement.slot.index}"
    if not decision.devices:
        return _wait(
            Reason.DEVICE_MISSING,
            f"{where}: the UUIDs of its devices on node {node} are unknown (DRA allocation "
            "names devices by UUID; the GPU agent's inventory resolves NVML indices)",
            WakeKey.inventory(node),
            WakeKey.model(),
        )
    found = _published(where, node, decision.devices, tolerations, view)
    if isinstance(found, Status):
        return found
    devices = found
    refusal = judge_claim(allowed, pod.namespace, node, devices, inventory)
    if refusal is not None:
        return Status(
            Code.UNRESOLVABLE,
            Reason.NOT_GRANTED,
            f"{where}: ResourceClaim allocation refused: {refusal}",
            frozenset({WakeKey.model()}),  # a new policy comes with a new model
        )
    if not pod.has_claim(POD_CLAIM_NAME):
        return Status(
            Code.UNRESOLVABLE,
            Reason.CLAIM_MISSING,
            f"{where}: the pod has no spec.resourceClaims entry {POD_CLAIM_NAME!r}; pods "
            "of maps in dra enforcement get it from the gpuplace webhook at creation "
            "(recreate the pod)",
            frozenset({WakeKey.pod(uid)}),
        )
    claim_name = pod.generated_claim(POD_CLAIM_NAME)
    claim = view.claims.get((pod.namespace, claim_name or ""))
    if claim is None:
        template = template_name(placement.slot.map.name)
        return _wait(
            Reason.CLAIM_PENDING,
            f"{where}: waiting for the pod's ResourceClaim (generated by "
            f"kube-controller-manager from ResourceClaimTemplate {template})",
            WakeKey.claim(uid),
            WakeKey.pod(uid),
        )
    if claim.owner_uid != uid:
        return Status(
            Code.UNRESOLVABLE,
            Reason.CLAIM_CONFLICT,
            f"{where}: ResourceClaim {claim.namespace}/{claim.name} in the pod's status "
            "was not generated for this pod",
            frozenset({WakeKey.pod(uid)}),
        )
    if claim.deleting:
        return _wait(
            Reason.CLAIM_PENDING,
            f"{where}: ResourceClaim {claim.namespace}/{claim.name} is being deleted",
            WakeKey.claim(uid),
        )
    busy = _busy(where, claim, node, devices, slots, view)
    if busy is not None:
        return busy
    done = bool(claim.allocated) and (
        allocation_matches(claim, devices, node, view.driver) and uid in claim.reserved_for
    )
    return ClaimPlan(claim, node, tuple(devices), done, tolerations)


def _published(
    where: str,
    node: NodeName,
    uuids: Iterable[GpuUuid],
    tolerations: tuple[Toleration, ...],
    view: DraView,
) -> list[DraDevice] | Status:
    """The driver's devices of `uuids` on the node, or why one cannot serve the slot (not
    published, or tainted beyond the slot's tolerations)."""
    published = view.devices.get(node, {})
    devices: list[DraDevice] = []
    for uuid in uuids:
        device = published.get(uuid)
        if device is None:
            return _wait(
                Reason.DEVICE_MISSING,
                f"{where}: device {uuid} is not in the ResourceSlices of DRA driver "
                f"{view.driver} for node {node}",
                WakeKey.inventory(node),
                WakeKey.model(),
            )
        tainted = _untolerated(device, tolerations, view)
        if tainted:
            return _wait(
                Reason.DEVICE_TAINTED,
                f"{where}: device {uuid} ({device.pool}/{device.name}) on node {node} is "
                f"tainted {tainted}; the slot's tolerations do not tolerate it",
                WakeKey.inventory(node),
                WakeKey.model(),
            )
        devices.append(device)
    return devices


def _busy(
    where: str,
    claim: ClaimState,
    node: NodeName,
    devices: Iterable[DraDevice],
    slots: GpuHolders,
    view: DraView,
) -> Status | None:
    """Whether another claim's allocation keeps one of `devices` from `claim`. Every allocation
    holds its devices, whoever wrote it (the binder, kube-scheduler, a driver's controller): the
    binder never gives a device to a second claim. The one exception is a claim generated for a
    pod that the slot cache lets share the GPU (a `shared` map's pod, in the claim's own
    namespace): facts a tenant cannot write (the owner pod, held by a signed binding), never a
    label or an annotation on the claim."""
    for device in devices:
        for other_key in view.allocated.get((view.driver, device.pool, device.name), ()):
            other = view.claims.get(other_key)
            if other is None or other.key == claim.key:
                continue
            if _sharer(other, node, device.uuid, slots):
                continue
            return _wait(
                Reason.DEVICE_BUSY,
                f"{where}: GPU {device.uuid} on node {node} is allocated to "
                f"ResourceClaim {other.namespace}/{other.name}",
                WakeKey.gpu(node, device.uuid),
            )
    return None


def _sharer(claim: ClaimState, node: NodeName, uuid: GpuUuid, slots: GpuHolders) -> bool:
    """Whether `claim` is the claim of a pod that holds the GPU by a shared slot (its owner
    pod, of the claim's namespace, held by the slot cache as sharing the GPU)."""
    owner = claim.owner_uid
    if owner is None or slots.gpu_holders(node, uuid).get(owner) is not Sharing.SHARED:
        return False
    held = slots.holding(owner)
    return held is not None and held.pod.partition("/")[0] == claim.namespace


@dataclass(frozen=True, slots=True)
class HeldTwice:
    """A device that the allocations of two or more claims name, where they may not share it."""

    node: NodeName
    uuid: GpuUuid
    device: DeviceId
    claims: tuple[ClaimState, ...]  # sorted by namespace and name

    def describe(self) -> str:
        names = ", ".join(f"{c.namespace}/{c.name}" for c in self.claims)
        return (
            f"GPU {self.uuid} on node {self.node} ({self.device[1]}/{self.device[2]}) is "
            f"allocated to {len(self.claims)} ResourceClaims: {names}; one device, one owner: "
            "delete the pods of all but one of them"
        )


def held_twice(
    devices: Iterable[DeviceId],
    by_id: Mapping[DeviceId, DraDevice],
    view: DraView,
    slots: GpuHolders,
) -> list[HeldTwice]:
    """Which of `devices` the allocations of more than one claim name, the claims of pods that
    share the GPU by a shared slot counting as one holder: what the binder reports as
    `GPUHeldTwice`. A device no slice publishes any more is named by its pool and name."""
    found: list[HeldTwice] = []
    for device_id in sorted(devices):
        keys = view.allocated.get(device_id, ())
        if len(keys) < 2:
            continue
        claims = sorted(
            (c for k in keys if (c := view.claims.get(k)) is not None), key=lambda c: c.key
        )
        device = by_id.get(device_id)
        node = device.node if device is not None else NodeName(device_id[1])
        uuid = device.uuid if device is not None else GpuUuid(device_id[2])
        owners = [c for c in claims if not _sharer(c, node, uuid, slots)]
        if len(owners) + (len(claims) > len(owners)) < 2:
            continue
        found.append(HeldTwice(node, uuid, device_id, tuple(claims)))
    return found


def _untolerated(device: DraDevice, tolerations: tuple[Toleration, ...], view: DraView) -> str:
    """The taints that keep the device from the slot, as `key=value:Effect (where)`."""
    found = device_taints(device, view.rules, view.driver)
    blocking = set(untolerated((t for t, _ in found), tolerations))
    return ", ".join(f"{t.describe()} ({src})" for t, src in found if t in blocking)
