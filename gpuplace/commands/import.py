# ruff: noqa: N999 - the module is named after its subcommand, `gpuplace import`
"""`gpuplace import`: maps that declare where the GPU pods of a cluster run now, so that
switching them to gpuplace moves no pod.

One map a workload (a StatefulSet, Job, JobSet, LeaderWorkerSet, Deployment, or a bare pod),
one file each under the cluster directory's maps folder, with its configMapGenerator entry in
the directory's kustomization (the layout of examples/gitops). Pods with a rank (a StatefulSet
ordinal, an Indexed Job's completion index, JobSet's, LeaderWorkerSet's, Kueue's) take the slot
of their rank (indexing: auto). Pods without one (a Deployment's) get slots in the order of node
and lowest GPU index they hold now, with indexing: allocate: a replacement pod takes the lowest
free slot, the one its predecessor freed, when they are replaced one at a time (maxSurge 0).

What each pod holds comes from its node's kubelet (the PodResources API, which the agent reads
from the kubelet's pod-resources socket and publishes beside the inventory): device-plugin GPUs
(`nvidia.com/gpu`, named by UUID) and DRA devices, resolved to GPU UUIDs through the driver's
ResourceSlices. Where the kubelet lists no DRA devices for a pod that has claims (a kubelet
version or feature gate that does not), the claims' allocations are read from the apiserver,
and the output says so. Nodes are written by their logical name (the gpu-node-name label) where
they carry one.

The new maps are checked as `gpuplace validate` checks them (schema, conflicts with each other
and with the repository's maps, the grants the cluster serves) and against the served model; a
map that fails is not written and is listed. The plan of the change against the live cluster is
printed as `gpuplace plan` prints it: it adds slots and moves no pod.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplace.commands._args import documented_command
from gpuplace.commands._authoring import (
    AuthoringError,
    Cluster,
    Workspace,
    add_repo_flags,
    claims,
    connect,
    dra_devices,
    finish,
    open_workspace,
    read_cluster,
)
from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.paths import PODS
from kubeio.pod import Pod
from placement.annotations import JOBSET_NAME_LABEL, MAP_LABEL
from placement.authoring import (
    NEW_KUSTOMIZATION,
    ImportedMap,
    RunningGpuPod,
    add_generators,
    add_resources,
    import_maps,
    listed_resources,
    maps_folder,
)
from placement.dra import DraDevice, DraSettings, read_claim
from placement.errors import Diagnostic, PlacementError
from placement.grants import check_map
from placement.indexing import IndexSource, PodIdentity, resolve_index
from placement.kustomize import KUSTOMIZATION_NAMES
from placement.podresources import NVIDIA_GPU_RESOURCE, PodDevices, plugin_gpus
from placement.snapshot import load_snapshot
from placement.types import GpuUuid, Indexing, NodeName

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
POD_TEMPLATE_HASH = "pod-template-hash"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers, "import", "write maps that declare where the running GPU pods are now", __doc__
    )
    add_repo_flags(parser)
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="only the pods of this namespace (repeatable; default: every namespace)",
    )
    parser.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME",
        help=f"device-plugin resource of whole GPUs (repeatable; default {NVIDIA_GPU_RESOURCE})",
    )
    parser.add_argument(
        "--dra-driver",
        default=DraSettings().driver,
        help="DRA driver of the GPUs (default %(default)s)",
    )
    parser.set_defaults(handler=run)


def workload_of(pod: Pod) -> tuple[str, str]:
    """(kind, name) of the workload that made the pod: its controller, a Deployment above a
    ReplicaSet, a JobSet or LeaderWorkerSet above their Jobs and pods; the pod itself if none."""
    owner = next(
        (o for o in pod.obj["metadata"].get("ownerReferences") or () if o.get("controller")), None
    )
    if LWS_NAME_LABEL in pod.labels:
        return "LeaderWorkerSet", pod.labels[LWS_NAME_LABEL]
    if JOBSET_NAME_LABEL in pod.labels:
        return "JobSet", pod.labels[JOBSET_NAME_LABEL]
    if owner is None:
        return "Pod", pod.name
    kind, name = str(owner.get("kind", "")), str(owner.get("name", ""))
    template_hash = pod.labels.get(POD_TEMPLATE_HASH, "")
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return "Deployment", name[: -len(template_hash) - 1]
    return kind, name


def rank_of(pod: Pod) -> tuple[int | None, str]:
    identity = PodIdentity(pod.name, pod.labels, pod.owner_kind, pod.generated, pod.annotations)
    choice = resolve_index(identity, Indexing.AUTO)
    if choice.index is None or choice.error or choice.source is IndexSource.ALLOCATE:
        return None, ""
    return choice.index, choice.source.value


def pod_claims(pod: Pod) -> list[str]:
    """The names of the ResourceClaims the pod uses (its own, or generated from templates)."""
    out = []
    for entry in (pod.obj.get("spec") or {}).get("resourceClaims") or ():
        name = entry.get("resourceClaimName") or pod.generated_claim(str(entry.get("name")))
        if name:
            out.append(str(name))
    return out


class PodReader:
    """Reads what each running pod holds: the kubelet's account where its agent published one,
    the claims' allocations from the apiserver for DRA devices the kubelet did not list."""

    def __init__(self, kube: Kube, cluster: Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.resources = tuple(args.resource) or (NVIDIA_GPU_RESOURCE,)
        settings = DraSettings(driver=args.dra_driver)
        self.driver = settings.driver
        self.devices: Mapping[tuple[str, str, str], DraDevice] = dra_devices(kube, settings)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.kube = kube
        self.notes: list[str] = []

    def read(self, namespaces: Iterable[str | None]) -> list[RunningGpuPod]:
        out: list[RunningGpuPod] = []
        for namespace in namespaces:
            self.claims.update(claims(self.kube, namespace))
            for obj in self.kube.get(PODS.collection(namespace))["items"]:
                pod = Pod.of(obj)
                if not pod.bound or pod.finished or pod.deleting or MAP_LABEL in pod.labels:
                    continue
                found = self.pod(pod)
                if found is not None:
                    out.append(found)
        return out

    def _gpu(self, node: NodeName, key: tuple[str, str, str], pod: Pod) -> str | None:
        device = self.devices.get(key)
        if device is None or device.node != node:
            self.notes.append(
                f"pod {pod.key}: DRA device {'/'.join(key)} is in no ResourceSlice of node {node}"
            )
            return None
        if device.parent is not None:
            self.notes.append(
                f"pod {pod.key}: holds MIG device {device.uuid}: not imported (write its `mig:` entry by hand)"
            )
            return None
        return device.uuid

    def pod(self, pod: Pod) -> RunningGpuPod | None:
        node = NodeName(pod.node_name)
        record = self.cluster.pod_resources.get(node)
        listed = record.pod(pod.namespace, pod.name) if record is not None else None
        uuids: list[str] = []
        sources: list[str] = []
        if listed is not None and not self._from_kubelet(pod, listed, uuids, sources):
            return None
        if pod_claims(pod) and not (listed is not None and listed.claims):
            why = (
                f"no pod resources published for node {node}"
                if record is None
                else "the kubelet's pod resources list no DRA devices for it"
            )
            found = self._from_apiserver(pod)
            if found is None:
                return None
            if found:
                uuids += found
                sources.append(f"DRA claims read from the apiserver ({why})")
        if not uuids:
            return None
        inventory = self.cluster.inventories.get(node)
        missing = [u for u in uuids if inventory is None or u not in inventory.by_uuid]
        if missing:
            self.notes.append(
                f"pod {pod.key}: GPU(s) {', '.join(missing)} not in node {node}'s inventory: "
                "not imported"
            )
            return None
        kind, workload = workload_of(pod)
        rank, how = rank_of(pod)
        return RunningGpuPod(
            pod.namespace,
            pod.name,
            node,
            tuple(GpuUuid(u) for u in dict.fromkeys(uuids)),
            kind,
            workload,
            rank,
            how,
            pod.created,
            "; ".join(sources),
        )

    def _from_kubelet(
        self, pod: Pod, listed: PodDevices, uuids: list[str], sources: list[str]
    ) -> bool:
        """Adds what the kubelet lists for the pod; False when the pod is not imported."""
        gpus, other = plugin_gpus(listed.plugin, self.resources)
        if other:
            self.notes.append(
                f"pod {pod.key}: device IDs {', '.join(other)} name no whole GPU: not imported"
            )
            return False
        if gpus:
            uuids += gpus
            sources.append("device plugin (kubelet pod resources)")
        for c in listed.claims:
            gpu = self._gpu(NodeName(pod.node_name), (c.driver, c.pool, c.device), pod)
            if gpu is None:
                return False
            uuids.append(gpu)
        if listed.claims:
            sources.append("DRA (kubelet pod resources)")
        return True

    def _from_apiserver(self, pod: Pod) -> list[str] | None:
        """The GPUs the pod's claims' allocations name; None when the pod is not imported."""
        out: list[str] = []
        for name in pod_claims(pod):
            claim = self.claims.get((pod.namespace, name))
            if claim is None:
                continue
            for driver, pool, device in read_claim(claim).allocated:
                if driver != self.driver:
                    continue
                gpu = self._gpu(NodeName(pod.node_name), (driver, pool, device), pod)
                if gpu is None:
                    return None
                out.append(gpu)
        return out


def serves_resources(ws: Workspace, kustomization: str, path: str) -> bool:
    """Whether the kustomization serves its maps as PlacementMap custom resources (listed under
    `resources:`, none generated as ConfigMaps, as after `gpuplace migrate`): the imported maps
    are then listed the same way."""
    listed, generates = listed_resources(kustomization, path)
    if generates:
        return False
    folder = posixpath.dirname(path)
    for entry in listed:
        text = ws.files.get(posixpath.normpath(posixpath.join(folder, entry)), "")
        if re.search(r"^kind:\s*PlacementMap\s*$", text, re.MULTILINE):
            return True
    return False


def kustomization_of(ws: Workspace) -> str | None:
    for name in KUSTOMIZATION_NAMES:
        path = posixpath.join(ws.directory, name) if ws.directory else name
        if (ws.top / path).is_file():
            return path
    return None


def checked(
    ws: Workspace, cluster: Cluster, new: dict[str, ImportedMap]
) -> tuple[dict[str, ImportedMap], list[Diagnostic]]:
    """The new maps (path -> map) that validate, clash with no other map of the repository or
    of the served model and keep within the grants; the problems of the others."""
    files = dict(ws.files) | {path: m.text() for path, m in new.items()}
    snapshot = load_snapshot(files)
    bad: dict[str, list[Diagnostic]] = {}
    for invalid in snapshot.invalid:
        if invalid.source in new:
            bad.setdefault(invalid.source, []).extend(invalid.diagnostics)
    for clash in snapshot.clashes:
        for claimant in (clash.first, clash.second):
            where = claimant.slot.location.source
            if where in new:
                bad.setdefault(where, []).append(clash.diagnostic())
    for entry in snapshot.maps.values():
        if entry.source not in new:
            continue
        problems = check_map(cluster.model.grants, entry.map)
        for slot in entry.map.slots:
            node = cluster.aliases().get(slot.node, NodeName(slot.node))
            for gpu in slot.devices:
                others = [
                    k for k in cluster.model.declared_by(node, str(gpu)) if k.map != entry.map.key
                ]
                if others and not new[entry.source].shared:
                    problems.append(
                        Diagnostic(
                            slot.location,
                            f"index {slot.index}: GPU {gpu} on {node} is declared by "
                            f"{', '.join(map(str, others))} in the served model",
                        )
                    )
        if problems:
            bad.setdefault(entry.source, []).extend(problems)
    good = {p: m for p, m in new.items() if p not in bad}
    return good, [d for p in sorted(bad) for d in bad[p]]


def run(args: argparse.Namespace) -> int:
    try:
        ws = open_workspace(args.repo, args.dir)
        kube = connect(args)
        cluster = read_cluster(kube)
        reader = PodReader(kube, cluster, args)
        pods = reader.read(args.namespace or [None])
    except (AuthoringError, APIError, OSError) as exc:
        print(f"gpuplace import: error: {exc}", file=sys.stderr)
        return 1
    existing = [m.key for m in ws.maps()]
    result = import_maps(pods, cluster.logical(), cluster.inventories, existing)
    kustomization = kustomization_of(ws)
    folder = "maps"
    if kustomization is not None:
        folder = maps_folder((ws.top / kustomization).read_text(encoding="utf-8"), kustomization)
    new: dict[str, ImportedMap] = {}
    notes = [*reader.notes, *result.skipped]
    for imported in result.maps:
        relative = posixpath.join(folder, f"{imported.key.name}.yaml")
        path = posixpath.join(ws.directory, relative) if ws.directory else relative
        if (ws.top / path).exists():
            notes.append(f"map {imported.key}: {path} exists already: not written")
            continue
        new[path] = imported
    good, problems = checked(ws, cluster, new)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"not written: {problem.format()}", file=sys.stderr)
    changed = {path: m.text() for path, m in good.items()}
    if good:
        kpath = kustomization or (
            posixpath.join(ws.directory, "kustomization.yaml")
            if ws.directory
            else "kustomization.yaml"
        )
        before = (
            (ws.top / kpath).read_text(encoding="utf-8") if kustomization else NEW_KUSTOMIZATION
        )
        base = ws.directory
        entries = [(m.key, posixpath.relpath(p, base or ".")) for p, m in sorted(good.items())]
        try:
            if serves_resources(ws, before, kpath):
                changed[kpath] = add_resources(before, kpath, [file for _, file in entries])
            else:
                changed[kpath] = add_generators(before, kpath, entries)
        except (PlacementError, ValueError) as exc:
            print(f"gpuplace import: error: {exc}", file=sys.stderr)
            return 1
    for path, imported in sorted(good.items()):
        print(
            f"imported: {imported.workload_kind} {imported.key.namespace}/{imported.workload} "
            f"-> {path} ({len(imported.slots)} slots)",
            file=sys.stderr,
        )
    if not good:
        print("Nothing to import.", file=sys.stderr)
    slots = sum(len(m.slots) for m in good.values())
    subject = f"gpuplace import: {len(good)} map(s), {slots} slot(s) where the GPU pods run now"
    body = [
        f"{m.workload_kind} {m.key.namespace}/{m.workload}: {p}" for p, m in sorted(good.items())
    ]
    body += [
        "",
        "Switching these workloads to gpuplace moves no pod: each slot is where its pod runs.",
    ]
    code, _ = finish(args, ws, changed, subject, body)
    return code or (1 if problems else 0)
