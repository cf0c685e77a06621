"""The placement benchmark's cluster and gpuplace in `dra` enforcement, with a ResourceSlice a
node: what the DRA contenders' runs share (their claims made and cleared, watched and checked,
their writes counted, the nodes cordoned, the controller's finalizer writes read)."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from bench._bench import ClusterBench
from bench._dra_workload import (
    CLAIM_METADATA,
    CLAIMS,
    FINALIZER_METRIC,
    FINALIZER_VERBS,
    PLACEMENT_RESOURCES,
    RUN_TIMEOUT,
    SETTINGS,
    UNSCHEDULABLE_TAINT,
    DraRun,
    allocation_errors,
    cel_claim,
    cel_pod,
    device_class,
    slot_device,
    with_placement_rate,
    writes_per_pod,
)
from bench._kube import Obj, Observed, PodWatch, call, concurrently, create_pods
from bench._proc import BenchError
from bench._runs import RunResult, Usage, drain_result
from bench._stats import counter_totals
from bench._workload import (
    CREATE_THREADS,
    NAMESPACE,
    PROBE,
    SETUP_THREADS,
    Scale,
    inventory,
    node_name,
    pod_name,
)
from kubeio.paths import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from placement.dra import Enforcement, slice_for


class DraCluster(ClusterBench):
    """The placement benchmark's cluster and gpuplace in `dra` enforcement, with slices."""

    enforcement = Enforcement.DRA.value

    def setup(self) -> None:
        super().setup()
        call(
            self.cluster, "POST", DEVICE_CLASSES.collection(), device_class(SETTINGS), wanted={201}
        )

        def publish(n: int) -> None:
            body = slice_for(inventory(n, self.scale.gpus), SETTINGS)
            call(self.cluster, "POST", RESOURCE_SLICES.collection(), body, wanted={201})

        concurrently(list(range(self.scale.nodes)), publish, SETUP_THREADS)
        self.log(f"{self.scale.nodes} ResourceSlices published")

    # -- helpers ---------------------------------------------------------------------------------
    def _count(self, path: str) -> int:
        return len(call(self.cluster, "GET", path)["items"])

    def _create_generating_claims(self, pods: Sequence[Obj]) -> None:
        """Creates the map's pods and waits for kube-controller-manager to generate each claim."""
        create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
        self.cluster.wait_for(
            "kube-controller-manager to generate every pod's claim",
            lambda: self._claims_made() >= len(pods),
            RUN_TIMEOUT,
            interval=0.5,
        )

    def _generated_claims(self) -> tuple[dict[str, str], dict[str, str]]:
        """Each pod's generated claim's name and each pod's uid, by pod name."""
        claims: dict[str, str] = {}
        uids: dict[str, str] = {}
        for pod in call(self.cluster, "GET", PODS.collection(NAMESPACE))["items"]:
            name = pod["metadata"]["name"]
            uids[name] = pod["metadata"]["uid"]
            for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
                if status.get("resourceClaimName"):
                    claims[name] = status["resourceClaimName"]
        return claims, uids

    def _claims_made(self) -> int:
        """Pods whose claim kube-controller-manager has generated."""
        body = call(self.cluster, "GET", PODS.collection(NAMESPACE))
        return sum(1 for p in body["items"] if (p.get("status") or {}).get("resourceClaimStatuses"))

    def _clear_claims(self, pods: Sequence[Obj], delete: bool) -> None:
        """Deletes the pods; then the claims (`delete`: the bench made them) and waits until none
        is left, so the next run finds every device free."""
        self._clear(pods)
        if delete:
            names = [pod["metadata"]["name"] for pod in pods]

            def remove(name: str) -> None:
                call(
                    self.cluster,
                    "DELETE",
                    RESOURCE_CLAIMS.item(name, NAMESPACE),
                    wanted={200, 202, 404},
                )

            concurrently(names, remove, CREATE_THREADS)
        self.cluster.wait_for(
            "every claim of the run to be gone",
            lambda: self._count(f"{CLAIMS}?limit=1") == 0,
            RUN_TIMEOUT,
            interval=0.5,
        )
        self._quiesce()

    def _watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return self._watching(PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout))

    def _claim_watch(self, timeout: float = RUN_TIMEOUT) -> PodWatch:
        return self._watching(
            PodWatch(self.cluster, NAMESPACE, self.scale.pods, timeout, claims=True)
        )

    @contextlib.contextmanager
    def _watching_claims(self, timeout: float = RUN_TIMEOUT) -> Iterator[tuple[PodWatch, PodWatch]]:
        """A watch of the run's pods and one of their claims, both stopped after the block."""
        watch, claims = self._watch(timeout), self._claim_watch(timeout)
        try:
            yield watch, claims
        finally:
            watch.stop()
            claims.stop()

    def _check(self, run: int, bound: Iterable[str]) -> None:
        """Every bound pod of the run got its slot's device: the contenders placed the same."""
        body = call(self.cluster, "GET", CLAIMS)
        slots = {pod_name(self.scale, p, run): p for p in range(self.scale.pods)}
        expected = {name: slot_device(self.scale, slots[name]) for name in bound}
        errors = allocation_errors(body["items"], expected)
        if errors:
            raise BenchError(f"{len(errors)} pods without their planned device: {errors[:3]}")

    def _drained(
        self,
        run: int,
        pods: Sequence[Obj],
        delete: bool,
        seen: Observed,
        allocated: Observed,
        started: float,
        usage: Usage,
    ) -> RunResult:
        """Checks a drain's placements and clears its pods and claims (`delete`: as in
        `_clear_claims`); its result, timed from the first claim seen `allocated`."""
        self._check(run, seen.bound)
        self._clear_claims(pods, delete=delete)
        result = drain_result(seen, started, usage)
        return with_placement_rate(result, allocated.bound.values(), seen.bound.values())

    def _writes(self, metrics: list[str], result: RunResult) -> DraRun:
        pods = self.scale.pods
        return DraRun(
            result,
            writes_per_pod(metrics[0], metrics[1], pods, PLACEMENT_RESOURCES),
            writes_per_pod(metrics[0], metrics[1], pods),
            writes_per_pod(metrics[0], metrics[1], pods, CLAIM_METADATA, FINALIZER_VERBS),
        )

    def _create_with_claims(
        self, run: int, build: Callable[[Scale, int, int], Obj]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Creates every slot's claim, then its pod; returns when each claim's create was sent
        and each pod's uid."""
        order = self.scale.creation_order()

        def create(pod: int) -> tuple[float, str]:
            claim, body = cel_claim(self.scale, pod, run), build(self.scale, pod, run)
            sent = time.monotonic()
            call(self.cluster, "POST", CLAIMS, claim, wanted={201})
            response = call(self.cluster, "POST", PODS.collection(NAMESPACE), body, wanted={201})
            return sent, str(response["metadata"]["uid"])

        results = concurrently(order, create, CREATE_THREADS)
        names = [pod_name(self.scale, p, run) for p in order]
        return (
            {n: sent for n, (sent, _) in zip(names, results, strict=True)},
            {n: uid for n, (_, uid) in zip(names, results, strict=True)},
        )

    def _cordon(self, unschedulable: bool) -> None:
        """Marks every node (un)schedulable: the binder binds to no cordoned node."""

        def mark(n: int) -> None:
            body = {"spec": {"unschedulable": unschedulable or None}}
            call(self.cluster, "PATCH", f"/api/v1/nodes/{node_name(n)}", body)

        concurrently(list(range(self.scale.nodes)), mark, SETUP_THREADS)

    def _tainted_unschedulable(self) -> int:
        """Nodes that still carry the taint kube-controller-manager keeps in step with
        spec.unschedulable (a GET and a PATCH of each node it changes, at its client QPS)."""
        nodes = call(self.cluster, "GET", "/api/v1/nodes")["items"]
        return sum(
            1
            for node in nodes
            if any(
                t.get("key") == UNSCHEDULABLE_TAINT
                for t in node.get("spec", {}).get("taints") or ()
            )
        )

    def _finalizers_since(self, before: Mapping[str, float], when: str) -> float:
        return self._finalizers_written().get(when, 0.0) - before.get(when, 0.0)

    def _finalizers_written(self) -> dict[str, float]:
        """The controller's claim finalizer writes so far, by where they were written (`seen`:
        when the claim was first seen, `bind`: on the Binding path); empty if not scraped."""
        if self.components is None or self.controller is None:
            return {}
        port = self.components.metrics_ports.get("controller")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError as exc:
            self.log(f"  (the controller's metrics were not read: {exc})")
            return {}
        return {key[0]: n for key, n in counter_totals(text, FINALIZER_METRIC, ("when",)).items()}

    def _finalizers_where(self, before: Mapping[str, float]) -> dict[str, float]:
        """Per pod, the finalizers written since `before`: early, and on the Binding path."""
        after = self._finalizers_written()
        if not after:
            return {}
        pods = self.scale.pods
        return {
            f"finalizers per pod, {label}": (after.get(when, 0.0) - before.get(when, 0.0)) / pods
            for when, label in (("seen", "written when seen"), ("bind", "on the Binding path"))
        }

    def _scheduler_ready(self) -> None:
        """kube-scheduler has synced once it binds a probe pod with a claim."""
        probe = cel_pod(self.scale, 0, 0)
        claim = cel_claim(self.scale, 0, 0)
        for item in (probe, claim):
            item["metadata"]["name"] = PROBE
        probe["spec"]["resourceClaims"][0]["resourceClaimName"] = PROBE
        call(self.cluster, "POST", CLAIMS, claim, wanted={201}, what="the probe's claim")
        self.wait_probe_bound("kube-scheduler", probe)
        self._clear_claims([probe], delete=True)
