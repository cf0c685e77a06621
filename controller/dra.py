"""The binder's DRA side: watch-fed caches of ResourceSlices and ResourceClaims, the allocation
check, and the claim writes (Reserve before the Binding, Unreserve when the Binding fails).

Contract: `DraTracker` is written by the informer threads (`on_slice`, `on_claim`) and read by the
binder's decision thread (`check`); one lock guards its maps. `ClaimWriter` runs on the bind
workers and only writes; what it wrote comes back through the claims informer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubeio.client import Kube, Obj, obj_key
from kubeio.errors import APIConflictError, APIError, APINotFoundError
from kubeio.informer import DELETED
from kubeio.paths import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES
from kubeio.pod import Pod
from placement.binding import Code, Placement, SlotView, Status
from placement.dra import (
    DELETE_PROTECTION,
    POD_CLAIM_NAME,
    TEMPLATE_LABEL,
    ClaimState,
    DraDevice,
    DraSettings,
    allocation_matches,
    allocation_status,
    claim_template,
    read_claim,
    slice_devices,
    template_matches,
    template_name,
)
from placement.reasons import Reason
from placement.types import GpuUuid, MapKey, NodeName
from placement.wake import WakeKey

log = logging.getLogger(__name__)
CLAIMS_PATH = RESOURCE_CLAIMS.collection()
SLICES_PATH = RESOURCE_SLICES.collection()
TEMPLATES_PATH = RESOURCE_CLAIM_TEMPLATES.collection()
TEMPLATE_SELECTOR = f"{TEMPLATE_LABEL}=true"
DeviceId = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The allocation a pod's claim gets before its Binding."""

    claim: ClaimState
    node: NodeName
    devices: tuple[DraDevice, ...]
    done: bool  # already allocated exactly so and reserved for the pod (a failover)


def _wait(reason: Reason, message: str, *keys: WakeKey) -> Status:
    return Status(Code.UNSCHEDULABLE, reason, message, frozenset(keys))


class DraTracker:
    def __init__(self, settings: DraSettings, wake: Callable[[Iterable[WakeKey]], None]) -> None:
        self.settings = settings
        self._wake = wake
        self._lock = threading.Lock()
        self._slices: dict[NodeName, dict[str, Obj]] = defaultdict(dict)
        self._devices: dict[NodeName, dict[GpuUuid, DraDevice]] = {}
        self._by_id: dict[DeviceId, DraDevice] = {}
        self._claims: dict[tuple[str, str], ClaimState] = {}
        self._allocated: dict[DeviceId, set[tuple[str, str]]] = defaultdict(set)

    # -- feeding (informer threads) -------------------------------------------------------------
    def on_slice(self, event: str, obj: Obj, _old: Obj | None) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        if not node:
            return
        name = NodeName(str(node))
        with self._lock:
            if event == DELETED:
                self._slices[name].pop(obj_key(obj)[1], None)
            else:
                self._slices[name][obj_key(obj)[1]] = obj
            for device in self._devices.pop(name, {}).values():
                self._by_id.pop((self.settings.driver, device.pool, device.name), None)
            devices = slice_devices(self._slices[name].values(), self.settings)
            self._devices[name] = {d.uuid: d for d in devices if d.node == name}
            for device in self._devices[name].values():
                self._by_id[(self.settings.driver, device.pool, device.name)] = device
        self._wake([WakeKey.inventory(name)])

    def on_claim(self, event: str, obj: Obj, _old: Obj | None) -> None:
        claim = read_claim(obj)
        keys: set[WakeKey] = set()
        with self._lock:
            before = self._claims.pop(claim.key, None)
            if before is not None:
                for device_id in before.allocated:
                    holders = self._allocated.get(device_id)
                    if holders is not None:
                        holders.discard(claim.key)
                        if not holders:
                            del self._allocated[device_id]
                    device = self._by_id.get(device_id)
                    if device is not None:
                        keys.add(WakeKey.gpu(device.node, device.uuid))
            if event != DELETED:
                self._claims[claim.key] = claim
                for device_id in claim.allocated:
                    self._allocated[device_id].add(claim.key)
        if claim.owner_uid:
            keys.add(WakeKey.claim(claim.owner_uid))
        self._wake(keys)

    # -- reading --------------------------------------------------------------------------------
    def devices_of(self, node: NodeName) -> dict[GpuUuid, DraDevice]:
        with self._lock:
            return dict(self._devices.get(node, {}))

    def claims(self) -> list[ClaimState]:
        with self._lock:
            return list(self._claims.values())

    def check(self, pod: Pod, placement: Placement, slots: SlotView) -> ClaimPlan | Status:
        """Whether the pod's claim can get the placement's devices, and how."""
        decision = placement.decision
        node, uid = decision.node, pod.uid
        where = f"map {placement.slot.map} index {placement.slot.index}"
        driver = self.settings.driver
        if not decision.devices:
            return _wait(
                Reason.DEVICE_MISSING,
                f"{where}: the UUIDs of its devices on node {node} are unknown (DRA allocation "
                "names devices by UUID; the GPU agent's inventory resolves NVML indices)",
                WakeKey.inventory(node),
                WakeKey.model(),
            )
        with self._lock:
            published = self._devices.get(node, {})
            devices: list[DraDevice] = []
            for uuid in decision.devices:
                device = published.get(uuid)
                if device is None:
                    return _wait(
                        Reason.DEVICE_MISSING,
                        f"{where}: device {uuid} is not in the ResourceSlices of DRA driver "
                        f"{driver} for node {node}",
                        WakeKey.inventory(node),
                        WakeKey.model(),
                    )
                devices.append(device)
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
            claim = self._claims.get((pod.namespace, claim_name or ""))
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
            for device in devices:
                sharers = slots.gpu_holders(node, device.uuid)
                for other_key in self._allocated.get((driver, device.pool, device.name), ()):
                    other = self._claims.get(other_key)
                    if other is None or other.key == claim.key:
                        continue
                    if other.owner_uid is not None and other.owner_uid in sharers:
                        continue  # a pod the slot cache lets share it (a `shared` map)
                    return _wait(
                        Reason.DEVICE_BUSY,
                        f"{where}: GPU {device.uuid} on node {node} is allocated to "
                        f"ResourceClaim {other.namespace}/{other.name}",
                        WakeKey.gpu(node, device.uuid),
                    )
        done = bool(claim.allocated) and (
            allocation_matches(claim, devices, node, driver) and uid in claim.reserved_for
        )
        return ClaimPlan(claim, node, tuple(devices), done)


class ClaimWriter:
    """Reserve and Unreserve, in kube-scheduler's terms, for the claims gpuplace allocates."""

    def __init__(self, kube: Kube, settings: DraSettings) -> None:
        self.kube = kube
        self.settings = settings

    def _path(self, claim: ClaimState, subresource: str = "") -> str:
        return RESOURCE_CLAIMS.item(claim.name, claim.namespace, subresource)

    def reserve(self, plan: ClaimPlan, pod: Pod) -> None:
        """Allocates the claim to the plan's devices and reserves it for the pod.

        Every write carries the resourceVersion it was planned from, so a claim that changed in
        between (deleted and regenerated, or deallocated by kube-controller-manager) fails with a
        conflict instead of being overwritten; raises the APIError.
        """
        if plan.done:
            return
        claim, path = plan.claim, self._path(plan.claim)
        version = claim.resource_version
        if claim.allocated:  # allocated otherwise (a map changed during a failover): start over
            cleared = self.kube.patch(
                f"{path}/status",
                {
                    "metadata": {"resourceVersion": version},
                    "status": {"allocation": None, "reservedFor": None},
                },
            )
            version = cleared["metadata"]["resourceVersion"]
        if DELETE_PROTECTION not in claim.finalizers:
            # As kube-scheduler does: kube-controller-manager deallocates the claim and removes
            # the finalizer once the pod is done or gone, and the claim cannot vanish before.
            protected = self.kube.patch(
                path,
                {
                    "metadata": {
                        "resourceVersion": version,
                        "finalizers": [*claim.finalizers, DELETE_PROTECTION],
                    }
                },
            )
            version = protected["metadata"]["resourceVersion"]
        status = allocation_status(plan.devices, plan.node, pod.name, pod.uid, self.settings.driver)
        self.kube.patch(
            self._path(plan.claim, "status"),
            {"metadata": {"resourceVersion": version}, "status": status},
        )

    def unreserve(self, plan: ClaimPlan) -> None:
        """Undoes `reserve` after a failed Binding; idempotent, a claim already gone is fine."""
        with contextlib.suppress(APINotFoundError):
            self.kube.patch(
                self._path(plan.claim, "status"),
                {"status": {"allocation": None, "reservedFor": None}},
            )


class TemplateKeeper:
    """Keeps one ResourceClaimTemplate per map of the model in the map's namespace (leader only,
    on the reconcile thread, when the model changes); `current` is the templates informer's store.
    """

    def __init__(self, kube: Kube, settings: DraSettings) -> None:
        self.kube = kube
        self.settings = settings

    def sync(self, maps: Iterable[MapKey], current: dict[tuple[str, str], Obj]) -> None:
        wanted = {
            (key.namespace, template_name(key.name)): claim_template(key, self.settings)
            for key in maps
            if not key.name.startswith("legacy.")
        }
        for (namespace, name), body in wanted.items():
            have = current.get((namespace, name))
            path = RESOURCE_CLAIM_TEMPLATES.collection(namespace)
            try:
                if have is None:
                    try:
                        self.kube.create(path, body)
                    except APIConflictError:
                        # One of that name without our labels (made by someone else): ours wins.
                        self.kube.delete(RESOURCE_CLAIM_TEMPLATES.item(name, namespace))
                        self.kube.create(path, body)
                elif not template_matches(have, body):
                    # A template's spec is immutable: replace it; claims already generated keep
                    # theirs, and the binder's allocation decides their devices anyway.
                    self.kube.delete(RESOURCE_CLAIM_TEMPLATES.item(name, namespace))
                    self.kube.create(path, body)
            except APIError as exc:
                log.warning("ResourceClaimTemplate %s/%s not written: %s", namespace, name, exc)
        for namespace, name in set(current) - set(wanted):
            path = RESOURCE_CLAIM_TEMPLATES.item(name, namespace)
            try:
                self.kube.delete(path)
            except APINotFoundError:
                pass
            except APIError as exc:
                log.warning("ResourceClaimTemplate %s/%s not deleted: %s", namespace, name, exc)
