"""ArgoCD's application-controller, repo-server and applicationset-controller, out of cluster
against a `LocalCluster`, the way ArgoCD's own local development runs them (its Procfile):
``ARGOCD_FAKE_IN_CLUSTER``, a kubeconfig whose namespace is ``argocd``, a loopback Redis, and
plaintext gRPC between the components on loopback ports.

The destination cluster is registered the way `argocd cluster add` does it: a Secret labelled
``argocd.argoproj.io/secret-type: cluster`` that holds the API server's address, its CA and a client
certificate. The local cluster is both the cluster ArgoCD runs in and its destination.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from gpuplace_dev.gobuild import HostComponents
from gpuplace_dev.localargocd.binaries import ArgoCDBinaries, find_argocd
from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.tools import helm_binary

NAMESPACE = "argocd"
CLUSTER_KIND_LABEL = "argocd.argoproj.io/secret-type"
PART_OF = {"app.kubernetes.io/part-of": "argocd"}
CRDS = ("applications.argoproj.io", "applicationsets.argoproj.io", "appprojects.argoproj.io")


class ArgoCDError(Exception):
    """ArgoCD could not be started here."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _configmap(name: str, data: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(PART_OF)},
        "data": dict(data or {}),
    }


def cluster_secret(
    name: str,
    cluster: LocalCluster,
    labels: Mapping[str, str] | None = None,
    server: str | None = None,
) -> dict[str, Any]:
    """The cluster Secret `argocd cluster add` writes for `cluster` under `name`. That command
    creates a ServiceAccount with cluster-admin; a client certificate in system:masters gives the
    same rights without a token controller round trip."""
    client = cluster.ca.issue_client("argocd-manager", organizations=("system:masters",))
    config = {
        "tlsClientConfig": {
            "caData": _b64(cluster.ca.cert_pem),
            "certData": _b64(client.cert_pem),
            "keyData": _b64(client.key_pem),
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"cluster-{name}",
            "namespace": NAMESPACE,
            "labels": {CLUSTER_KIND_LABEL: "cluster", **PART_OF, **dict(labels or {})},
        },
        "type": "Opaque",
        "stringData": {
            "name": name,
            "server": server or cluster.server,
            "config": json.dumps(config),
        },
    }


class LocalArgoCD(HostComponents):
    """Starts Redis and the three ArgoCD components against ``cluster``; `stop` ends them.

    ``settings`` are extra ``argocd-cm`` keys (e.g. gpuplace's health check). ``destinations`` are
    the names under which the cluster is registered as a destination (an ApplicationSet's cluster
    directories use them).
    """

    error = ArgoCDError

    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path | None = None,
        *,
        destinations: tuple[str, ...] = ("in-cluster",),
        settings: Mapping[str, str] | None = None,
        binaries: ArgoCDBinaries | None = None,
    ) -> None:
        super().__init__(cluster, workdir, prefix="gpuplace-argocd-")
        self.destinations = destinations
        self.settings = dict(settings or {})
        self._binaries = binaries
        self.repo_server_port = 0
        self.redis_port = 0

    # ----------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120.0) -> Self:
        binaries = self._binaries or find_argocd()
        redis = shutil.which("redis-server")
        if redis is None:
            raise ArgoCDError(
                "redis-server not found on PATH; ArgoCD caches in Redis. Install it "
                "(Debian: apt-get install redis-server)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._install(binaries)
        env = self._environment(binaries)
        self._start_redis(redis, env, timeout)
        self._start_repo_server(binaries, env, timeout)
        self._start_controllers(binaries, env, timeout)
        return self

    def _start_redis(self, redis: str, env: dict[str, str], timeout: float) -> None:
        self.redis_port = _free_port()
        self.spawn(
            "redis",
            [
                redis,
                "--bind", "127.0.0.1",
                "--port", str(self.redis_port),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
            ],
            env,
        )  # fmt: skip
        self._wait_port("redis", self.redis_port, timeout)

    def _start_repo_server(
        self, binaries: ArgoCDBinaries, env: dict[str, str], timeout: float
    ) -> None:
        self.repo_server_port = _free_port()
        self.spawn(
            "argocd-repo-server",
            [
                str(binaries.component("argocd-repo-server")),
                f"--port={self.repo_server_port}",
                f"--metrics-port={_free_port()}",
                f"--redis=127.0.0.1:{self.redis_port}",
                "--disable-tls",
                "--loglevel=info",
            ],
            env,
        )
        self._wait_port("argocd-repo-server", self.repo_server_port, timeout)

    def _start_controllers(
        self, binaries: ArgoCDBinaries, env: dict[str, str], timeout: float
    ) -> None:
        """The application controller and the applicationset controller, on the repo server."""
        repo_server = f"127.0.0.1:{self.repo_server_port}"
        self.spawn(
            "argocd-application-controller",
            [
                str(binaries.component("argocd-application-controller")),
                f"--redis=127.0.0.1:{self.redis_port}",
                f"--repo-server={repo_server}",
                "--repo-server-plaintext",
                f"--metrics-port={_free_port()}",
                # Per-resource health in the Application (v3 keeps it in Redis by default, for
                # argocd-server to serve); tests and the demo read it from the object.
                "--persist-resource-health",
                "--status-processors=4",
                "--operation-processors=4",
                "--loglevel=info",
            ],
            env,
        )
        probe = _free_port()
        self.spawn(
            "argocd-applicationset-controller",
            [
                str(binaries.component("argocd-applicationset-controller")),
                f"--argocd-repo-server={repo_server}",
                "--repo-server-plaintext",
                f"--metrics-addr=127.0.0.1:{_free_port()}",
                f"--probe-addr=127.0.0.1:{probe}",
                "--loglevel=info",
            ],
            env,
        )
        self._wait_port("argocd-applicationset-controller", probe, timeout)

    # ----------------------------------------------------------------------------- setup

    def _install(self, binaries: ArgoCDBinaries) -> None:
        """CRDs, the namespace, ArgoCD's settings, the default project and the destination cluster
        secrets."""
        cluster = self.cluster
        self.install_crds(binaries.crds_dir, CRDS, "ArgoCD's")
        cluster.create_namespace(NAMESPACE)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "argocd-secret", "namespace": NAMESPACE, "labels": dict(PART_OF)},
            "type": "Opaque",
            "data": {"server.secretkey": _b64(os.urandom(32))},
        }
        objects: list[dict[str, Any]] = [
            _configmap("argocd-cm", self.settings),
            _configmap("argocd-rbac-cm"),
            _configmap("argocd-cmd-params-cm"),
            _configmap("argocd-tls-certs-cm"),
            _configmap("argocd-ssh-known-hosts-cm"),
            _configmap("argocd-gpg-keys-cm"),
            secret,
            # What argocd-server creates at its start (it does not run here): the project that an
            # app of apps, such as argocd/root.yaml, belongs to.
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AppProject",
                "metadata": {"name": "default", "namespace": NAMESPACE},
                "spec": {
                    "sourceRepos": ["*"],
                    "destinations": [{"server": "*", "namespace": "*"}],
                    "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
                },
            },
        ]
        objects += [cluster_secret(name, cluster) for name in self.destinations]
        manifest = "\n".join(json.dumps(o) for o in objects)
        cluster.kubectl("apply", "--server-side", "-f", "-", input=manifest)

    def register(
        self,
        name: str,
        cluster: LocalCluster,
        labels: Mapping[str, str] | None = None,
        server: str | None = None,
    ) -> None:
        """Registers `cluster` (another control plane, or this one) as destination `name`, its
        cluster Secret carrying `labels` (e.g. gpuplace.io/enabled: "true" for the fleet's
        ApplicationSets); `server`: another address of its apiserver than `cluster.server`."""
        secret = cluster_secret(name, cluster, labels, server)
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(secret))

    def _environment(self, binaries: ArgoCDBinaries) -> dict[str, str]:
        kubeconfig = self.copy_kubeconfig()
        self.cluster.kubectl(
            f"--kubeconfig={kubeconfig}", "config", "set-context", "--current",
            f"--namespace={NAMESPACE}",
        )  # fmt: skip
        data = {}
        for name in ("tls", "ssh", "gpg-keys", "gpg-source", "cmp", "tmp"):
            data[name] = self.workdir / name
            data[name].mkdir(parents=True, exist_ok=True)
        # The repo-server renders Helm sources with the helm on its PATH (hack/build-tools.sh's).
        helm = helm_binary().parent
        path = os.pathsep.join(
            [str(binaries.bin_dir), str(helm), os.environ.get("PATH", "/usr/bin:/bin")]
        )
        return self.environment(
            PATH=path,
            TMPDIR=str(data["tmp"]),
            KUBECONFIG=str(kubeconfig),
            ARGOCD_FAKE_IN_CLUSTER="true",
            ARGOCD_TLS_DATA_PATH=str(data["tls"]),
            ARGOCD_SSH_DATA_PATH=str(data["ssh"]),
            ARGOCD_GNUPGHOME=str(data["gpg-keys"]),
            ARGOCD_GPG_DATA_PATH=str(data["gpg-source"]),
            ARGOCD_GPG_ENABLED="false",
            ARGOCD_PLUGINSOCKFILEPATH=str(data["cmp"]),
            # The application controller reads its shard from the ordinal of its host name.
            HOSTNAME="argocd-application-controller-0",
        )

    # ----------------------------------------------------------------------------- helpers

    def _wait_port(self, name: str, port: int, timeout: float) -> None:
        def listening() -> bool:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                return sock.connect_ex(("127.0.0.1", port)) == 0

        self.wait(f"{name} listening on 127.0.0.1:{port}", listening, timeout)
