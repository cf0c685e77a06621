"""What a placement bench writes to its cluster before the contenders run: kube-scheduler's
exemption from API Priority and Fairness, every node's inventory and Lease, the placement maps;
and the readings it waits on (the pod webhook registered, the maps' phases, etcd's size)."""

from __future__ import annotations

import json

from bench._kube import Obj, call, concurrently, expect, metrics
from bench._stats import counter_totals
from bench._workload import NAMESPACE, SETUP_THREADS, Scale, inventory, map_name, map_yaml
from gpuplace_dev.localcluster import LocalCluster
from kubeio import bodies
from kubeio.paths import CONFIGMAPS, FLOW_SCHEMAS, LEASES, MUTATING_WEBHOOKS
from kubeio.times import now_micro
from placement.annotations import PLACEMENT_KEY, PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE
from webhook.manifests import POD_WEBHOOK


def scheduler_exemption() -> Obj:
    """The FlowSchema that puts kube-scheduler's requests in API Priority and Fairness' exempt
    level, where the admin user of gpuplace's controller and of the ceiling client already is:
    otherwise its bindings and events queue behind the workload-high level's share of the
    apiserver and the comparison measures APF, not the scheduler."""
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": "bench-kube-scheduler-exempt"},
        "spec": {
            # Below the built-in kube-scheduler FlowSchema's precedence (800): matched first.
            "matchingPrecedence": 100,
            "priorityLevelConfiguration": {"name": "exempt"},
            "rules": [
                {
                    "subjects": [{"kind": "User", "user": {"name": "system:kube-scheduler"}}],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "namespaces": ["*"],
                            "clusterScope": True,
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


def exempt_scheduler(cluster: LocalCluster) -> None:
    body = scheduler_exemption()
    call(cluster, "POST", FLOW_SCHEMAS.collection(), body, wanted={201}, what="FlowSchema")


def publish_inventories(cluster: LocalCluster, scale: Scale, lease_seconds: int) -> None:
    """What every node's agent writes: its inventory ConfigMap and its liveness Lease."""
    ns = INVENTORY_NAMESPACE
    now = now_micro()

    def publish(n: int) -> None:
        inv = inventory(n, scale.gpus)
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": inv.node, "namespace": ns},
            "data": {INVENTORY_KEY: inv.to_json()},
        }
        call(cluster, "POST", CONFIGMAPS.collection(ns), configmap, wanted={201})
        # Agents renew every interval; here nothing renews, so the lease lasts the bench.
        spec = bodies.lease_spec(f"agent-{inv.node}", lease_seconds, now, now, 0)
        lease = bodies.lease(inv.node, ns, spec)
        call(cluster, "POST", LEASES.collection(ns), lease, wanted={201})

    concurrently(list(range(scale.nodes)), publish, SETUP_THREADS)


def apply_maps(cluster: LocalCluster, scale: Scale) -> None:
    """Every placement map, as the ConfigMap a user applies."""

    def apply(m: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": map_name(m),
                "namespace": NAMESPACE,
                "labels": {PLACEMENT_MAP_LABEL: "true"},
            },
            "data": {PLACEMENT_KEY: map_yaml(scale, m)},
        }
        call(cluster, "POST", CONFIGMAPS.collection(NAMESPACE), body, wanted={201})

    concurrently(list(range(scale.maps)), apply, SETUP_THREADS)


def pod_webhook_registered(cluster: LocalCluster) -> bool:
    status, body = cluster.request("GET", f"{MUTATING_WEBHOOKS.collection()}?limit=10")
    return status == 200 and any(
        w.get("name") == POD_WEBHOOK for c in body["items"] for w in c.get("webhooks") or []
    )


def map_phases(cluster: LocalCluster) -> list[str | None] | None:
    """The phase of every placement map as its status annotation says (None: no status yet),
    or None if they could not be listed."""
    path = f"{CONFIGMAPS.collection(NAMESPACE)}?labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
    status, body = cluster.request("GET", path)
    if status != 200:
        return None
    phases = []
    for item in body["items"]:
        text = (item["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
        phases.append(json.loads(text).get("phase") if text else None)
    return phases


def storage(cluster: LocalCluster) -> str:
    """What etcd holds: its database file (as the apiserver reports it), its revision (every
    write since the cluster started; every 5 minutes the apiserver compacts the history up to
    the revision of its tick before) and the Events kept (each lives an hour)."""
    metric = "apiserver_storage_size_bytes"
    size = sum(counter_totals(metrics(cluster.kube), metric, ()).values())
    status, body = cluster.request("GET", "/api/v1/events?limit=1")
    expect(status, body, (200,), "listing events")
    meta = body.get("metadata") or {}
    events = len(body.get("items") or []) + int(meta.get("remainingItemCount") or 0)
    return (
        f"etcd's database {size / 2**20:,.0f} MiB at revision {int(meta['resourceVersion']):,}; "
        f"{events:,} events stored"
    )
