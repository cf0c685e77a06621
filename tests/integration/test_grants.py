"""Grants, tried as a hostile tenant: a map or legacy pod outside the tenant's grants is refused
at apply time with its location; the granted team is unaffected; revoking a grant stops serving
the map. The real apiserver, controller and webhook processes."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.demo.components import Components
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL, PLACEMENT_MAP_LABEL
from placement.grants import GRANTS_CONFIGMAP, GRANTS_KEY, POLICY_CONFIGMAP, POLICY_KEY, GrantView
from placement.model import MODEL_LABEL, model_data, read_model
from tests.integration.controllerkit import (
    ControllerProcess,
    admitted,
    apply_map,
    create_system_namespaces,
    get_pod,
    inventory_for,
    map_status,
    map_yaml,
    pending_reason,
    publish_inventory,
    solo_controller,
    unique,
    wait_for,
)
from tests.integration.tenantkit import Tenant

pytestmark = pytest.mark.integration
SYSTEM = "gpuplace-system"
CONFIGURATION = "gpuplace-grants-it"


def policy(tenant: str, team: str, pool: str, tenant_nodes: list[str]) -> str:
    return textwrap.dedent(f"""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementPolicy
        metadata:
          name: cluster
        spec:
          grants:
            - namespaces: [{tenant}]
              nodes: [{", ".join(tenant_nodes)}]
            - namespaces: [{team}]
              nodeSelector:
                matchLabels: {{gpuplace-it/pool: {pool}}}
    """)


def put_policy(cluster: LocalCluster, text: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": POLICY_CONFIGMAP, "namespace": SYSTEM},
        "data": {POLICY_KEY: text},
    }
    path = f"/api/v1/namespaces/{SYSTEM}/configmaps"
    status, resp = cluster.request("PUT", f"{path}/{POLICY_CONFIGMAP}", body)
    if status == 404:
        status, resp = cluster.request("POST", path, body)
    assert status in (200, 201), resp


def published_grants(cluster: LocalCluster) -> dict[str, Any]:
    status, body = cluster.request(
        "GET", f"/api/v1/namespaces/{SYSTEM}/configmaps/{GRANTS_CONFIGMAP}"
    )
    return json.loads(body["data"][GRANTS_KEY]) if status == 200 else {}


def stored_grants(cluster: LocalCluster) -> GrantView | None:
    """The grants of the model stored in gpuplace-system, which the webhook serves (None: caught
    half-way through a write)."""
    status, body = cluster.request(
        "GET", f"/api/v1/namespaces/{SYSTEM}/configmaps?labelSelector={MODEL_LABEL}%3Dtrue"
    )
    assert status == 200, body
    try:
        return read_model(model_data(body["items"])).grants
    except ValueError:
        return None


def source_configmap(namespace: str, name: str, text: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {PLACEMENT_MAP_LABEL: "true"},
            },
            "data": {"placement.yaml": text},
        }
    )


def location_of(text: str, needle: str) -> tuple[int, int]:
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number, line.index("index") + 1
    raise AssertionError(needle)


def pod(name: str, **spec: Any) -> dict[str, Any]:
    """A pod; the binder's own pods carry the webhook's wiring, as the binder requires of a
    map's pod (whether or not a webhook runs in the test)."""
    main = (
        admitted("main", "busybox")
        if spec.get("schedulerName") == "gpuplace"
        else {"name": "main", "image": "busybox"}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {}, "annotations": {}},
        "spec": {"containers": [main], **spec},
    }


def unregister(cluster: LocalCluster, configuration: str) -> None:
    """Deletes the webhook's configurations (every labelled object of every namespace goes through
    them, failurePolicy Fail). Called before the webhook stops, so that the apiserver does not
    call it once it is gone while a later test's objects arrive, and again after it stopped: the
    webhook registers once it has read the model, which may have been only then."""
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        cluster.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{configuration}")


@pytest.fixture
def stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[ControllerProcess, Components]]:
    create_system_namespaces(cluster)
    controller = solo_controller(cluster, "grants")
    components = Components(cluster, tmp_path)
    components.webhook("env", f"--configuration-name={CONFIGURATION}")
    try:
        yield controller, components
    finally:
        controller.stop()
        unregister(cluster, CONFIGURATION)
        components.stop()
        unregister(cluster, CONFIGURATION)
        cluster.request("DELETE", f"/api/v1/namespaces/{SYSTEM}/configmaps/{POLICY_CONFIGMAP}")
        print(controller.log()[-3000:])
        for component in components.items:
            print(component.log_tail(30))


def test_tenant_outside_its_grants_is_refused_at_apply_and_the_granted_team_is_not(
    cluster: LocalCluster,
    stack: tuple[ControllerProcess, Components],
    team_and_tenant: tuple[str, str],
) -> None:
    team_ns, tenant_ns = team_and_tenant
    pool = unique("pool")
    tenant = Tenant(cluster, tenant_ns)
    mine, theirs = unique("grant-a"), unique("grant-b")
    cluster.create_nodes(
        [FakeNode(mine, gpus=4), FakeNode(theirs, gpus=4, labels={"gpuplace-it/pool": pool})]
    )
    for node in (mine, theirs):
        publish_inventory(cluster, inventory_for(node, 4))
    put_policy(cluster, policy(tenant_ns, team_ns, pool, [mine]))
    wait_for(
        "grants published in the model",
        lambda: theirs in published_grants(cluster).get("namespaces", {}).get(team_ns, {}),
    )

    # The tenant's map naming the team's node: refused at apply, with line and column.
    squat = map_yaml(tenant_ns, "squat", [(0, mine, [0]), (1, theirs, [0])])
    manifest = source_configmap(tenant_ns, "squat", squat)
    last: list[str] = []
    wait_for(
        lambda: f"the webhook to refuse by the published grants: {last}",
        lambda: (
            (r := tenant.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest))
            and not last.append(r.stderr + r.stdout + str(published_grants(cluster)))
            and r.returncode != 0
        ),
    )
    result = tenant.kubectl("apply", "-f", "-", input=manifest)
    assert result.returncode != 0
    line, column = location_of(squat, "- index: 1")
    assert (
        f"configmap {tenant_ns}/squat placement.yaml:{line}:{column}: error: spec.placements[1]: index 1: namespace "
        f"{tenant_ns} may not place on node {theirs}"
    ) in result.stderr, result.stderr
    assert "index 0:" not in result.stderr
    assert tenant.kubectl("get", "configmap", "squat").returncode != 0  # nothing was stored

    # So is its legacy pod.
    legacy = pod("leg-0", schedulerName="gpu-scheduler")
    legacy["metadata"]["annotations"] = {LEGACY_ANNOTATION: f"0={theirs}:0\n1={mine}:1\n"}
    result = tenant.create(legacy)
    assert result.returncode != 0
    assert (
        f"pod {tenant_ns}/leg-0 annotation {LEGACY_ANNOTATION}:1:3: error: namespace {tenant_ns} "
        f"may not place on node {theirs}"
    ) in result.stderr, result.stderr

    # Within its grants the tenant places as before, with a map and with a legacy pod.
    own = map_yaml(tenant_ns, "own", [(0, mine, [0]), (1, mine, [2])])
    applied = tenant.kubectl("apply", "-f", "-", input=source_configmap(tenant_ns, "own", own))
    assert applied.returncode == 0, applied.stderr
    mapped = pod("own-0", schedulerName="gpuplace")
    mapped["metadata"]["labels"] = {MAP_LABEL: "own"}
    # Refused (by the webhook) until its model has the new map.
    wait_for("own-0 admitted", lambda: tenant.create(mapped).returncode == 0)
    legacy["metadata"]["name"] = "leg-1"
    assert tenant.create(legacy).returncode == 0
    # The granted team is unaffected: its map on its node (granted by label) binds.
    apply_map(cluster, team_ns, "team", map_yaml(team_ns, "team", [(0, theirs, [0])]))
    team_pod = {
        **pod("team-0", schedulerName="gpuplace"),
        "metadata": {"name": "team-0", "labels": {MAP_LABEL: "team"}},
    }
    # Refused (by the webhook) until its model has the team's new map.
    wait_for(
        "team-0 admitted",
        lambda: cluster.request("POST", f"/api/v1/namespaces/{team_ns}/pods", team_pod)[0] == 201,
    )
    for namespace, name, node in (
        (tenant_ns, "own-0", mine),
        (tenant_ns, "leg-1", mine),
        (team_ns, "team-0", theirs),
    ):
        placed = wait_for(
            f"{namespace}/{name} bound",
            lambda namespace=namespace, name=name: (
                (p := get_pod(cluster, namespace, name)) and p["spec"].get("nodeName") and p
            ),
        )
        assert placed["spec"]["nodeName"] == node

    # A grant revoked: the map is refused by the controller (status with the location) and
    # no longer served; pods already bound keep running, new ones wait.
    put_policy(cluster, policy(tenant_ns, team_ns, pool, [theirs]))
    status_line, status_column = location_of(own, "- index: 0")
    invalid = wait_for(
        "own turns Invalid",
        lambda: (st := map_status(cluster, tenant_ns, "own")) and st["phase"] == "Invalid" and st,
    )
    first = invalid["errors"][0]
    assert (first["line"], first["column"]) == (status_line, status_column)
    assert f"may not place on node {mine}" in first["message"]
    assert "nothing served" in invalid["message"]
    mapped["metadata"]["name"] = "own-1"
    refused = tenant.create(mapped)
    assert refused.returncode != 0
    assert f"placement map {tenant_ns}/own, which does not exist" in refused.stderr
    assert get_pod(cluster, tenant_ns, "own-0")["spec"]["nodeName"] == mine


def test_deny_by_default_places_only_what_a_grant_allows(cluster: LocalCluster) -> None:
    create_system_namespaces(cluster)
    namespace = unique("deny")
    cluster.create_namespace(namespace)
    node = unique("deny")
    cluster.create_nodes([FakeNode(node, gpus=2)])
    publish_inventory(cluster, inventory_for(node, 2))
    controller = solo_controller(cluster, "deny", "--grants-default=deny")
    try:
        text = map_yaml(namespace, "m", [(0, node, [0])])
        apply_map(cluster, namespace, "m", text)
        refused = wait_for(
            "m refused: no grant",
            lambda: (st := map_status(cluster, namespace, "m")) and st["phase"] == "Invalid" and st,
        )
        assert f"namespace {namespace} has no grant" in refused["errors"][0]["message"]
        assert "deny by default" in refused["errors"][0]["message"]
        status, body = cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                **pod("m-0", schedulerName="gpuplace"),
                "metadata": {"name": "m-0", "labels": {MAP_LABEL: "m"}},
            },
        )
        assert status == 201, body
        wait_for("m-0 waits", lambda: pending_reason(cluster, namespace, "m-0") == "MapNotFound")
        # The admin grants the namespace the node: the map is compiled, the pod bound.
        put_policy(cluster, policy(namespace, unique("other"), unique("pool"), [node]))
        wait_for(
            "m valid",
            lambda: (st := map_status(cluster, namespace, "m")) and st["phase"] == "Valid",
        )
        placed = wait_for(
            "m-0 bound",
            lambda: (p := get_pod(cluster, namespace, "m-0")) and p["spec"].get("nodeName") and p,
        )
        assert placed["spec"]["nodeName"] == node
    finally:
        controller.stop()
        cluster.request("DELETE", f"/api/v1/namespaces/{SYSTEM}/configmaps/{POLICY_CONFIGMAP}")
        cluster.delete_namespace(namespace)


def test_a_prebound_pod_squatting_another_teams_gpus_holds_nothing(
    cluster: LocalCluster,
    stack: tuple[ControllerProcess, Components],
    team_and_tenant: tuple[str, str],
) -> None:
    """The tenant (edit role) creates a pod already bound to the team's node whose
    gpu-scheduling-map line names its own node. The webhook refuses it with grants off and on
    (the controller, which counts no hold for such a pod, is checked in tests/unit/placement/test_gate.py);
    the team's pod gets the GPUs."""
    team_ns, tenant_ns = team_and_tenant
    pool = unique("pool")
    tenant = Tenant(cluster, tenant_ns)
    mine, theirs = unique("sq-a"), unique("sq-b")
    cluster.create_nodes(
        [FakeNode(mine, gpus=4), FakeNode(theirs, gpus=4, labels={"gpuplace-it/pool": pool})]
    )
    for node in (mine, theirs):
        publish_inventory(cluster, inventory_for(node, 4))

    def squat(name: str) -> dict[str, Any]:
        body = pod(name, schedulerName="gpu-scheduler", nodeName=theirs)
        body["metadata"]["annotations"] = {LEGACY_ANNOTATION: f"0={mine}:0,1\n"}
        return body

    last: list[str] = []

    def refused() -> bool:
        result = tenant.create(squat(f"squat{len(last)}-0"))  # each try a pod of its own
        last.append(result.stderr)
        return result.returncode != 0

    # Grants off: refused at create all the same, since its line's node is not the one it runs
    # on (a squat admitted before the webhook was registered holds nothing: the team's pod binds).
    wait_for(lambda: f"the webhook to refuse the squat: {last}", refused)
    assert f"runs on node {theirs}, but node {mine!r} resolves to node {mine}" in last[-1], last

    # The webhook reads the grants this stack's controller publishes; until it has, it may still
    # serve an earlier test's (deny by default), which refuses the team's map.
    def team_map_applied() -> bool:
        try:
            apply_map(cluster, team_ns, "team", map_yaml(team_ns, "team", [(0, theirs, [0, 1])]))
        except AssertionError:
            return False
        return True

    wait_for("the team's map admitted under this stack's grants", team_map_applied)
    team_pod = {
        **pod("team-0", schedulerName="gpuplace"),
        "metadata": {"name": "team-0", "labels": {MAP_LABEL: "team"}},
    }
    wait_for(
        "team-0 admitted",
        lambda: cluster.request("POST", f"/api/v1/namespaces/{team_ns}/pods", team_pod)[0] == 201,
    )
    placed = wait_for(
        "team-0 bound",
        lambda: (p := get_pod(cluster, team_ns, "team-0")) and p["spec"].get("nodeName") and p,
    )
    assert placed["spec"]["nodeName"] == theirs

    # Grants on: refused at create, naming the node it runs on and the one its line means.
    put_policy(cluster, policy(tenant_ns, team_ns, pool, [mine]))
    wait_for(
        "grants published in the model",
        lambda: theirs in published_grants(cluster).get("namespaces", {}).get(team_ns, {}),
    )
    wait_for(lambda: f"the webhook to refuse the squat by the published grants: {last}", refused)
    assert f"runs on node {theirs}, but node {mine!r} resolves to node {mine}" in last[-1], last
