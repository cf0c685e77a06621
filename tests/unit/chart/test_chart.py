"""charts/gpuplace: helm lint and helm template over the defaults and every switch, the values
schema, and what the rendered objects promise (names, ports, RBAC scopes, security, CLI flags)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplace.cli import build_parser
from gpuplace.commands.controller import settings_from, web_view_problem
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    ENV_CUDA_DEVICE_ORDER,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LEGACY_ANNOTATION,
    MAP_LABEL,
    PREFIX,
)
from tests.chartkit import (
    CHART,
    INVENTORY,
    NAMESPACE,
    SCENARIOS,
    Scenario,
    find,
    helm,
    one,
    render,
    render_with_sources,
)
from tests.unit.webhook_builders import POD_CREATE_RULES

COMPONENTS = ("controller", "webhook", "agent")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("values")
    return {s.name: render(s, tmp) for s in SCENARIOS}


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """component -> pod template of its Deployment or DaemonSet."""
    out = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            out[component] = obj["spec"]["template"]
    return out


def container(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    containers = pod_templates(objects)[component]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# ------------------------------------------------------------------------------- lint and render


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_helm_lint_passes_strictly(scenario: Scenario, tmp_path: Path) -> None:
    result = helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *scenario.values_args(tmp_path)
    )
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_templates_are_named_component_kind(scenario: Scenario, tmp_path: Path) -> None:
    for source, obj in render_with_sources(scenario, tmp_path):
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        assert source == f"{component}-{obj['kind'].lower()}.yaml", (source, obj["kind"])


def test_every_object_is_labelled_and_namespaced_where_it_belongs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    cluster_scoped = {
        "CustomResourceDefinition",
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for objects in rendered.values():
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/part-of"] == "gpuplace"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            if obj["kind"] in cluster_scoped:
                assert "namespace" not in obj["metadata"]
            else:
                assert obj["metadata"]["namespace"] in (NAMESPACE, INVENTORY), obj["metadata"]


def test_default_components(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["default"]
    assert one(objects, "Deployment", "gpuplace-controller")["spec"]["replicas"] == 2
    assert one(objects, "Deployment", "gpuplace-webhook")["spec"]["replicas"] == 2
    assert one(objects, "DaemonSet", "gpuplace-agent")
    pdb = one(objects, "PodDisruptionBudget", "gpuplace-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == (one(objects, "Deployment", "gpuplace-webhook")["spec"]["selector"]["matchLabels"])
    )
    assert one(objects, "Namespace", INVENTORY)
    # The webhook replicas spread over nodes (soft by default).
    anti = pod_templates(objects)["webhook"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_hard_anti_affinity_and_overrides(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["production"]
    webhook = pod_templates(objects)["webhook"]["spec"]
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" in webhook["affinity"]["podAntiAffinity"]
    )
    assert webhook["priorityClassName"] == "system-cluster-critical"
    assert webhook["imagePullSecrets"] == [{"name": "regcred"}]
    assert (
        container(objects, "controller")["image"] == "ghcr.io/gpuplace/gpuplace@sha256:" + "ab" * 32
    )
    assert "--bind-workers=64" in container(objects, "controller")["args"]
    assert env_of(container(objects, "controller"))["EXTRA"] == "1"
    assert not find(objects, "PodDisruptionBudget", "gpuplace-controller")
    assert all(o["metadata"]["labels"]["team"] == "platform" for o in objects)
    mutating = one(objects, "MutatingWebhookConfiguration")
    excluded = mutating["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == [NAMESPACE, "kube-system", "kube-public"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_pods_run_non_root_read_only_without_capabilities(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    templates = pod_templates(rendered[scenario.name])
    assert templates
    for component, template in templates.items():
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, component
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["serviceAccountName"] == f"gpuplace-{component}"
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert "privileged" not in sc
            # Every probe targets a declared port, on the paths every component serves.
            ports = {p["name"] for p in c["ports"]}
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert {
                c["livenessProbe"]["httpGet"]["port"],
                c["readinessProbe"]["httpGet"]["port"],
            } <= ports
            assert "resources" in c


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_container_arguments_are_accepted_by_the_gpuplace_cli(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The chart and the CLI agree on every flag (argparse exits on an unknown one)."""
    parser = build_parser()
    for component, template in pod_templates(rendered[scenario.name]).items():
        args = template["spec"]["containers"][0]["args"]
        assert args[0] == component
        parsed = parser.parse_args(args)
        assert parsed.command == component, shlex.join(args)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_services_select_pods_and_name_their_ports(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[scenario.name]
    templates = pod_templates(objects)
    for service in find(objects, "Service"):
        selector = service["spec"]["selector"]
        matching = [
            t for t in templates.values() if selector.items() <= t["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, service["metadata"]["name"]
        ports = {p["name"] for p in matching[0]["spec"]["containers"][0]["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    for monitor in find(objects, "ServiceMonitor"):
        services = [
            s
            for s in find(objects, "Service")
            if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert len(services) == 1, monitor["metadata"]["name"]
        names = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= names


# ------------------------------------------------------------------------------- webhook wiring


def _webhooks(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for config in find(objects, kind):
            assert config["metadata"]["name"] == "gpuplace"
            out.extend((kind, hook) for hook in config["webhooks"])
    return out


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_webhook_configurations_fail_closed_and_reach_the_service(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[scenario.name]
    service = one(objects, "Service", "gpuplace-webhook")
    https = one(
        [{"kind": "port", "metadata": p} for p in service["spec"]["ports"]], "port", "https"
    )["metadata"]
    container_port = {p["name"]: p["containerPort"] for p in container(objects, "webhook")["ports"]}
    assert https["port"] == 443
    assert container_port[https["targetPort"]] == 8443
    hooks = _webhooks(objects)
    assert hooks
    for kind, hook in hooks:
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert 1 <= hook["timeoutSeconds"] <= 30
        # Maps may be 1 MiB: their validation gets its own, longer timeout than pod admission.
        if kind.startswith("Validating"):
            assert hook["timeoutSeconds"] == 15
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"], ref["port"]) == ("gpuplace-webhook", NAMESPACE, 443)
        assert ref["path"] == ("/mutate" if kind.startswith("Mutating") else "/validate")
        assert "caBundle" not in hook["clientConfig"]  # injected at runtime, never from git


def test_mutating_webhook_selects_opted_in_pods_on_create(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    hooks = {h["name"]: h for _, h in _webhooks(rendered["default"])}
    pods = hooks["pods.gpuplace.io"]
    assert pods["objectSelector"] == {
        "matchExpressions": [{"key": "gpuplace.io/map", "operator": "Exists"}]
    }
    assert pods["rules"] == POD_CREATE_RULES
    maps = hooks["placementmaps.gpuplace.io"]
    assert maps["objectSelector"] == {"matchLabels": {"gpuplace.io/placement-map": "true"}}
    assert maps["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert maps["rules"][0]["resources"] == ["configmaps"]


def test_legacy_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    on = {h["name"]: h for _, h in _webhooks(rendered["default"])}
    legacy = on["legacy-pods.gpuplace.io"]
    # Annotations cannot be selected by an objectSelector: a matchCondition reads them instead.
    assert "gpu-scheduling-map" in legacy["matchConditions"][0]["expression"]
    assert legacy["objectSelector"]["matchExpressions"] == [
        {"key": "gpuplace.io/map", "operator": "DoesNotExist"}
    ]
    for component in ("controller", "webhook"):
        args = container(rendered["default"], component)["args"]
        assert "--legacy" in args and "--legacy-scheduler-name=gpu-scheduler" in args
        off = container(rendered["legacy-off"], component)["args"]
        assert "--no-legacy" in off and "--legacy" not in off
    assert "legacy-pods.gpuplace.io" not in {
        h["name"] for _, h in _webhooks(rendered["legacy-off"])
    }
    opted = {h["name"]: h for _, h in _webhooks(rendered["legacy-opted-in-namespaces"])}
    selector = opted["legacy-pods.gpuplace.io"]["namespaceSelector"]
    assert selector["matchLabels"] == {"gpuplace.io/legacy": "enabled"}
    assert selector["matchExpressions"][0]["operator"] == "NotIn"


def test_enforcement_switch(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for component in ("controller", "webhook"):
        assert "--enforcement=env" in container(rendered["default"], component)["args"]
        assert "--enforcement=dra" in container(rendered["dra"], component)["args"]
    assert "--dra-driver=gpu.nvidia.com" in container(rendered["dra"], "controller")["args"]
    assert "--dra-attribute=uuid" in container(rendered["dra"], "controller")["args"]
    # Only dra enforcement lets the controller touch DRA objects; nothing else ever writes claims.
    default = rules_of(rendered["default"], "controller")[("ClusterRole", "")]
    assert not any("resource.k8s.io" in r["apiGroups"] for r in default)
    dra = rules_of(rendered["dra"], "controller")[("ClusterRole", "")]
    assert grants(dra, "patch", "resourceclaims/status")
    for component in ("webhook", "agent"):
        for rules in rules_of(rendered["dra"], component).values():
            assert not any("resource.k8s.io" in r["apiGroups"] for r in rules)


def test_bootstrap_tls(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["default"]
    args = container(objects, "webhook")["args"]
    assert "--bootstrap-tls" in args and "--ca-secret=gpuplace-webhook-ca" in args
    secret = one(objects, "Secret", "gpuplace-webhook-ca")
    assert "data" not in secret  # the webhook fills it; helm and ArgoCD leave its data alone
    assert not find(objects, "Certificate") and not find(objects, "Issuer")
    assert all(
        "annotations" not in c["metadata"] for c in find(objects, "MutatingWebhookConfiguration")
    )


@pytest.mark.parametrize("name", ["cert-manager", "cert-manager-cluster-issuer"])
def test_cert_manager_tls(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    objects = rendered[name]
    certificate = one(objects, "Certificate", "gpuplace-webhook")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotation = one(objects, kind)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == f"{NAMESPACE}/gpuplace-webhook"
    assert "gpuplace-webhook.gpuplace-system.svc" in certificate["spec"]["dnsNames"]
    pod = pod_templates(objects)["webhook"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    args = pod["containers"][0]["args"]
    assert "--bootstrap-tls" not in args
    assert "--tls-cert-file=/etc/gpuplace/tls/tls.crt" in args
    # cert-manager's cainjector writes the caBundle: the webhook needs no cluster-wide rights.
    assert not find(objects, "ClusterRole", "gpuplace-webhook")
    # No webhook CA Secret: the only Secret is the controller's binding key.
    assert [s["metadata"]["name"] for s in find(objects, "Secret")] == ["gpuplace-binding-key"]
    issuers = {i["metadata"]["name"] for i in find(objects, "Issuer")}
    if name == "cert-manager":
        assert certificate["spec"]["issuerRef"]["name"] in issuers
    else:
        assert not issuers
        assert certificate["spec"]["issuerRef"] == {
            "name": "corp-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }


# ------------------------------------------------------------------------------- agent


def test_agent_daemonset(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["default"]
    pod = pod_templates(objects)["agent"]["spec"]
    c = pod["containers"][0]
    env = env_of(c)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUPLACE_INVENTORY_NAMESPACE"] == INVENTORY
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    volume = one([{"kind": "v", "metadata": v} for v in pod["volumes"]], "v", "nvml")["metadata"]
    assert volume["hostPath"] == {
        "path": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "type": "File",
    }
    mount = next(m for m in c["volumeMounts"] if m["name"] == "nvml")
    assert mount["readOnly"] is True
    assert mount["mountPath"] == env["LD_LIBRARY_PATH"] + "/libnvidia-ml.so.1"
    assert "resources" not in c or "nvidia.com/gpu" not in json.dumps(c["resources"])


def test_agent_nvml_variants(rendered: dict[str, list[dict[str, Any]]]) -> None:
    runtime = pod_templates(rendered["nvml-runtime"])["agent"]["spec"]
    assert runtime["runtimeClassName"] == "nvidia"
    assert all(v["name"] != "nvml" for v in runtime["volumes"])
    assert "LD_LIBRARY_PATH" not in env_of(runtime["containers"][0])
    directory = pod_templates(rendered["nvml-directory"])["agent"]["spec"]
    mount = next(m for m in directory["containers"][0]["volumeMounts"] if m["name"] == "nvml")
    assert mount["mountPath"] == env_of(directory["containers"][0])["LD_LIBRARY_PATH"]


def test_agent_off_removes_the_agent_and_its_rights(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["agent-off"]
    assert not find(objects, "DaemonSet")
    assert not [o for o in objects if o["metadata"]["name"] == "gpuplace-agent"]
    assert find(objects, "Deployment", "gpuplace-controller")


def test_external_inventory_namespace_is_not_created(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["inventory-namespace-external"]
    assert not find(objects, "Namespace")
    assert {r["metadata"]["namespace"] for r in find(objects, "RoleBinding")} == {
        NAMESPACE,
        INVENTORY,
    }


# ------------------------------------------------------------------------------- RBAC


def rules_of(
    objects: list[dict[str, Any]], component: str
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(kind, namespace or '') -> rules bound to the component's service account."""
    name = f"gpuplace-{component}"
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["rules"]
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["name"] == name and s["namespace"] == NAMESPACE for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "")
        out[(ref["kind"], namespace)] = roles[(ref["kind"], namespace, ref["name"])]
    return out


def grants(rules: list[dict[str, Any]], verb: str, resource: str) -> bool:
    return any(verb in r["verbs"] and resource in r["resources"] for r in rules)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_rbac_has_no_wildcards_and_no_cluster_wide_writes_beyond_the_controller(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[scenario.name]
    for obj in objects:
        for rule in obj.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], obj["metadata"]
    agent = rules_of(objects, "agent")
    for (kind, namespace), rules in agent.items():
        assert kind == "Role"
        writes = {v for r in rules for v in r["verbs"]} - {"get", "list", "watch"}
        assert not writes or namespace == INVENTORY, (namespace, writes)
    for (kind, _), rules in rules_of(objects, "webhook").items():
        if kind == "ClusterRole":
            assert all(r.get("resourceNames") == ["gpuplace"] for r in rules)
    controller = rules_of(objects, "controller")
    cluster = controller[("ClusterRole", "")]
    for resource in ("configmaps", "pods", "nodes"):
        for verb in ("create", "update", "delete"):
            assert not grants(cluster, verb, resource), (verb, resource)


def test_webhook_touches_its_ca_secret_by_name_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    rules = rules_of(rendered["default"], "webhook")[("Role", NAMESPACE)]
    secret_rules = [r for r in rules if "secrets" in r["resources"]]
    assert secret_rules == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gpuplace-webhook-ca"],
            "verbs": ["get", "update", "patch"],
        }
    ]


# ------------------------------------------------------------------------------- values schema


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "controler.replicas=3"], "additional properties 'controler' not allowed"),
        (["--set", "controller.replica=3"], "additional properties 'replica' not allowed"),
        (["--set", "global.legacy.enable=false"], "additional properties 'enable' not allowed"),
        (["--set", "webhook.tls.mode=certmanager"], "/webhook/tls/mode"),
        (["--set", "webhook.failurePolicy=Fial"], "/webhook/failurePolicy"),
        (["--set", "webhook.timeoutSeconds=60"], "/webhook/timeoutSeconds"),
        (["--set", "controller.replicas=two"], "/controller/replicas"),
        (["--set", "agent.nvml.hostPathType=Socket"], "/agent/nvml/hostPathType"),
        (["--set", "global.image.digest=latest"], "/global/image/digest"),
        (
            ["--set-json", 'controller.resources={"requests":{"memroy":"1Gi"}}'],
            "'memroy' not allowed",
        ),
        (
            ["--set-json", 'agent.tolerations=[{"key":"a","opertor":"Exists"}]'],
            "'opertor' not allowed",
        ),
    ],
)
def test_values_typos_fail_schema_validation(args: list[str], message: str) -> None:
    result = helm("template", "gpuplace", str(CHART), "--namespace", NAMESPACE, *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def _schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def test_schema_closes_every_object() -> None:
    """Every object the chart defines rejects unknown keys; only string maps (labels, selectors)
    and Kubernetes objects passed through to the apiserver are open, and only by name."""
    schema = _schema()
    open_definitions = {"stringMap", "kubernetesObject"}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and path.rsplit("/", 1)[-1] not in open_definitions:
                assert node.get("additionalProperties") is False, path
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(schema, "#")
    assert schema["definitions"]["stringMap"]["additionalProperties"] == {"type": "string"}


def test_schema_and_values_yaml_describe_the_same_keys() -> None:
    """No key in values.yaml escapes the schema, and the schema documents no key values.yaml lacks."""
    schema = _schema()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        return node

    def compare(value: Any, node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        properties = node.get("properties")
        # An empty mapping is an unset Kubernetes shape (a selector, affinity): nothing to compare.
        if not isinstance(value, dict) or not value or properties is None:
            return
        if "patternProperties" not in node:
            assert set(value) == set(properties), (path, set(value) ^ set(properties))
        for key, child in value.items():
            if key in properties:
                compare(child, properties[key], f"{path}.{key}")

    compare(values, schema, "values")


def test_values_yaml_comments_every_component_block() -> None:
    text = (CHART / "values.yaml").read_text()
    for block in ("global", *COMPONENTS):
        match = re.search(rf"^{block}:\n((?:  .*\n|\n)+)", text, re.MULTILINE)
        assert match, block
        assert "#" in match.group(1), f"{block}: no comments"


def test_controller_evicts_only_when_allowed_and_cleans_up_deleted_nodes_inventories_only(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    controller = rules_of(rendered["default"], "controller")
    cluster = controller[("ClusterRole", "")]
    assert not grants(cluster, "create", "pods/eviction")
    assert not grants(cluster, "delete", "pods")
    allowed = render(Scenario("evict", {"controller": {"allowEvictions": True}}), tmp_path)
    evicting = rules_of(allowed, "controller")[("ClusterRole", "")]
    assert grants(evicting, "create", "pods/eviction")
    assert not grants(evicting, "delete", "pods")
    inventory = controller[("Role", INVENTORY)]
    assert grants(inventory, "delete", "configmaps") and grants(inventory, "delete", "leases")
    writes = {(v, res) for r in inventory for v in r["verbs"] for res in r["resources"]}
    assert {w for w in writes if w[0] not in ("get", "list", "watch")} == {
        ("delete", "configmaps"),
        ("delete", "leases"),
    }


POD_BINDINGS = "gpuplace-pod-bindings"


def test_pod_binding_policy_names_the_annotations_and_variables_the_components_use(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The chart is the one source of the policy (the local cluster installs what it renders, and
    the integration tests forge against it); its CEL names what the webhook and binder write."""
    objects = rendered["default"]
    policy = one(objects, "ValidatingAdmissionPolicy", POD_BINDINGS)
    binding = one(objects, "ValidatingAdmissionPolicyBinding", POD_BINDINGS)
    assert binding["spec"] == {"policyName": POD_BINDINGS, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    cel = json.dumps(policy["spec"])
    for name in (PREFIX, LEGACY_ANNOTATION, MAP_LABEL, ENV_CUDA_VISIBLE_DEVICES):
        assert json.dumps(name)[1:-1] in cel, name
    for name in (ENV_NVIDIA_VISIBLE_DEVICES, ENV_CUDA_DEVICE_ORDER):
        assert json.dumps(name)[1:-1] in cel, name
    # The fieldRef paths the webhook wires the environment from.
    for annotation in (CUDA_ANNOTATION, DEVICES_ANNOTATION):
        assert f"metadata.annotations['{annotation}']" in policy_text(policy), annotation
    # Kept between an uninstall and an install: a map's pod is refused meanwhile.
    for kept in (policy, binding):
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def policy_text(policy: dict[str, Any]) -> str:
    return "\n".join(
        str(v) for item in policy["spec"].get("validations", []) for v in item.values()
    ) + "\n".join(str(v["expression"]) for v in policy["spec"].get("variables", []))


def test_pod_binding_policy_follows_the_scheduler_name(tmp_path: Path) -> None:
    objects = render(SCENARIOS[0], tmp_path, "--set", "global.schedulerName=gpu-binder")
    text = policy_text(one(objects, "ValidatingAdmissionPolicy", POD_BINDINGS))
    assert 'object.spec.schedulerName == "gpu-binder"' in text
    assert 'schedulerName == "gpuplace"' not in text


def test_controller_reads_its_binding_key_by_name_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["default"]
    secret = one(objects, "Secret", "gpuplace-binding-key")
    assert "data" not in secret  # the controller fills it; helm and ArgoCD leave its data alone
    # It outlives the release: helm uninstall keeps it, ArgoCD neither prunes nor deletes it.
    annotations = secret["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"
    assert annotations["argocd.argoproj.io/sync-options"] == "Prune=false,Delete=false"
    rules = rules_of(objects, "controller")[("Role", NAMESPACE)]
    assert [r for r in rules if "secrets" in r["resources"]] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gpuplace-binding-key"],
            "verbs": ["get", "list", "watch", "update", "patch"],
        }
    ]
    for component in ("webhook", "agent"):
        for rules in rules_of(objects, component).values():
            for rule in rules:
                if "secrets" in rule["resources"]:
                    assert "gpuplace-binding-key" not in rule.get("resourceNames", [])
                    assert rule.get("resourceNames"), rule


# ------------------------------------------------------------------------------- ports


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_the_controller_accepts_the_web_address_the_chart_gives_it(
    scenario: Scenario, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    args = container(rendered[scenario.name], "controller")["args"]
    assert web_view_problem(settings_from(build_parser().parse_args(args))) == ""


def test_the_web_view_listens_beyond_the_pod_only_with_tokens(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    def web_address(name: str) -> str:
        args = container(rendered[name], "controller")["args"]
        return next(a for a in args if a.startswith("--web-address=")).split("=", 1)[1]

    assert web_address("web-view") == "0.0.0.0:8090"
    assert web_address("web-view-port-forward") == "127.0.0.1:8090"
    assert (
        "--no-web-authenticate"
        in container(rendered["web-view-port-forward"], "controller")["args"]
    )


def _policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in find(objects, "NetworkPolicy")
    }


def _rules(policy: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    return [(r["ports"][0]["port"], r["from"]) for r in policy["spec"]["ingress"]]


#: The release namespace's own pods, which every metrics port admits.
SAME_NAMESPACE = {"podSelector": {}}


def test_by_default_the_controller_and_agent_policies_admit_their_namespace_to_metrics(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """On where they cannot break an install (the kubelet's probes come from the node, which
    NetworkPolicy always admits); the webhook's waits for the apiserver's addresses."""
    policies = _policies(rendered["default"])
    assert set(policies) == {"controller", "agent"}
    assert _rules(policies["controller"]) == [(8080, [SAME_NAMESPACE])]
    assert _rules(policies["agent"]) == [(8081, [SAME_NAMESPACE])]
    for name, objects in rendered.items():
        if not name.startswith("network-policy"):
            assert "webhook" not in _policies(objects), name


def test_a_service_monitor_with_no_scrapers_named_keeps_its_scrapes(tmp_path: Path) -> None:
    values = {"global": {"serviceMonitor": {"enabled": True}}}
    policies = _policies(render(Scenario("scraped", values), tmp_path))
    everywhere = [SAME_NAMESPACE, {"namespaceSelector": {}}]
    assert _rules(policies["controller"]) == [(8080, everywhere)]
    assert _rules(policies["agent"]) == [(8081, everywhere)]


def test_a_web_view_with_tokens_and_no_peers_named_is_open_to_every_source(
    tmp_path: Path,
) -> None:
    values = {"controller": {"web": {"enabled": True, "authenticate": True}}}
    policy = _policies(render(Scenario("web", values), tmp_path))["controller"]
    web = policy["spec"]["ingress"][1]
    assert web == {"ports": [{"port": 8090, "protocol": "TCP"}]}


def test_network_policies_off_render_none(tmp_path: Path) -> None:
    objects = render(Scenario("off", {"networkPolicy": {"enabled": False}}), tmp_path)
    assert not find(objects, "NetworkPolicy")


def test_network_policies_admit_only_the_named_peers_to_each_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["network-policy"]
    policies = _policies(objects)
    assert set(policies) == set(COMPONENTS)
    templates = pod_templates(objects)
    apiserver = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    monitoring = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        }
    ]
    ingress = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    for component, policy in policies.items():
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        labels = templates[component]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= labels.items()
        # Selects its own component's pods only.
        for other, template in templates.items():
            if other != component:
                assert not spec["podSelector"]["matchLabels"].items() <= (
                    template["metadata"]["labels"].items()
                )
        for rule in spec["ingress"]:
            assert [p["protocol"] for p in rule["ports"]] == ["TCP"]
        ports = {p["containerPort"] for p in container(objects, component)["ports"]}
        assert {port for port, _ in _rules(policy)} <= ports
    assert _rules(policies["webhook"]) == [(8443, apiserver), (8443, monitoring)]
    assert _rules(policies["controller"]) == [
        (8080, [SAME_NAMESPACE, *monitoring]),
        (8090, ingress),
    ]
    assert _rules(policies["agent"]) == [(8081, [SAME_NAMESPACE, *monitoring])]


def test_network_policies_with_no_scrapers_admit_only_the_apiserver(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    policies = _policies(rendered["network-policy-closed"])
    peer = {"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.9.0/24"]}}
    assert _rules(policies["webhook"]) == [(8443, [peer])]
    # The web view without tokens listens inside the pod: no rule for its port.
    assert _rules(policies["controller"]) == [(8080, [SAME_NAMESPACE])]
    assert _rules(policies["agent"]) == [(8081, [SAME_NAMESPACE])]


def test_the_webhook_policy_waits_for_the_apiservers_addresses() -> None:
    """A policy that missed the apiserver would refuse every placed pod: none is rendered
    until networkPolicy.webhook.from names it."""
    result = helm(
        "template", "gpuplace", str(CHART), "--namespace", NAMESPACE,
        "--set", "networkPolicy.enabled=true",
    )  # fmt: skip
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert set(_policies(objects)) == {"controller", "agent"}


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ('{"ipblock": {"cidr": "10.0.0.0/8"}}', "'ipblock' not allowed"),
        ('{"ipBlock": {"except": ["10.1.0.0/16"]}}', "/networkPolicy/webhook/from/0/ipBlock"),
        ("{}", "/networkPolicy/webhook/from/0"),
    ],
)
def test_network_policy_peers_are_checked_by_the_schema(peer: str, message: str) -> None:
    result = helm(
        "template",
        "gpuplace",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        f"networkPolicy.webhook.from=[{peer}]",
        check=False,
    )
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr
