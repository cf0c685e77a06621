"""The DRA benchmark's workload: the DeviceClass, the claims and pods of kube-scheduler's
contender, each slot's device as its ResourceSlice names it; the writes a run counts, the check
that every contender placed the same devices, and what a run measured (`DraRun`, `DraResults`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from bench._kube import Obj
from bench._runs import RunResult
from bench._stats import counter_delta, counter_totals
from bench._workload import NAMESPACE, Scale, bench_pod, gpu_uuid, pod_name
from kubeio.paths import RESOURCE_CLAIMS
from placement.dra import RESOURCE_API, DraDevice, DraSettings, claim_spec, device_name
from placement.types import GpuUuid, NodeName

SETTINGS = DraSettings()
#: The claim entry of kube-scheduler's and the minimal client's pods.
CLAIM_ENTRY = "gpu"
MINIMAL_CONCURRENCY = (32, 128)
#: kube-scheduler's DRA scheduling may be slow: a run reports what it bound by then.
SCHEDULER_CAP = 240.0
RUN_TIMEOUT = 300.0
TARGET_VS_SCHEDULER = 5.0
TARGET_VS_MINIMAL = 0.8
VS_MINIMAL = "DRA drain / minimal claim+Binding client"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
#: The delete-protection finalizer: an update of the claim itself, not of its status.
FINALIZER_VERBS = frozenset({"PUT", "PATCH"})
CLAIM_METADATA = frozenset({("resourceclaims", "")})
FINALIZER_METRIC = "gpuplace_claim_finalizer_writes_total"
#: Its `when` of the finalizers written as the claims appeared (not on the Binding path).
SEEN = "seen"
#: What the contenders write to place a pod: its claim (created, finalizer, status) and Binding.
PLACEMENT_RESOURCES = frozenset(
    {("resourceclaims", ""), ("resourceclaims", "status"), ("pods", "binding")}
)
CLAIMS = RESOURCE_CLAIMS.collection(NAMESPACE)
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def device_class(settings: DraSettings) -> Obj:
    """The DeviceClass kube-scheduler's claims request: every device of the driver."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": settings.device_class},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{settings.driver}"'}}]},
    }


def uuid_selector(uuid: str, settings: DraSettings) -> str:
    """The CEL expression that selects the device whose UUID attribute is `uuid`; an unqualified
    attribute is in the driver's domain, as the slices publish it."""
    domain, _, attribute = settings.attribute.rpartition("/")
    return f'device.attributes["{domain or settings.driver}"].{attribute} == "{uuid}"'


def cel_claim(scale: Scale, pod: int, run: int, settings: DraSettings = SETTINGS) -> Obj:
    """The claim a kube-scheduler user writes for the slot: exactly its GPU, by UUID."""
    uuid = gpu_uuid(pod % scale.nodes, scale.device(pod))
    selector = uuid_selector(uuid, settings)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": pod_name(scale, pod, run)},
        "spec": claim_spec(settings, {"selectors": [{"cel": {"expression": selector}}]}),
    }


def _claim_pod(name: str, spec: Obj) -> Obj:
    """A pod whose container uses the claim of the pod's name."""
    spec = {"resourceClaims": [{"name": CLAIM_ENTRY, "resourceClaimName": name}], **spec}
    return bench_pod(name, {}, spec, {"claims": [{"name": CLAIM_ENTRY}]})


def cel_pod(scale: Scale, pod: int, run: int) -> Obj:
    """kube-scheduler's pod: its own claim, pinned to the slot's node by required node affinity."""
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [scale.node(pod)]}
        ]
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return _claim_pod(pod_name(scale, pod, run), {"affinity": affinity})


def cel_only_pod(scale: Scale, pod: int, run: int) -> Obj:
    """kube-scheduler's pod as a DRA user writes it: only the claim's CEL picks device and node."""
    return _claim_pod(pod_name(scale, pod, run), {})


def slot_device(scale: Scale, pod: int) -> DraDevice:
    """The slot's GPU as its ResourceSlice names it (one pool per node, named after it)."""
    node = NodeName(scale.node(pod))
    index = scale.device(pod)
    return DraDevice(node, node, device_name(index), GpuUuid(gpu_uuid(pod % scale.nodes, index)))


def writes_per_pod(
    before: str,
    after: str,
    pods: int,
    resources: Iterable[tuple[str, str]] | None = None,
    verbs: Iterable[str] = WRITE_VERBS,
) -> float:
    """API writes per pod between two scrapes of the apiserver's /metrics
    (apiserver_request_total), over `resources` ((resource, subresource) pairs) or all, counting
    `verbs` (every write verb by default)."""
    wanted = None if resources is None else set(resources)
    written = set(verbs)
    by = ("verb", "resource", "subresource")
    delta = counter_delta(
        *(counter_totals(text, "apiserver_request_total", by) for text in (before, after))
    )
    total = sum(
        count
        for (verb, resource, sub), count in delta.items()
        if verb in written and (wanted is None or (resource, sub) in wanted)
    )
    return total / pods


def allocation_errors(claims: Iterable[Obj], expected: Mapping[str, DraDevice]) -> list[str]:
    """What differs from the plan: every pod of `expected` (pod name -> its slot's device) must
    have exactly one claim reserved for it, allocated exactly that device on its node."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        for reserved in status.get("reservedFor") or []:
            found.setdefault(str(reserved.get("name")), []).extend(
                (str(r.get("driver")), str(r.get("pool")), str(r.get("device"))) for r in results
            )
    errors = []
    for pod, device in sorted(expected.items()):
        want = [(SETTINGS.driver, device.pool, device.name)]
        if found.get(pod) != want:
            errors.append(f"{pod}: allocated {found.get(pod, [])}, planned {want}")
    return errors


def placement_rate(allocated: Iterable[float], bound: Iterable[float]) -> float:
    """Pods bound per second from the first claim seen allocated to the last pod seen bound:
    a contender that writes every claim before its first Binding (kube-scheduler's pipeline)
    and one that writes claim and Binding pod by pod are timed over the same work."""
    times = list(bound)
    seconds = max(times) - min(allocated)
    return len(times) / seconds if seconds > 0 else float("inf")


def with_placement_rate(
    result: RunResult, allocated: Iterable[float], bound: Iterable[float]
) -> RunResult:
    """The drain's result timed from the first allocation; its first -> last Binding rate stays
    in the details."""
    return replace(
        result,
        rate=placement_rate(allocated, bound),
        extra=result.extra | {"pods/s, first -> last Binding": result.rate},
    )


@dataclass(frozen=True)
class DraRun:
    result: RunResult
    placement_writes: float
    all_writes: float
    #: Of `placement_writes`: the claims' delete-protection finalizers.
    finalizer_writes: float = float("nan")


@dataclass
class DraResults:
    gpuplace_burst: list[DraRun] = field(default_factory=list)
    gpuplace_drain: list[DraRun] = field(default_factory=list)
    scheduler_burst: list[DraRun] = field(default_factory=list)
    scheduler_drain: list[DraRun] = field(default_factory=list)
    scheduler_cel_only: list[DraRun] = field(default_factory=list)
    minimal: list[DraRun] = field(default_factory=list)
    minimal_search: dict[int, float] = field(default_factory=dict)
