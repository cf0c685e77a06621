"""JobSet's and LeaderWorkerSet's controller managers out of cluster against a `LocalCluster`.

Each manager runs on the host with the cluster's admin kubeconfig, as ArgoCD's components do
(`gpuplace_dev.localargocd`), from a configuration file of its own release's API: no leader
election, no metrics listener, its internal certificate management off. Its webhook server serves
on loopback with a certificate this launcher issues, and the apiserver calls it there: the
operator's own webhook configurations (its kustomization, with the objectSelectors it ships)
are installed with each service reference turned into that URL and the CA's bundle. The webhooks
are not optional: LeaderWorkerSet's pod webhook is what writes a pod's group and worker index.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Self

import yaml

from gpuplace_dev.demo.components import free_port
from gpuplace_dev.gobuild import HostComponents
from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localtraining.binaries import (
    OPERATORS,
    TrainingOperatorsBinaries,
    find_training_operators,
)
from kubeio import pki

#: Each operator's configuration API and the CRDs it serves.
_CONFIG_API = {"jobset": "config.jobset.x-k8s.io/v1alpha1", "lws": "config.lws.x-k8s.io/v1alpha1"}
CRDS = {
    "jobset": ("jobsets.jobset.x-k8s.io",),
    "lws": ("leaderworkersets.leaderworkerset.x-k8s.io",),
}
_WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class TrainingOperatorsError(Exception):
    """A training operator did not start or stopped."""


class LocalTrainingOperators(HostComponents):
    """Installs the operators' CRDs and webhook configurations and runs their managers; `stop`
    ends them (the CRDs and configurations stay, as the cluster's own objects)."""

    error = TrainingOperatorsError

    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path | None = None,
        *,
        operators: Iterable[str] = OPERATORS,
        binaries: TrainingOperatorsBinaries | None = None,
    ) -> None:
        self.operators = tuple(operators)
        unknown = [o for o in self.operators if o not in OPERATORS]
        if unknown:
            raise ValueError(f"unknown training operators {unknown}; have {OPERATORS}")
        super().__init__(cluster, workdir, prefix="gpuplace-training-operators-")
        self._binaries = binaries

    def start(self) -> Self:
        binaries = self._binaries or find_training_operators()
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca = pki.self_signed_ca("gpuplace-training-operators", timedelta(days=1))
        leaf = pki.issue(
            ca,
            "training-operators",
            usage=pki.SERVER_AUTH,
            validity=timedelta(days=1),
            ip_addresses=["127.0.0.1"],
        )
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        leaf.write(certs / "tls.crt", certs / "tls.key")
        try:
            for operator in self.operators:
                port, probe = free_port(), free_port()
                self._install(binaries, operator, port, ca.cert_pem)
                self._spawn(binaries, operator, port, probe, certs)
                self.wait(f"{operator}'s manager ready", partial(self._ready, probe), 120)
        except BaseException:
            self.stop()
            raise
        return self

    def _install(
        self, binaries: TrainingOperatorsBinaries, operator: str, port: int, ca: bytes
    ) -> None:
        """The CRDs, then the webhook configurations pointed at the manager's loopback port."""
        cluster = self.cluster
        self.install_crds(binaries.crds_dir(operator), CRDS[operator], f"{operator}'s")
        built = cluster.kubectl("kustomize", str(binaries.webhook_dir(operator))).stdout
        configurations = [
            loopback_webhooks(doc, operator, port, ca)
            for doc in yaml.safe_load_all(built)
            if isinstance(doc, dict) and doc.get("kind") in _WEBHOOK_KINDS
        ]
        manifest = "\n".join(json.dumps(c) for c in configurations)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=manifest)

    def _spawn(
        self,
        binaries: TrainingOperatorsBinaries,
        operator: str,
        port: int,
        probe: int,
        certs: Path,
    ) -> None:
        kubeconfig = self.copy_kubeconfig()
        config = {
            "apiVersion": _CONFIG_API[operator],
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
            # No metrics listener: several local clusters may run on one host.
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
        }
        path = self.workdir / f"{operator}-config.yaml"
        path.write_text(yaml.safe_dump(config))
        env = self.environment(KUBECONFIG=str(kubeconfig))
        argv = [str(binaries.manager(operator)), f"--config={path}"]
        self.spawn(f"{operator}-controller", argv, env)

    def _ready(self, probe: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def loopback_webhooks(doc: dict[str, Any], operator: str, port: int, ca: bytes) -> dict[str, Any]:
    """A webhook configuration of the operator's kustomization, named after the operator, each
    webhook calling https://127.0.0.1:`port` at its service path and trusting `ca`."""
    out = dict(doc)
    out["metadata"] = {"name": f"{operator}-{doc['metadata']['name']}"}
    bundle = base64.b64encode(ca).decode()
    webhooks = []
    for hook in doc.get("webhooks") or []:
        path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "/")
        webhooks.append(
            {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}}
        )
    out["webhooks"] = webhooks
    return out
