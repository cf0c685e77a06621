"""Where the apiserver sends a placement map's pods for admission: gpuplace's webhook, none (its
entry deleted), or for a while in its place the reference webhook (`bench/refwebhook`) or
gpuplace's webhook app served by a candidate server (`bench._candidates`); and the patch
gpuplace's webhook answers such a pod with."""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.parse
from collections.abc import Callable, Iterator

from bench._bench import ClusterBench
from bench._candidates import CandidateServer, environment
from bench._kube import Obj, admission_review, call
from bench._proc import BenchError
from bench._refwebhook import ReferenceWebhook
from bench._stats import histogram_count
from bench._workload import NAMESPACE, PROBE, gpuplace_pod, webhook_processes
from kubeio.paths import MUTATING_WEBHOOKS, PODS
from kubeio.requests import prepare
from placement.annotations import ENV_CUDA_VISIBLE_DEVICES
from webhook.manifests import POD_WEBHOOK

#: The AdmissionReview uid of the probe pod's review, asked of the webhook directly.
PROBE_UID = "00000000-0000-4000-8000-000000000001"
APISERVER_WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


class WebhookSwitch(ClusterBench):
    """Points the pod webhook's entry elsewhere for a block, and back."""

    @contextlib.contextmanager
    def _unhooked(self) -> Iterator[None]:
        """The pod webhook's configuration deleted for the block (put back after): pods are
        created without the webhook's round trip."""
        configurations = [
            c
            for c in call(self.cluster, "GET", MUTATING_WEBHOOKS.collection())["items"]
            if any(w.get("name") == POD_WEBHOOK for w in c.get("webhooks") or [])
        ]
        for configuration in configurations:
            name = configuration["metadata"]["name"]
            call(self.cluster, "DELETE", MUTATING_WEBHOOKS.item(name), wanted={200})
        try:
            self.cluster.wait_for(
                "the apiserver to stop calling the pod webhook",
                lambda: not self._pod_webhook_called(),
                60,
            )
            yield
        finally:
            for configuration in configurations:
                metadata = {
                    k: v
                    for k, v in configuration["metadata"].items()
                    if k in ("name", "labels", "annotations")
                }
                body = {**configuration, "metadata": metadata}
                call(self.cluster, "POST", MUTATING_WEBHOOKS.collection(), body, wanted={201})
            self.cluster.wait_for(
                "the apiserver to call the pod webhook again", self._pod_webhook_called, 60
            )

    def gpuplace_patch(self) -> list[Obj]:
        """The JSON patch gpuplace's webhook answers a map's pod with, asked directly as the
        apiserver asks it (the probe pod's AdmissionReview)."""
        self._webhook_metrics()  # connects
        assert self._webhook_kube is not None
        probe = gpuplace_pod(self.scale, 0, 0)
        probe["metadata"] |= {"name": PROBE, "namespace": NAMESPACE}
        review = admission_review("Pod", "pods", probe, PROBE_UID, user="bench")
        response = self._webhook_kube.send(prepare("POST", "/mutate", body=review))
        if response.status != 200:
            raise BenchError(f"gpuplace's webhook answered HTTP {response.status}")
        answer = json.loads(response.data)["response"]
        if not answer.get("allowed") or not answer.get("patch"):
            raise BenchError(f"gpuplace's webhook did not patch the probe pod: {answer}")
        patch: list[Obj] = json.loads(base64.b64decode(answer["patch"]))
        return patch

    @contextlib.contextmanager
    def _through_reference(self) -> Iterator[ReferenceWebhook]:
        """The apiserver calls the reference webhook for the block (gpuplace's again after)."""
        pair = self.cluster.ca.issue_server("gpuplace-bench-refwebhook")
        cert, key = self.workdir / "refwebhook.crt", self.workdir / "refwebhook.key"
        pair.write(cert, key)
        with (
            ReferenceWebhook(
                self.workdir, self.gpuplace_patch(), cert, key, self.cluster.ca_file
            ) as reference,
            self._through(reference.url, "the reference webhook", lambda: reference.reviews() > 0),
        ):
            yield reference

    @contextlib.contextmanager
    def through_candidate(self, engine: str) -> Iterator[CandidateServer]:
        """The apiserver calls gpuplace's webhook app served by the candidate server `engine`
        (`bench._candidates`) for the block (gpuplace's own server again after). Raises
        CandidateError when it is not installed or does not start."""
        pair = self.cluster.ca.issue_server(f"gpuplace-bench-{engine}")
        cert, key = self.workdir / f"{engine}.crt", self.workdir / f"{engine}.key"
        pair.write(cert, key)
        app_env = environment(
            self.cluster.kubeconfig, self.enforcement, self.workdir / f"{engine}-ready"
        )
        tls = (cert, key, self.cluster.ca_file)
        workers = webhook_processes()
        with CandidateServer(engine, self.workdir, tls, app_env, workers) as server:
            server.wait_ready(self.scale.maps)
            served = f"gpuplace's webhook served by {engine}"
            with self._through(server.url, served, lambda: server.reviews() > 0):
                yield server

    @contextlib.contextmanager
    def _through(self, server: str, who: str, answers: Callable[[], bool]) -> Iterator[None]:
        """The pod webhook's entry pointed at `server` for the block, from when the apiserver
        calls it (a map's pod is wired and `answers` says `who` answered), and back at
        gpuplace's webhook after, until the apiserver calls that again."""
        original = self._point_pod_webhook(server)
        try:
            self.cluster.wait_for(
                f"the apiserver to call {who}",
                lambda: self._pod_webhook_called() and answers(),
                60,
            )
            yield
        finally:
            self._point_pod_webhook(original)
            before = histogram_count(self._webhook_buckets())
            self.cluster.wait_for(
                "the apiserver to call gpuplace's webhook again",
                lambda: (
                    self._pod_webhook_called() and histogram_count(self._webhook_buckets()) > before
                ),
                60,
            )

    def _point_pod_webhook(self, server: str) -> str:
        """Points the pod webhook's entry at `server` (scheme, host and port; the path stays);
        returns where it pointed before."""
        for configuration in call(self.cluster, "GET", MUTATING_WEBHOOKS.collection())["items"]:
            for webhook in configuration.get("webhooks") or []:
                if webhook.get("name") != POD_WEBHOOK:
                    continue
                before = urllib.parse.urlsplit(webhook["clientConfig"]["url"])
                after = urllib.parse.urlsplit(server)
                webhook["clientConfig"]["url"] = before._replace(
                    scheme=after.scheme, netloc=after.netloc
                ).geturl()
                name = configuration["metadata"]["name"]
                call(self.cluster, "PUT", MUTATING_WEBHOOKS.item(name), configuration)
                return f"{before.scheme}://{before.netloc}"
        raise BenchError(f"no mutating webhook configuration has the entry {POD_WEBHOOK}")

    def _pod_webhook_called(self) -> bool:
        """Whether a map's pod gets the webhook's wiring now (a server-side dry run)."""
        probe = gpuplace_pod(self.scale, 0, 0)
        probe["metadata"]["name"] = "webhook-probe"
        path = f"{PODS.collection(NAMESPACE)}?dryRun=All"
        status, body = self.cluster.request("POST", path, probe)
        if status != 201:
            return False
        env = body["spec"]["containers"][0].get("env") or []
        return any(e.get("name") == ENV_CUDA_VISIBLE_DEVICES for e in env)
