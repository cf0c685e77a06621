"""The long-running agent: probe, check, publish when changed, renew the heartbeat.

One loop on one thread. A cycle runs every interval (probe, publish, renew the Lease) and early
when NVML reports a health event, when the model changes, or when someone else changed the
inventory ConfigMap; an early cycle publishes but leaves the Lease on its schedule.

The Lease is renewed only while the published inventory is known to be current: when NVML cannot
enumerate the GPUs, or the ConfigMap could not be written, the agent lets the Lease run out, so
the controller stops binding to devices it can no longer vouch for.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from agent.checks import check_node
from agent.heartbeat import Heartbeat
from agent.metrics import AgentMetrics
from agent.modelwatch import ModelWatch
from agent.podresources import PodResourcesError, list_pod_resources
from agent.probe import GpuProbe, ProbeError
from agent.publisher import InventoryPublisher, checks_json
from agent.settings import MISSED_RENEWALS, AgentSettings
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.informer import Informer
from placement.inventory import CHECKS_KEY, INVENTORY_KEY, DeviceCheck, NodeInventory
from placement.model import CompiledMap
from placement.podresources import POD_RESOURCES_KEY

log = logging.getLogger(__name__)

#: Longest single wait on NVML, so that a stop request or a model change is seen promptly.
_SLICE_SECONDS = 0.5
#: How long `run_once` waits for the model before publishing without checks.
_ONCE_MODEL_WAIT_SECONDS = 10.0
#: How long the first cycle waits for the watches to list.
_FIRST_SYNC_WAIT_SECONDS = 5.0


class Agent:
    def __init__(
        self,
        kube: Kube,
        probe: GpuProbe,
        settings: AgentSettings,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.probe = probe
        self.settings = settings
        self.metrics = metrics or AgentMetrics()
        node = settings.node
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.publisher = InventoryPublisher(
            kube, settings.inventory_namespace, node, wake=self._wake.set
        )
        self.heartbeat = Heartbeat(
            kube,
            settings.inventory_namespace,
            node,
            settings.identity or f"gpuplace-agent-{node}",
            settings.lease_duration_seconds,
        )
        self.model = ModelWatch(kube, settings.model_namespace, node, on_change=self._wake.set)
        self.own = Informer(
            kube,
            self.publisher.collection,
            field_selector=f"metadata.name={node}",
            name="inventory",
        )
        self.own.add_handler(self.publisher.on_event)
        self._last_cycle = time.monotonic()
        self._last_renewal: float | None = None
        self._nvml_failures = 0
        self._inventory: NodeInventory | None = None
        self._checks: tuple[DeviceCheck, ...] = ()
        self._checked: tuple[NodeInventory, tuple[CompiledMap, ...]] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start_watches(self) -> None:
        self.own.start()
        self.model.start()

    def stop(self) -> None:
        """Ends `run` after the current step (safe from a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        self.own.stop()
        self.model.stop()

    def run(self) -> None:
        """Blocks until `stop()`."""
        self.start_watches()
        interval = self.settings.interval_seconds
        # The first cycle then knows the server's copy and the model: one write, not two.
        for informer in (self.own, self.model.informer):
            informer.wait_synced(min(interval, _FIRST_SYNC_WAIT_SECONDS))
        next_renewal = time.monotonic()
        log.info(
            "agent for node %s publishing every %gs (Lease %ds) to namespace %s",
            self.settings.node,
            interval,
            self.settings.lease_duration_seconds,
            self.settings.inventory_namespace,
        )
        while not self._stop.is_set():
            started = time.monotonic()
            renew = started >= next_renewal
            self.cycle(renew=renew)
            if renew:
                next_renewal = started + interval
            self._wait_until(next_renewal)

    def run_once(self) -> bool:
        """One cycle with a renewal; True when the inventory was published and the Lease renewed."""
        self.start_watches()
        try:
            self.model.informer.wait_synced(_ONCE_MODEL_WAIT_SECONDS)
            return self.cycle(renew=True)
        finally:
            self.close()

    def healthy(self) -> bool:
        """False when the loop is stuck or NVML keeps failing: a restart may help then."""
        stuck_after = max(MISSED_RENEWALS * self.settings.interval_seconds, 60.0)
        return (
            time.monotonic() - self._last_cycle < stuck_after
            and self._nvml_failures < MISSED_RENEWALS
        )

    def is_ready(self) -> bool:
        """Publishing: the Lease was renewed within its duration."""
        last = self._last_renewal
        return last is not None and (time.monotonic() - last < self.settings.lease_duration_seconds)

    # -- one cycle --------------------------------------------------------------------------------
    def cycle(self, *, renew: bool) -> bool:
        """Probes, publishes what changed and, if `renew`, renews the Lease. True when the
        inventory on the server is current (and the Lease renewed if asked)."""
        self._last_cycle = time.monotonic()
        inventory = self._probe()
        if inventory is None:
            return False
        data = {INVENTORY_KEY: inventory.to_json()}
        pod_resources = self._pod_resources()
        if pod_resources is not None:
            data[POD_RESOURCES_KEY] = pod_resources
        maps = self.model.maps()
        if maps is not None:
            data[CHECKS_KEY] = checks_json(self._check(inventory, maps))
        try:
            written = self.publisher.publish(data)
        except APIError as exc:
            self.metrics.api_errors.labels("publish").inc()
            log.warning("cannot publish the inventory of node %s: %s", self.settings.node, exc)
            return False
        for key in written:
            self.metrics.publishes.labels(key).inc()
        if written:
            log.info("published %s for node %s", ", ".join(written), self.settings.node)
        if not renew:
            return True
        try:
            self.heartbeat.renew()
        except APIError as exc:
            self.metrics.api_errors.labels("renew").inc()
            self.metrics.lease_renewals.labels("failed").inc()
            log.warning("cannot renew the Lease of node %s: %s", self.settings.node, exc)
            return False
        self.metrics.lease_renewals.labels("ok").inc()
        self._last_renewal = time.monotonic()
        return True

    def _pod_resources(self) -> str | None:
        """What the kubelet says each pod holds, as published; None where there is no socket
        (the key then keeps what was last published) or it does not answer."""
        socket = self.settings.pod_resources_socket
        if not socket or not os.path.exists(socket):
            return None
        try:
            return list_pod_resources(socket, self.settings.node).to_json()
        except PodResourcesError as exc:
            log.warning("cannot read the kubelet's pod resources: %s", exc)
            return None

    def _probe(self) -> NodeInventory | None:
        try:
            inventory = self.probe.snapshot(self.settings.node)
        except ProbeError as exc:
            self._nvml_failures += 1
            self.metrics.nvml_errors.inc()
            log.error(
                "cannot read the GPUs of node %s (%d in a row; the Lease is not renewed meanwhile): "
                "%s",
                self.settings.node,
                self._nvml_failures,
                exc,
            )
            return None
        self._nvml_failures = 0
        log_health_changes(self._inventory, inventory)
        self._inventory = inventory
        self.metrics.observe_inventory(inventory)
        return inventory

    def _check(
        self, inventory: NodeInventory, maps: tuple[CompiledMap, ...]
    ) -> tuple[DeviceCheck, ...]:
        # The model can hold 80,000 slots: check again only when the inventory or the maps moved.
        checked = self._checked
        if checked is None or checked[1] is not maps or checked[0] != inventory:
            before = set(self._checks)
            self._checks = check_node(inventory, maps)
            self._checked = (inventory, maps)
            self.metrics.observe_checks(self._checks)
            if self.model.generation is not None:
                self.metrics.model_generation.set(self.model.generation)
            for check in self._checks:
                if not check.ok and check not in before:
                    log.warning(
                        "%s[%d]: %s: %s", check.map, check.index, check.reason, check.message
                    )
        return self._checks

    def _wait_until(self, deadline: float) -> None:
        """Waits for the deadline, a health event, a wake-up (model or ConfigMap) or stop."""
        while not self._stop.is_set():
            if self._wake.is_set():
                self._wake.clear()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self.probe.wait(min(remaining, _SLICE_SECONDS)):
                return


def log_health_changes(before: NodeInventory | None, inventory: NodeInventory) -> None:
    """Logs what changed between two probes of a node's GPUs, each GPU named by its UUID too."""
    if before is None:
        sick = [d for d in inventory.devices if not d.healthy]
        log.info(
            "node %s: %d GPUs, %d unhealthy", inventory.node, len(inventory.devices), len(sick)
        )
        for device in sick:
            log.warning(
                "GPU %d (%s) is unhealthy: %s", device.index, device.uuid, device.health_reason
            )
        return
    # By UUID: NVML renumbers the remaining GPUs when one goes away, so an index names a
    # different GPU before and after.
    for device in inventory.devices:
        old = before.by_uuid.get(device.uuid)
        if old is None:
            log.info("GPU %d (%s) appeared", device.index, device.uuid)
            continue
        if old.index != device.index:
            log.info("GPU %s is now index %d (was %d)", device.uuid, device.index, old.index)
        if old.healthy and not device.healthy:
            log.warning(
                "GPU %d (%s) turned unhealthy: %s", device.index, device.uuid, device.health_reason
            )
        elif device.healthy and not old.healthy:
            log.info("GPU %d (%s) is healthy again", device.index, device.uuid)
    for device in before.devices:
        if device.uuid not in inventory.by_uuid:
            log.warning("GPU %d (%s) disappeared", device.index, device.uuid)
