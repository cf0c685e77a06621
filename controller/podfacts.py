"""What the binder reads of a pod (`kubeio.pod.Pod`, read once per event): its facts for a
decision, and a bound pod's binding, decoded and judged once."""

from __future__ import annotations

from dataclasses import replace

from controller.legacyscope import LegacyScope
from controller.settings import BinderSettings
from controller.slotcache import Holding
from controller.trustreport import Judged
from kubeio.pod import Pod
from placement.admitted import not_admitted
from placement.annotations import (
    UNVERIFIABLE_CONDITION,
    BindingDecision,
    decode_binding,
    legacy_map_key,
)
from placement.binding import Cluster, PodFacts
from placement.devices import GpuId
from placement.gate import Path, identify, judge
from placement.keyring import TrustView, Verdict
from placement.nodes import resolve_node
from placement.podmeta import legacy_text_of, map_name_of, prebound_line, rank_annotations_of
from placement.types import NodeName, Sharing, SlotKey

#: No legacy namespace selector: every namespace.
EVERY = LegacyScope()


def is_legacy(pod: Pod, settings: BinderSettings, scope: LegacyScope = EVERY) -> bool:
    """Whether a pod is the earlier tools' (one of their schedulerNames) in a namespace the legacy
    selector chooses: only those are placed or hold GPUs by a gpu-scheduling-map line of their
    own; a pod of the binder's name carrying one, or one of another namespace, skipped the
    legacy checks of the webhook and never does."""
    return (
        settings.legacy
        and pod.scheduler_name in settings.legacy_scheduler_names
        and scope.selects(pod.namespace)
    )


def facts_for(pod: Pod, settings: BinderSettings, scope: LegacyScope = EVERY) -> PodFacts:
    """The pod's facts for a decision; a legacy pod outside the selector is told why it waits."""
    if is_legacy(pod, settings, scope):
        return facts(pod, legacy=True)
    out = facts(pod, legacy=False)
    if (
        settings.legacy
        and pod.scheduler_name in settings.legacy_scheduler_names
        and legacy_text_of(pod) is not None
    ):
        return replace(out, legacy_refused=scope.refusal(pod.namespace))
    return out


def facts(pod: Pod, legacy: bool) -> PodFacts:
    map_name = map_name_of(pod)
    return PodFacts(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        labels=pod.labels,
        owner_kind=pod.owner_kind,
        generated_name=pod.generated,
        rank_annotations=rank_annotations_of(pod),
        map_name=map_name,
        legacy_map=legacy_text_of(pod) if legacy else None,
        not_admitted=not_admitted(map_name, pod.containers()) if map_name is not None else "",
    )


def verdict(pod: Pod, trust: TrustView) -> Verdict:
    """What the pod's gpuplace.io/* annotations prove under the key ring (placement/keyring.py)."""
    return trust.judge(pod.uid, pod.namespace, pod.created, pod.annotations)


class BoundPod:
    """A bound pod as one event brings it: its binding decoded, and judged under the key ring, at
    most once (when first asked), however many parts of the controller look at it."""

    __slots__ = ("_decision", "_verdict", "pod", "trust", "uid")

    def __init__(self, pod: Pod, trust: TrustView | None) -> None:
        self.pod = pod
        self.trust = trust
        self.uid = pod.uid
        self._decision: BindingDecision | object | None = _UNREAD
        self._verdict: Verdict | object | None = _UNREAD

    @property
    def decision(self) -> BindingDecision | None:
        """The binding its annotations declare (None: no gpuplace binding on it)."""
        if self._decision is _UNREAD:
            self._decision = decode_binding(self.pod.namespace, self.pod.annotations)
        return self._decision  # type: ignore[return-value]

    @property
    def verdict(self) -> Verdict | None:
        """What the ring says of that binding (None while no ring is loaded: a standby)."""
        if self._verdict is _UNREAD:
            self._verdict = verdict(self.pod, self.trust) if self.trust is not None else None
        return self._verdict  # type: ignore[return-value]

    @property
    def holds(self) -> bool:
        judged_as = self.verdict
        return judged_as is not None and judged_as.trust.holds

    def judged(self) -> Judged:
        assert self.verdict is not None, "judged without a key ring"
        decision = self.decision
        return Judged(self.pod.ref, decision.map if decision is not None else None, self.verdict)

    def holding(self, shared_maps: set[str]) -> Holding | None:
        """What the pod holds, from the annotations its Binding wrote (rebuild after failover).

        Only a binding the ring proves or cannot disprove holds anything (`Trust.holds`):
        hand-written or rewritten annotations would otherwise let any pod squat GPUs promised to
        another, and a binding whose key was lost must keep its GPUs from everyone else.
        """
        decision = self.decision
        if not self.holds or decision is None:
            return None
        pod = self.pod
        key = decision.map
        if decision.map.name.startswith("legacy."):
            key = legacy_map_key(pod.namespace, pod.name)
        gpus: tuple[str, ...] = tuple(decision.devices)
        if not gpus:
            gpus = tuple(
                GpuId.of_index(int(i))
                for i in decision.cuda_visible_devices.split(",")
                if i.isdigit()
            )
        sharing = Sharing.SHARED if str(key) in shared_maps else Sharing.EXCLUSIVE
        return Holding(
            self.uid,
            pod.key,
            SlotKey(key, decision.index),
            NodeName(pod.node_name),
            gpus,
            sharing,
            assumed=False,
            revision=decision.revision,
        )


_UNREAD = object()


def flagged_unverifiable(pod: Pod) -> bool:
    """Whether the pod's condition says its binding is unverifiable now."""
    return pod.condition(UNVERIFIABLE_CONDITION) is not None


def prebound_legacy(pod: Pod, cluster: Cluster) -> Holding | str | None:
    """What a pod that another scheduler bound holds, by its `gpu-scheduling-map` line (cut-over
    from the earlier tools): a Holding; a reason it holds nothing (the gate refuses it: its line
    resolves to another node than the one it runs on, or outside its namespace's grants); or
    None when it is not such a pod (gpuplace annotations, no line for its index)."""
    line = prebound_line(pod)
    if line is None or line.index is None or line.entry is None:
        return None
    entry = line.entry
    node = NodeName(pod.node_name)
    state = cluster.inventories.get(node)
    inventory = state.inventory if state is not None else None
    devices = identify(inventory, entry.devices)
    # The node it runs on exists, and a node's own name wins over any logical name.
    resolved = (
        node
        if entry.node == node
        else resolve_node(entry.node, cluster.nodes, cluster.aliases, cluster.alias_label).node
    )
    refusal = judge(
        cluster.model.grants,
        pod.namespace,
        Path.PREBOUND,
        resolved,
        devices,
        written=entry.node,
        bound_to=node,
    )
    if refusal is not None:
        return f"pod {pod.key} annotation gpu-scheduling-map: {refusal}"
    # A GPU a served slot declares is not judged here: the webhook refuses a pod created bound
    # onto one (`placement.declared`); one bound before the map declared it (by the earlier
    # tools, before gpuplace) keeps it, on every rebuild of the slot cache alike.
    # Kept by UUID, as binder holdings are, whenever the node's inventory names the device.
    gpus = tuple(
        GpuId.of_uuid(d.uuid) if d.uuid is not None else GpuId.of(ref)
        for d, ref in zip(devices, entry.devices, strict=True)
    )
    return Holding(
        pod.uid,
        pod.key,
        SlotKey(legacy_map_key(pod.namespace, pod.name), line.index),
        node,
        gpus,
        Sharing.EXCLUSIVE,
        assumed=False,
    )
