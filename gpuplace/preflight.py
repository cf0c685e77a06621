"""The preflight Workflow: prove on each declared node, with NVML, that a map's GPUs are there.

`build_workflow` turns a validated `PlacementMap` into an Argo Workflow (argo-workflows SDK models)
with one step per placement entry. Each step runs `gpuplace agent --once --print` on the entry's
node against a one-entry copy of the map, so a step fails exactly when its own entry does: a
missing or unhealthy device, or one that does not match `require`. Annotated as an ArgoCD PreSync
hook, the Workflow gates a sync: the new map is applied only after every entry passed.

Only the `gpuplace preflight` command uses this module, and only it needs the argo-workflows SDK
(the `workflows` extra): the components never import it.

How a step reaches its node without knowing whether the map names nodes or logical names: node
affinity with two ORed terms, the node's name (matchFields metadata.name) or the alias label
(`gpu-node-name` by default), the same two ways the binder resolves `node`.

How a step sees the GPUs without taking them from running pods: it requests no `nvidia.com/gpu`
(the device plugin would hand out arbitrary, maybe busy, devices); NVIDIA_VISIBLE_DEVICES=all
asks the NVIDIA container runtime for every device, so NVML numbers them as the host does, which is
what maps declare. CUDA_VISIBLE_DEVICES carries the entry's devices for anything CUDA-based. On a
node without that runtime, `nvml_host_path` mounts the driver's library directory read-only, as the
chart's `agent.nvml` does for the agent.

How a failure names its entry: the container's termination message falls back to the end of its
output, where `--print` lists the failed checks, so the step's node in the Workflow's status (and
`argo get`) carries the reason, e.g. "device 7 ... not found on node gpu-a-01".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from argo_workflows.api_client import ApiClient
from argo_workflows.model.affinity import Affinity
from argo_workflows.model.capabilities import Capabilities
from argo_workflows.model.container import Container
from argo_workflows.model.env_var import EnvVar
from argo_workflows.model.host_path_volume_source import HostPathVolumeSource
from argo_workflows.model.io_argoproj_workflow_v1alpha1_arguments import (
    IoArgoprojWorkflowV1alpha1Arguments as Arguments,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_artifact import (
    IoArgoprojWorkflowV1alpha1Artifact as Artifact,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_inputs import (
    IoArgoprojWorkflowV1alpha1Inputs as Inputs,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_metadata import (
    IoArgoprojWorkflowV1alpha1Metadata as PodMetadata,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_parallel_steps import (
    IoArgoprojWorkflowV1alpha1ParallelSteps as ParallelSteps,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_parameter import (
    IoArgoprojWorkflowV1alpha1Parameter as Parameter,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_pod_gc import (
    IoArgoprojWorkflowV1alpha1PodGC as PodGC,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_raw_artifact import (
    IoArgoprojWorkflowV1alpha1RawArtifact as RawArtifact,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_template import (
    IoArgoprojWorkflowV1alpha1Template as Template,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_workflow import (
    IoArgoprojWorkflowV1alpha1Workflow as Workflow,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_workflow_spec import (
    IoArgoprojWorkflowV1alpha1WorkflowSpec as WorkflowSpec,
)
from argo_workflows.model.io_argoproj_workflow_v1alpha1_workflow_step import (
    IoArgoprojWorkflowV1alpha1WorkflowStep as WorkflowStep,
)
from argo_workflows.model.node_affinity import NodeAffinity
from argo_workflows.model.node_selector import NodeSelector
from argo_workflows.model.node_selector_requirement import NodeSelectorRequirement
from argo_workflows.model.node_selector_term import NodeSelectorTerm
from argo_workflows.model.object_meta import ObjectMeta
from argo_workflows.model.pod_security_context import PodSecurityContext
from argo_workflows.model.resource_requirements import ResourceRequirements
from argo_workflows.model.seccomp_profile import SeccompProfile
from argo_workflows.model.security_context import SecurityContext
from argo_workflows.model.toleration import Toleration
from argo_workflows.model.volume import Volume
from argo_workflows.model.volume_mount import VolumeMount

from placement.annotations import (
    ENV_CUDA_DEVICE_ORDER,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LEGACY_NODE_LABEL,
)
from placement.maps import DeclaredSlot, PlacementMap
from placement.serialize import slot_document
from placement.types import API_VERSION, KIND

WORKFLOW_API_VERSION = "argoproj.io/v1alpha1"
WORKFLOW_KIND = "Workflow"
DEFAULT_IMAGE = "ghcr.io/gpuplace/gpuplace:0.1.0"
NAME_PREFIX = "gpuplace-preflight-"
DEFAULT_TOLERATIONS = ("nvidia.com/gpu",)
#: Where each step finds its one-entry map (an Argo raw input artifact).
MAP_PATH = "/tmp/gpuplace/placement.yaml"  # noqa: S108 - a per-pod volume Argo mounts there
ENTRYPOINT = "preflight"
CHECK_TEMPLATE = "check-entry"
#: Kubernetes names that end up in pod hostnames must fit a DNS label.
_MAX_NAME = 63
_NONROOT_UID = 65532
#: Where a step mounts `nvml_host_path` (the chart's agent uses the same directory).
NVML_DIR = "/opt/gpuplace/nvml"
NVML_VOLUME = "nvml"


@dataclass(frozen=True, slots=True)
class PreflightSettings:
    """How the Workflow runs; defaults suit a cluster with the NVIDIA runtime as its default."""

    image: str = DEFAULT_IMAGE
    #: Namespace of the Workflow; None puts it in the map's namespace (where ArgoCD syncs the map).
    namespace: str | None = None
    name: str | None = None
    service_account: str | None = None
    #: A RuntimeClass that exposes GPUs (e.g. `nvidia`); None uses the node's default runtime.
    runtime_class: str | None = None
    alias_label: str = LEGACY_NODE_LABEL
    #: Taint keys the steps tolerate (GPU nodes are commonly tainted so only GPU pods land there).
    tolerations: tuple[str, ...] = DEFAULT_TOLERATIONS
    timeout_seconds: int = 600
    parallelism: int = 20
    #: Annotate as an ArgoCD PreSync hook, replaced on every sync.
    argocd_hook: bool = True
    #: A host directory holding libnvidia-ml.so.1, mounted read-only at NVML_DIR and put on
    #: LD_LIBRARY_PATH; None relies on the NVIDIA container runtime to inject the library.
    nvml_host_path: str | None = None
    #: `Directory` or `File`, as the chart's `agent.nvml.hostPathType`.
    nvml_host_path_type: str = "Directory"
    #: Extra environment of the step's container, (name, value) pairs.
    env: tuple[tuple[str, str], ...] = ()


def workflow_name(pmap: PlacementMap, settings: PreflightSettings) -> str:
    return settings.name or bounded_name(NAME_PREFIX + pmap.key.name)


def bounded_name(name: str) -> str:
    """`name` if it fits a DNS label, else a prefix of it plus a hash of the whole (still unique)."""
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9].rstrip('-')}-{digest}"


def step_name(slot: DeclaredSlot) -> str:
    return f"index-{slot.index}"


def entry_document(pmap: PlacementMap, slot: DeclaredSlot) -> str:
    """A PlacementMap with only `slot`, as JSON (which is YAML): what one step checks."""
    placement = slot_document(slot)
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pmap.key.name, "namespace": pmap.key.namespace},
        "spec": {"sharing": pmap.sharing.value, "placements": [placement]},
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def cuda_visible_devices(slot: DeclaredSlot) -> str:
    """The entry's devices as CUDA reads them (indices or UUIDs); empty for `count` entries,
    whose devices the controller picks."""
    return ",".join(str(d) for d in slot.devices)


def _labels(pmap: PlacementMap) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gpuplace",
        "app.kubernetes.io/component": "preflight",
        "app.kubernetes.io/part-of": "gpuplace",
        "app.kubernetes.io/instance": bounded_name(pmap.key.name),
    }


def _step(pmap: PlacementMap, slot: DeclaredSlot) -> Any:
    values = {
        "node": slot.node,
        "cuda-visible-devices": cuda_visible_devices(slot),
        "entry": entry_document(pmap, slot),
    }
    return WorkflowStep(
        name=step_name(slot),
        template=CHECK_TEMPLATE,
        arguments=Arguments(parameters=[Parameter(name=k, value=v) for k, v in values.items()]),
    )


def _node_affinity(alias_label: str) -> Any:
    node = ["{{inputs.parameters.node}}"]
    return Affinity(
        node_affinity=NodeAffinity(
            required_during_scheduling_ignored_during_execution=NodeSelector(
                node_selector_terms=[
                    NodeSelectorTerm(
                        match_fields=[
                            NodeSelectorRequirement(key="metadata.name", operator="In", values=node)
                        ]
                    ),
                    NodeSelectorTerm(
                        match_expressions=[
                            NodeSelectorRequirement(key=alias_label, operator="In", values=node)
                        ]
                    ),
                ]
            )
        )
    )


def _nvml_mount(settings: PreflightSettings) -> tuple[list[Any], list[Any], list[Any]]:
    """The volume, its mount and LD_LIBRARY_PATH for `nvml_host_path`; empty lists without one."""
    if settings.nvml_host_path is None:
        return [], [], []
    volume = Volume(
        name=NVML_VOLUME,
        host_path=HostPathVolumeSource(
            path=settings.nvml_host_path, type=settings.nvml_host_path_type
        ),
    )
    mount_path = NVML_DIR
    if settings.nvml_host_path_type == "File":
        mount_path = f"{NVML_DIR}/{settings.nvml_host_path.rstrip('/').rpartition('/')[2]}"
    mount = VolumeMount(name=NVML_VOLUME, mount_path=mount_path, read_only=True)
    return [volume], [mount], [EnvVar(name="LD_LIBRARY_PATH", value=NVML_DIR)]


def _check_template(settings: PreflightSettings) -> Any:
    volumes, mounts, nvml_env = _nvml_mount(settings)
    extra: dict[str, Any] = {}
    if mounts:
        extra["volume_mounts"] = mounts
    container = Container(
        image=settings.image,
        command=["gpuplace"],
        args=[
            "agent",
            "--once",
            "--print",
            "--node={{inputs.parameters.node}}",
            f"--map={MAP_PATH}",
        ],
        env=[
            EnvVar(name=ENV_NVIDIA_VISIBLE_DEVICES, value="all"),
            EnvVar(name="NVIDIA_DRIVER_CAPABILITIES", value="utility"),
            EnvVar(
                name=ENV_CUDA_VISIBLE_DEVICES, value="{{inputs.parameters.cuda-visible-devices}}"
            ),
            EnvVar(name=ENV_CUDA_DEVICE_ORDER, value="PCI_BUS_ID"),
            *nvml_env,
            *(EnvVar(name=name, value=value) for name, value in settings.env),
        ],
        # On failure the kubelet keeps the end of the output as the termination message, which
        # Argo shows as the step's message: the failed checks, each naming its device.
        termination_message_policy="FallbackToLogsOnError",
        resources=ResourceRequirements(
            requests={"cpu": "10m", "memory": "64Mi"}, limits={"memory": "256Mi"}
        ),
        security_context=SecurityContext(
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            run_as_non_root=True,
            capabilities=Capabilities(drop=["ALL"]),
        ),
        **extra,
    )
    template_extra: dict[str, Any] = {"volumes": volumes} if volumes else {}
    return Template(
        name=CHECK_TEMPLATE,
        inputs=Inputs(
            parameters=[
                Parameter(name="node"),
                Parameter(name="cuda-visible-devices"),
                Parameter(name="entry"),
            ],
            artifacts=[
                Artifact(
                    name="entry",
                    path=MAP_PATH,
                    raw=RawArtifact(data="{{inputs.parameters.entry}}"),
                )
            ],
        ),
        affinity=_node_affinity(settings.alias_label),
        tolerations=[
            Toleration(key=key, operator="Exists", effect="NoSchedule")
            for key in settings.tolerations
        ],
        container=container,
        **template_extra,
    )


def build_workflow(pmap: PlacementMap, settings: PreflightSettings | None = None) -> Any:
    """The Workflow (an `IoArgoprojWorkflowV1alpha1Workflow`) that checks every entry of `pmap`."""
    settings = settings or PreflightSettings()
    annotations = {
        "workflows.argoproj.io/description": (
            f"gpuplace preflight for placement map {pmap.key}: checks every entry's GPUs with "
            "NVML on its node before the map is synced"
        ),
    }
    if settings.argocd_hook:
        annotations["argocd.argoproj.io/hook"] = "PreSync"
        # A named hook is replaced on the next sync; the last run stays for inspection.
        annotations["argocd.argoproj.io/hook-delete-policy"] = "BeforeHookCreation"
    spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        "templates": [
            Template(
                name=ENTRYPOINT,
                # One parallel group: every entry is checked, so one run reports every problem.
                steps=[ParallelSteps([_step(pmap, slot) for slot in pmap.slots])],
            ),
            _check_template(settings),
        ],
        "parallelism": settings.parallelism,
        "active_deadline_seconds": settings.timeout_seconds,
        "pod_gc": PodGC(strategy="OnPodSuccess"),
        "pod_metadata": PodMetadata(labels=_labels(pmap)),
        "security_context": PodSecurityContext(
            run_as_non_root=True,
            run_as_user=_NONROOT_UID,
            run_as_group=_NONROOT_UID,
            seccomp_profile=SeccompProfile(type="RuntimeDefault"),
        ),
    }
    if settings.service_account:
        spec["service_account_name"] = settings.service_account
    if settings.runtime_class:
        # Templates have no runtimeClassName field; the pod spec patch is Argo's way to set it.
        spec["pod_spec_patch"] = json.dumps({"runtimeClassName": settings.runtime_class})
    return Workflow(
        api_version=WORKFLOW_API_VERSION,
        kind=WORKFLOW_KIND,
        metadata=ObjectMeta(
            name=workflow_name(pmap, settings),
            namespace=settings.namespace or pmap.key.namespace,
            labels=_labels(pmap),
            annotations=annotations,
        ),
        spec=WorkflowSpec(**spec),
    )


def workflow_manifest(
    pmap: PlacementMap, settings: PreflightSettings | None = None
) -> dict[str, Any]:
    """The Workflow as a plain manifest (camelCase keys), ready for YAML or the apiserver."""
    manifest = ApiClient.sanitize_for_serialization(build_workflow(pmap, settings))
    if not isinstance(manifest, dict):
        raise TypeError(f"the SDK serialized the Workflow as {type(manifest).__name__}")
    # Kubernetes readers expect apiVersion and kind first.
    head = {"apiVersion": manifest.pop("apiVersion"), "kind": manifest.pop("kind")}
    return head | manifest
