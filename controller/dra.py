"""The binder's DRA side: watch-fed caches of ResourceSlices and ResourceClaims, the allocation
check over them (the decision is `placement.draalloc.plan_claim`), and the claim writes (Reserve
before the Binding, Unreserve when the Binding fails).

Contract: `DraTracker` is written by the informer threads (`on_slice`, `on_claim`,
`on_taint_rule`) and read by the binder's decision thread (`check`) and the inventory tracker
(`taints_on`); one lock guards its maps. It calls `on_taints` (outside the lock, on the informer
thread: it adds a key to the taints queue) with each node whose devices' taints changed. It
hands every claim generated from gpuplace's template that lacks the delete-protection finalizer
to the `ClaimFinalizers` attached to it (the leader's binder), which writes the finalizer off the
Binding path. `ClaimWriter` only writes or builds the writes the binder sends (`prepare` on the
binder's side threads, the status write from its request loop); what it wrote comes back through
the claims informer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable

from controller.claimfinalizers import ClaimFinalizers, add_finalizer, needs_protection
from kubeio.client import Kube, Obj, obj_key
from kubeio.errors import APIConflictError, APIError, APINotFoundError
from kubeio.informer import DELETED
from kubeio.paths import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from kubeio.pod import Pod
from kubeio.requests import Request, prepare
from placement.binding import Placement, SlotView, Status
from placement.dra import (
    DELETE_PROTECTION,
    POD_CLAIM_NAME,
    ClaimState,
    DraDevice,
    DraSettings,
    allocation_status,
    claim_template,
    read_claim,
    slice_devices,
    template_matches,
    template_name,
)
from placement.draalloc import (
    ClaimPlan,
    DeviceId,
    DraView,
    GpuHolders,
    HeldTwice,
    device_taints,
    held_twice,
    plan_claim,
)
from placement.grants import GrantView
from placement.inventory import NodeInventory, SourcedTaint
from placement.taints import DeviceTaint, TaintRule, Toleration, read_taint_rule
from placement.types import GpuUuid, MapKey, NodeName
from placement.wake import WakeKey

log = logging.getLogger(__name__)


class DraTracker:
    def __init__(
        self,
        settings: DraSettings,
        wake: Callable[[Iterable[WakeKey]], None],
        on_taints: Callable[[NodeName], None] = lambda _node: None,
    ) -> None:
        self.settings = settings
        self._wake = wake
        self._lock = threading.Lock()
        self._slices: dict[NodeName, dict[str, Obj]] = defaultdict(dict)
        self._devices: dict[NodeName, dict[GpuUuid, DraDevice]] = {}
        self._by_id: dict[DeviceId, DraDevice] = {}
        self._claims: dict[tuple[str, str], ClaimState] = {}
        self._allocated: dict[DeviceId, set[tuple[str, str]]] = defaultdict(set)
        #: The devices that more than one claim's allocation names (normally none).
        self._doubled: set[DeviceId] = set()
        #: Claims generated from gpuplace's templates that lack the delete-protection finalizer.
        self._unprotected: dict[tuple[str, str], ClaimState] = {}
        self._finalizers: ClaimFinalizers | None = None
        #: DeviceTaintRules by name (empty where the API is not served).
        self._rules: dict[str, TaintRule] = {}
        #: Told of each node whose devices' taints (slices' or rules') changed.
        self.on_taints = on_taints

    def attach(self, finalizers: ClaimFinalizers | None) -> None:
        """Hands claims that need the finalizer to `finalizers` from now on (None: no more)."""
        self._finalizers = finalizers

    # -- feeding (informer threads) -------------------------------------------------------------
    def on_slice(self, event: str, obj: Obj, _old: Obj | None) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        if not node:
            return
        name = NodeName(str(node))
        with self._lock:
            before = self._node_taints(name)
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
            retainted = self._node_taints(name) != before
        if retainted:
            self.on_taints(name)
        self._wake([WakeKey.inventory(name)])

    def on_taint_rule(self, event: str, obj: Obj, _old: Obj | None) -> None:
        """A DeviceTaintRule changed: devices it selects (or selected) may serve slots now, or no
        longer; every node with published devices is woken, rules being few and rare."""
        name = obj_key(obj)[1]
        rule = None if event == DELETED else read_taint_rule(obj)
        with self._lock:
            nodes = list(self._devices)
            before = {n: self._node_taints(n) for n in nodes}
            if rule is None:
                self._rules.pop(name, None)
            else:
                self._rules[name] = rule
            retainted = [n for n in nodes if self._node_taints(n) != before[n]]
        for node in retainted:
            self.on_taints(node)
        self._wake([WakeKey.inventory(n) for n in nodes])

    def _taints_of(self, device: DraDevice) -> list[tuple[DeviceTaint, str]]:
        """The device's taints and where each comes from (its slice, or a rule); under the lock."""
        return device_taints(device, self._rules, self.settings.driver)

    def _node_taints(self, node: NodeName) -> dict[str, tuple[SourcedTaint, ...]]:
        """The taints of the node's published devices, by GPU or MIG UUID; under the lock."""
        out: dict[str, tuple[SourcedTaint, ...]] = {}
        for uuid, device in self._devices.get(node, {}).items():
            found = self._taints_of(device)
            if found:
                out[uuid] = tuple(SourcedTaint(t, src) for t, src in found)
        return out

    def taints_on(self, node: NodeName) -> dict[str, tuple[SourcedTaint, ...]]:
        """The taints of the devices the node's ResourceSlices publish (by GPU or MIG UUID),
        from the slices and the DeviceTaintRules; devices without taints are left out."""
        with self._lock:
            return self._node_taints(node)

    def on_claim(self, event: str, obj: Obj, _old: Obj | None) -> None:
        claim = read_claim(obj)
        keys: set[WakeKey] = set()
        with self._lock:
            before = self._claims.pop(claim.key, None)
            if before is not None:
                keys |= self._forget_allocation(before)
            self._unprotected.pop(claim.key, None)
            if event != DELETED:
                self._claims[claim.key] = claim
                for device_id in claim.allocated:
                    self._allocated[device_id].add(claim.key)
                    if len(self._allocated[device_id]) > 1:
                        self._doubled.add(device_id)
                        # The binder's wake is where a device in two claims is reported.
                        device = self._by_id.get(device_id)
                        if device is not None:
                            keys.add(WakeKey.gpu(device.node, device.uuid))
                if needs_protection(claim) and claim.templated:
                    self._unprotected[claim.key] = claim
        finalizers = self._finalizers
        if finalizers is not None:
            if event == DELETED:
                finalizers.gone(claim.key)
            elif claim.key in self._unprotected:
                finalizers.want(claim)
        if claim.owner_uid:
            keys.add(WakeKey.claim(claim.owner_uid))
        self._wake(keys)

    def _forget_allocation(self, claim: ClaimState) -> set[WakeKey]:
        """Takes the claim's allocation out of the index (under the lock); the GPUs to wake."""
        keys: set[WakeKey] = set()
        for device_id in claim.allocated:
            holders = self._allocated.get(device_id)
            if holders is not None:
                holders.discard(claim.key)
                if len(holders) < 2:
                    self._doubled.discard(device_id)
                if not holders:
                    del self._allocated[device_id]
            device = self._by_id.get(device_id)
            if device is not None:
                keys.add(WakeKey.gpu(device.node, device.uuid))
        return keys

    # -- reading --------------------------------------------------------------------------------
    def devices_of(self, node: NodeName) -> dict[GpuUuid, DraDevice]:
        with self._lock:
            return dict(self._devices.get(node, {}))

    def claims(self) -> list[ClaimState]:
        with self._lock:
            return list(self._claims.values())

    def claim(self, key: tuple[str, str]) -> ClaimState | None:
        with self._lock:
            return self._claims.get(key)

    def held_twice(self, slots: GpuHolders) -> list[HeldTwice]:
        """The devices the allocations of more than one claim name (`placement.draalloc.
        held_twice`): cheap when there are none, as there normally are."""
        with self._lock:
            if not self._doubled:
                return []
            view = DraView(
                self.settings.driver, self._devices, self._claims, self._allocated, self._rules
            )
            return held_twice(self._doubled, self._by_id, view, slots)

    def unprotected(self) -> list[ClaimState]:
        """Claims generated from gpuplace's templates that lack the finalizer."""
        with self._lock:
            return list(self._unprotected.values())

    def unprotected_claim_of(self, pod: Pod) -> ClaimState | None:
        """The pod's generated claim, when it is one of `unprotected`."""
        name = pod.generated_claim(POD_CLAIM_NAME)
        if name is None:
            return None
        with self._lock:
            return self._unprotected.get((pod.namespace, name))

    def check(
        self,
        pod: Pod,
        placement: Placement,
        slots: SlotView,
        tolerations: tuple[Toleration, ...] = (),
        grants: GrantView | None = None,
        inventory: NodeInventory | None = None,
    ) -> ClaimPlan | Status:
        """Whether the pod's claim can get the placement's devices, and how, the gate's
        judgement on `grants` included (`placement.draalloc.plan_claim`, over what the watches
        hold now)."""
        with self._lock:
            view = DraView(
                self.settings.driver, self._devices, self._claims, self._allocated, self._rules
            )
            return plan_claim(pod, placement, slots, view, tolerations, grants, inventory)


class ClaimWriter:
    """Reserve and Unreserve, in kube-scheduler's terms, for the claims gpuplace allocates."""

    def __init__(
        self, kube: Kube, settings: DraSettings, finalizers: ClaimFinalizers | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.finalizers = finalizers

    def _path(self, claim: ClaimState, subresource: str = "") -> str:
        return RESOURCE_CLAIMS.item(claim.name, claim.namespace, subresource)

    def prepare(self, plan: ClaimPlan) -> str:
        """The writes a Reserve needs before the claim's status, blocking: an allocation made
        otherwise cleared (a map changed during a failover), then the delete-protection finalizer
        when the claim lacks it (`ClaimFinalizers` normally added it when the claim was first
        seen). Returns the resourceVersion the status write must carry.

        Every write carries the resourceVersion it was planned from, so a claim that changed in
        between (deleted and regenerated, or deallocated by kube-controller-manager) fails with a
        conflict instead of being overwritten; raises the APIError.
        """
        claim, path = plan.claim, self._path(plan.claim)
        version = claim.resource_version
        if claim.allocated:
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
            if self.finalizers is not None:
                version = self.finalizers.protect(claim, version)
            else:
                version = add_finalizer(self.kube, claim, version)
        return version

    def status_request(self, plan: ClaimPlan, pod: Pod, version: str) -> Request:
        """Reserve proper: the claim allocated to the plan's devices and reserved for the pod, as
        of `version` (sent from the binder's request loop, right before the Binding)."""
        status = allocation_status(
            plan.devices, plan.node, pod.name, pod.uid, self.settings.driver, plan.tolerations
        )
        body = {"metadata": {"resourceVersion": version}, "status": status}
        return prepare("PATCH", self._path(plan.claim, "status"), body=body)

    def reserve_request(self, plan: ClaimPlan, pod: Pod) -> Request | None:
        """Reserve as the one request it normally is (the claim unallocated and protected by its
        finalizer already); None when `prepare` has writes to make first (or, `plan.done`, when
        there is nothing to write)."""
        claim = plan.claim
        if plan.done or claim.allocated or DELETE_PROTECTION not in claim.finalizers:
            return None
        return self.status_request(plan, pod, claim.resource_version)

    def unreserve(self, plan: ClaimPlan) -> None:
        """Undoes `reserve` after a failed Binding; idempotent, a claim already gone is fine."""
        with contextlib.suppress(APINotFoundError):
            self.kube.patch(
                self._path(plan.claim, "status"),
                {"status": {"allocation": None, "reservedFor": None}},
            )


class TemplateKeeper:
    """Keeps one ResourceClaimTemplate per map of the model in the map's namespace (leader only,
    on the templates queue's worker, when the model changes); `current` is the templates informer's store.
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
