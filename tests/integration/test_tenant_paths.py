"""The other paths a hostile tenant (the `edit` role in its own namespace, through kubectl) may try
against the real apiserver and webhook: a map whose provenance annotation is too long, a flood of
server-side dry-run map validations while another team applies its map, `count` and fallback
entries outside its grants, and a toleration it was not granted (env enforcement; the DRA
allocation's side is in test_dra.py)."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplace_dev.demo.components import Components
from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.annotations import REVISION_ANNOTATION
from placement.grants import POLICY_CONFIGMAP
from tests.integration.controllerkit import (
    ControllerProcess,
    create_system_namespaces,
    inventory_for,
    map_yaml,
    publish_inventory,
    solo_controller,
    unique,
    wait_for,
)
from tests.integration.tenantkit import Tenant
from tests.integration.test_grants import (
    SYSTEM,
    published_grants,
    put_policy,
    source_configmap,
    stored_grants,
    unregister,
)

pytestmark = pytest.mark.integration
CONFIGURATION = "gpuplace-tenant-paths-it"
#: One validation thread and two queued maps per namespace: a flood from one namespace fills
#: its own queue within a few requests.
PER_NAMESPACE = 2


@pytest.fixture
def stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[ControllerProcess, Components]]:
    create_system_namespaces(cluster)
    # Grants off until a test puts a policy: none left by an earlier test, and none of its grants
    # served (a model that denies by default refuses every map until this controller writes its
    # own).
    cluster.request("DELETE", f"/api/v1/namespaces/{SYSTEM}/configmaps/{POLICY_CONFIGMAP}")
    controller = solo_controller(cluster, "tenantpaths")
    components = Components(cluster, tmp_path)
    components.webhook(
        "env",
        f"--configuration-name={CONFIGURATION}",
        "--validation-threads=1",
        f"--validation-queue-per-namespace={PER_NAMESPACE}",
    )
    try:
        wait_for(
            "a stored model whose grants allow everything",
            lambda: (grants := stored_grants(cluster)) is not None and grants.allows_everything,
        )
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


def annotated(manifest: str, key: str, value: str) -> str:
    """The ConfigMap `manifest` (JSON) with one annotation."""
    return manifest.replace(
        '"metadata": {', f'"metadata": {{"annotations": {{"{key}": "{value}"}}, ', 1
    )


def webhook_up(tenant: Tenant) -> None:
    """Waits until the webhook judges the tenant's maps: a broken one is refused at a dry run
    (before it is registered, the apiserver admits anything)."""
    broken = source_configmap(tenant.namespace, "probe", "spec: [\n")
    wait_for(
        "the webhook judging maps",
        lambda: tenant.kubectl("apply", "--dry-run=server", "-f", "-", input=broken).returncode,
    )


def admitted(tenant: Tenant, manifest: str) -> bool:
    """The webhook answers (a map it admits passes a server-side dry run)."""
    return tenant.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).returncode == 0


def test_a_provenance_annotation_longer_than_its_limit_is_refused_at_apply(
    cluster: LocalCluster,
    stack: tuple[ControllerProcess, Components],
    team_and_tenant: tuple[str, str],
) -> None:
    """The tenant stamps a 129-character revision on its map: it would travel into the model and
    onto every pod the map places. Refused at apply, the annotation named; 128 are admitted."""
    _, tenant_ns = team_and_tenant
    tenant = Tenant(cluster, tenant_ns)
    node = unique("prov")
    cluster.create_nodes([FakeNode(node, gpus=2)])
    publish_inventory(cluster, inventory_for(node, 2))
    manifest = source_configmap(
        tenant_ns, "stamped", map_yaml(tenant_ns, "stamped", [(0, node, [0])])
    )
    webhook_up(tenant)

    result = tenant.kubectl(
        "apply", "-f", "-", input=annotated(manifest, REVISION_ANNOTATION, "r" * 129)
    )
    assert result.returncode != 0
    assert (
        f"configmap {tenant_ns}/stamped: error: metadata.annotations[{REVISION_ANNOTATION}]: "
        "129 characters, more than the 128 this annotation may have"
    ) in result.stderr, result.stderr
    assert tenant.kubectl("get", "configmap", "stamped").returncode != 0  # nothing was stored

    result = tenant.kubectl(
        "apply", "-f", "-", input=annotated(manifest, REVISION_ANNOTATION, "r" * 128)
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_flood_of_dry_run_validations_busies_only_its_own_namespace(
    cluster: LocalCluster,
    stack: tuple[ControllerProcess, Components],
    team_and_tenant: tuple[str, str],
) -> None:
    """The tenant sends server-side dry runs of a large map from several threads, as fast as
    kubectl goes; meanwhile the team applies its maps. The tenant's own queue fills and it is told
    the validator is busy (429 with Retry-After, which kubectl waits and sends again on: its log,
    -v=6, shows each answer); the team's maps are validated and stored, never refused busy."""
    team_ns, tenant_ns = team_and_tenant
    tenant, team = Tenant(cluster, tenant_ns), Tenant(cluster, team_ns, "team")
    node = unique("flood")
    cluster.create_nodes([FakeNode(node, gpus=8)])
    publish_inventory(cluster, inventory_for(node, 8))
    # About 460 KB and 8,000 entries: each validation takes the webhook's one thread a while.
    large = map_yaml(tenant_ns, "large", [(i, f"n{i // 8}", [i % 8]) for i in range(8000)])
    flood = source_configmap(tenant_ns, "large", large)
    webhook_up(tenant)

    stop = threading.Event()
    lock = threading.Lock()
    answers: dict[str, int] = {"busy": 0, "admitted": 0, "retried": 0, "other": 0}
    others: list[str] = []

    def send(rounds: int) -> None:
        for _ in range(rounds):
            if stop.is_set():
                return
            # Server-side apply: a client-side one would copy the map into an annotation,
            # which the apiserver refuses above 256 KiB before any webhook sees it.
            r = tenant.kubectl(
                "apply", "--server-side", "--dry-run=server", "-v=6", "-f", "-", input=flood
            )
            with lock:
                busy = busy_answers(r.stderr)
                answers["busy"] += busy
                if r.returncode == 0:
                    answers["admitted"] += 1
                    answers["retried"] += busy > 0  # sent again after Retry-After, then admitted
                elif "the placement-map validator is busy" not in r.stderr:
                    answers["other"] += 1
                    others.append(r.stderr[-300:])

    senders = [threading.Thread(target=send, args=(12,), daemon=True) for _ in range(6)]
    for sender in senders:
        sender.start()
    try:
        wait_for(
            lambda: f"the tenant told the validator is busy: {answers} {others[-2:]}",
            lambda: answers["busy"] > 0 or not any(s.is_alive() for s in senders),
            timeout=300,
        )
        assert answers["busy"] > 0, (answers, others[-3:])
        # The flood goes on: the team's maps are validated and stored all the same.
        for n in range(3):
            name = f"team-{n}"
            text = map_yaml(team_ns, name, [(0, node, [n])])
            manifest = source_configmap(team_ns, name, text)
            result = team.kubectl("apply", "-v=6", "-f", "-", input=manifest)
            assert result.returncode == 0, (result.stderr, answers)
            assert busy_answers(result.stderr) == 0, result.stderr
            assert "busy" not in result.stderr + result.stdout
            assert team.kubectl("get", "configmap", name).returncode == 0
        flooding = any(s.is_alive() for s in senders)
        assert flooding, "the flood ended before the team applied: send more rounds"
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=120)
    assert answers["busy"] > 0 and answers["admitted"] > 0, (answers, others[-3:])
    # The apiserver passed the denial's Retry-After on: kubectl waited and sent the map again.
    assert answers["retried"] > 0, (answers, others[-3:])


def busy_answers(log: str) -> int:
    """The 429 answers in a kubectl -v=6 log (client-go logs every response with its status)."""
    return sum(1 for line in log.splitlines() if "429 Too Many Requests" in line)


def refused_at_apply(tenant: Tenant, manifest: str, what: str) -> str:
    """The tenant's `kubectl apply` of `manifest` refused (once the webhook has the grants the
    test just published): its stderr."""
    last: list[str] = []

    def refused() -> bool:
        result = tenant.kubectl("apply", "-f", "-", input=manifest)
        last.append(result.stderr)
        return result.returncode != 0

    wait_for(lambda: f"{what} refused by the grants: {last[-1:]}", refused)
    return last[-1]


def grants_policy(tenant: str, mine: str, team: str, theirs: str, tolerations: str = "") -> str:
    """The tenant granted GPUs 0 and 1 of `mine`; the team the whole of `theirs`, and (if given)
    these toleration grants there."""
    text = textwrap.dedent(f"""\
        apiVersion: gpuplace.io/v1alpha1
        kind: PlacementPolicy
        metadata:
          name: cluster
        spec:
          grants:
            - namespaces: [{tenant}]
              nodes: [{mine}]
              devices: [0, 1]
            - namespaces: [{team}]
              nodes: [{theirs}]
    """)
    return text + (f"      tolerations: {tolerations}\n" if tolerations else "")


def entries(namespace: str, name: str, *lines: str) -> str:
    """A map of the given placements (YAML lines under `placements:`, indented by 4)."""
    head = map_yaml(namespace, name, []).rstrip("\n")
    return head + "\n" + "".join(f"    {line}\n" for line in lines)


def test_count_fallback_and_tolerations_outside_the_grants_are_refused_at_apply(
    cluster: LocalCluster,
    stack: tuple[ControllerProcess, Components],
    team_and_tenant: tuple[str, str],
) -> None:
    """The tenant, granted GPUs 0 and 1 of its node, tries a `count` entry on the team's node, a
    `count` on its own node (which would let the compiler pick any GPU), a fallback GPU it was not
    granted, and a toleration of every taint: each is refused at apply, located, with grants on.
    With grants off the same toleration is admitted."""
    team_ns, tenant_ns = team_and_tenant
    tenant = Tenant(cluster, tenant_ns)
    mine, theirs = unique("cnt-a"), unique("cnt-b")
    cluster.create_nodes([FakeNode(mine, gpus=4), FakeNode(theirs, gpus=4)])
    for node in (mine, theirs):
        publish_inventory(cluster, inventory_for(node, 4))
    tolerating = entries(
        tenant_ns,
        "tol",
        "- index: 0",
        f"  node: {mine}",
        "  devices: [0]",
        "  tolerations: [{operator: Exists}]",
    )
    # Grants off: tolerating is as free as everything else.
    webhook_up(tenant)
    assert admitted(tenant, source_configmap(tenant_ns, "tol", tolerating))

    put_policy(cluster, grants_policy(tenant_ns, mine, team_ns, theirs))
    wait_for(
        "grants published in the model",
        lambda: theirs in published_grants(cluster).get("namespaces", {}).get(team_ns, {}),
    )
    attacks = {
        "count-theirs": (
            entries(tenant_ns, "ct", "- index: 0", f"  node: {theirs}", "  count: 1"),
            "- index: 0",
            f"index 0: namespace {tenant_ns} may not place on node {theirs}",
        ),
        "count-mine": (
            entries(tenant_ns, "cm", "- index: 0", f"  node: {mine}", "  count: 1"),
            "- index: 0",
            f"index 0: namespace {tenant_ns} may use only GPUs 0, 1 of node {mine}; list them "
            "under 'devices' instead of 'count'",
        ),
        "fallback": (
            entries(
                tenant_ns,
                "fb",
                "- index: 0",
                f"  node: {mine}",
                "  devices: [0]",
                "  fallback: [3]",
            ),
            "- index: 0",
            f"index 0: namespace {tenant_ns} may not use GPU(s) 3 of node {mine}",
        ),
        "toleration": (
            tolerating,
            "tolerations:",
            f"index 0: toleration {{operator: Exists}}: namespace {tenant_ns} may not tolerate "
            f"every taint on node {mine}",
        ),
    }
    for what, (text, needle, message) in attacks.items():
        name = text.split("name: ", 1)[1].split("\n", 1)[0]
        manifest = source_configmap(tenant_ns, name, text)
        refusal = refused_at_apply(tenant, manifest, what)
        line = next(n for n, t in enumerate(text.splitlines(), 1) if needle in t)
        assert f"configmap {tenant_ns}/{name} placement.yaml:{line}:" in refusal, (what, refusal)
        assert message in refusal, (what, refusal)
        assert tenant.kubectl("get", "configmap", name).returncode != 0, what  # nothing stored

    # Within the grants: its granted GPUs, a granted fallback, no toleration.
    own = entries(
        tenant_ns, "own", "- index: 0", f"  node: {mine}", "  devices: [0]", "  fallback: [1]"
    )
    result = tenant.kubectl("apply", "-f", "-", input=source_configmap(tenant_ns, "own", own))
    assert result.returncode == 0, result.stderr
