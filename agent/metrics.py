"""The agent's Prometheus metrics (prefix gpuplace_agent_), on a registry owned by the process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from placement.inventory import DeviceCheck, NodeInventory


@dataclass
class AgentMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.devices = Gauge(
            "gpuplace_agent_devices", "GPUs on this node by health", ["health"], registry=r
        )
        self.checks = Gauge(
            "gpuplace_agent_checks",
            "Model entries targeting this node by check result",
            ["result"],
            registry=r,
        )
        self.publishes = Counter(
            "gpuplace_agent_publishes",
            "Writes of the node's inventory ConfigMap, by key",
            ["key"],
            registry=r,
        )
        self.lease_renewals = Counter(
            "gpuplace_agent_lease_renewals",
            "Heartbeat Lease renewals by result",
            ["result"],
            registry=r,
        )
        self.nvml_errors = Counter(
            "gpuplace_agent_nvml_errors", "Snapshots that failed because NVML failed", registry=r
        )
        self.api_errors = Counter(
            "gpuplace_agent_api_errors",
            "Failed requests to the apiserver, by operation",
            ["operation"],
            registry=r,
        )
        self.model_generation = Gauge(
            "gpuplace_agent_model_generation", "Generation of the model last checked", registry=r
        )
        for health in ("healthy", "unhealthy"):
            self.devices.labels(health).set(0)
        for result in ("ok", "failed"):
            self.checks.labels(result).set(0)

    def observe_inventory(self, inventory: NodeInventory) -> None:
        healthy = sum(1 for d in inventory.devices if d.healthy)
        self.devices.labels("healthy").set(healthy)
        self.devices.labels("unhealthy").set(len(inventory.devices) - healthy)

    def observe_checks(self, checks: Sequence[DeviceCheck]) -> None:
        ok = sum(1 for c in checks if c.ok)
        self.checks.labels("ok").set(ok)
        self.checks.labels("failed").set(len(checks) - ok)
