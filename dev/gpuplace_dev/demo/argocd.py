"""The demo's GitOps sync through real ArgoCD: the files of `argocd/` pointed at the demo's git
repository (file://), one registered destination cluster `dev`, and every sync read back from an
Application's status.

With the real node, the demo's repository holds gpuplace itself too, as a platform team's does:
the chart (`charts/gpuplace`) and `argocd/` (project, the chart's Application, the maps'
ApplicationSet), synced by the app of apps `argocd/root.yaml` in sync-wave order, chart first."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuplace_dev.demo.components import REPO_ROOT
from gpuplace_dev.demo.gitops import SyncResult
from gpuplace_dev.localargocd.apps import (
    APPLICATIONS,
    APPLICATIONSETS,
    REFRESH_ANNOTATION,
    AppState,
)
from gpuplace_dev.localargocd.launcher import NAMESPACE, LocalArgoCD
from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.process import poll
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError

ARGOCD_DIR = REPO_ROOT / "argocd"
APPLICATIONSET = "gpuplace-placement-maps"
#: The cluster directory the demo's cluster stands for; the ApplicationSet names its Application
#: after it and sends it to the destination cluster of the same name.
CLUSTER = "dev"
APPLICATION = f"gpuplace-maps-{CLUSTER}"
#: The chart's Application (argocd/application-gpuplace.yaml) and the app of apps (root.yaml).
CHART_APPLICATION = "gpuplace"
ROOT_APPLICATION = "gpuplace-root"
#: Where the chart's Application installs it.
RELEASE_NAMESPACE = "gpuplace-system"


def argocd_settings() -> dict[str, str]:
    """gpuplace's keys of argocd-cm (the Lua health check), as argocd/argocd-cm.yaml ships them."""
    document = yaml.safe_load((ARGOCD_DIR / "argocd-cm.yaml").read_text())
    return dict(document["data"])


def project(repo_url: str) -> dict[str, Any]:
    """argocd/project.yaml, admitting the demo's repository."""
    document: dict[str, Any] = yaml.safe_load((ARGOCD_DIR / "project.yaml").read_text())
    document["spec"]["sourceRepos"] = [repo_url]
    return document


def applicationset(repo_url: str, clusters_dir: str, skip: tuple[str, ...]) -> dict[str, Any]:
    """argocd/applicationset-placement-maps.yaml, pointed at the demo's repository: its cluster
    directories are `<clusters_dir>/*`, and those in `skip` (clusters this demo has not registered)
    are excluded."""
    document: dict[str, Any] = yaml.safe_load(
        (ARGOCD_DIR / "applicationset-placement-maps.yaml").read_text()
    )
    spec = document["spec"]
    git = spec["generators"][0]["git"]
    git["repoURL"] = repo_url
    git["directories"] = [{"path": f"{clusters_dir}/*"}] + [
        {"path": f"{clusters_dir}/{name}", "exclude": True} for name in skip
    ]
    spec["template"]["spec"]["source"]["repoURL"] = repo_url
    return document


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid over `base` the way helm merges values files: maps key by key, all else
    replaced."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            out[key] = merged(below, value)
        else:
            out[key] = value
    return out


def chart_application(repo_url: str, values: Mapping[str, Any], destination: str) -> dict[str, Any]:
    """argocd/application-gpuplace.yaml as shipped, pointed at `repo_url` and the destination
    cluster named `destination`, with `values` over its own."""
    app: dict[str, Any] = yaml.safe_load((ARGOCD_DIR / "application-gpuplace.yaml").read_text())
    source = app["spec"]["source"]
    source["repoURL"] = repo_url
    source["helm"]["valuesObject"] = merged(source["helm"]["valuesObject"], values)
    app["spec"]["destination"] = {"name": destination, "namespace": RELEASE_NAMESPACE}
    return app


def root_application(repo_url: str, destination: str) -> dict[str, Any]:
    """argocd/root.yaml, the app of apps, pointed at `repo_url` and `destination`."""
    root: dict[str, Any] = yaml.safe_load((ARGOCD_DIR / "root.yaml").read_text())
    root["spec"]["source"]["repoURL"] = repo_url
    root["spec"]["destination"] = {"name": destination, "namespace": NAMESPACE}
    return root


def write_platform(
    repo: Path, values: Mapping[str, Any], clusters_dir: str, skip: tuple[str, ...]
) -> None:
    """Puts gpuplace into the git repository at `repo`: the chart under charts/gpuplace and the
    files root.yaml syncs under argocd/, pointed at this repository and at cluster `dev`."""
    url = f"file://{repo}"
    shutil.copytree(REPO_ROOT / "charts" / "gpuplace", repo / "charts" / "gpuplace")
    target = repo / "argocd"
    target.mkdir(exist_ok=True)
    files = {
        "project.yaml": project(url),
        "application-gpuplace.yaml": chart_application(url, values, CLUSTER),
        "applicationset-placement-maps.yaml": applicationset(url, clusters_dir, skip),
        "root.yaml": root_application(url, CLUSTER),
    }
    for name, document in files.items():
        (target / name).write_text(yaml.safe_dump(document, sort_keys=False))


def set_chart_value(repo: Path, path: tuple[str, ...], value: Any) -> None:
    """Sets one value of the chart's Application in the repository (a commit then changes it)."""
    target = repo / "argocd" / "application-gpuplace.yaml"
    app = yaml.safe_load(target.read_text())
    node = app["spec"]["source"]["helm"]["valuesObject"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    target.write_text(yaml.safe_dump(app, sort_keys=False))


class ArgoCDSync:
    """Syncs through ArgoCD: a commit is picked up by a refresh of the Application (what a git
    webhook to argocd-server triggers), then ArgoCD's automated sync applies it."""

    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path,
        repo_path: Path,
        out: Callable[[str], None],
        check_alive: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.repo_url = f"file://{repo_path}"
        self.out = out
        self._check_alive = check_alive
        self.argocd = LocalArgoCD(
            cluster, workdir, destinations=(CLUSTER,), settings=argocd_settings()
        )

    def start(self) -> None:
        self.argocd.start()

    def stop(self) -> None:
        self.argocd.stop()

    def install(self, clusters_dir: str, skip: tuple[str, ...]) -> None:
        """Applies the AppProject and the ApplicationSet (kubectl apply, as root.yaml would)."""
        objects = [project(self.repo_url), applicationset(self.repo_url, clusters_dir, skip)]
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))

    def bootstrap(self, repo: Path) -> None:
        """`kubectl apply -f argocd/root.yaml`: the one object applied by hand; ArgoCD syncs the
        rest from git."""
        self.cluster.kubectl("apply", "--server-side", "-f", str(repo / "argocd" / "root.yaml"))

    # -- reading an Application -----------------------------------------------------------------
    def application(self, name: str = APPLICATION) -> dict[str, Any] | None:
        status, body = self.cluster.request("GET", APPLICATIONS.item(name, NAMESPACE))
        return body if status == 200 else None

    def applicationset(self) -> dict[str, Any] | None:
        status, body = self.cluster.request("GET", APPLICATIONSETS.item(APPLICATIONSET, NAMESPACE))
        return body if status == 200 else None

    def state(self, name: str = APPLICATION) -> AppState | None:
        app = self.application(name)
        return AppState.from_object(app) if app else None

    def wait(
        self, what: str, probe: Callable[[], Any], timeout: float = 180.0, name: str = APPLICATION
    ) -> Any:
        """Until `probe` returns something true; a timeout describes the Application `name`."""

        def check_alive() -> None:
            self._check_alive()
            self.argocd.check_alive()

        result = poll(probe, timeout, check_alive, interval=0.5)
        if not result:
            state = self.state(name)
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; "
                + (state.describe() if state else f"no Application {name}")
            )
        return result

    # -- syncing --------------------------------------------------------------------------------
    def refresh(self, name: str = APPLICATION) -> None:
        """Asks ArgoCD to compare with git now (nothing to do before the Application exists)."""
        path = APPLICATIONS.item(name, NAMESPACE)
        patch = {"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}}
        status, body = self.cluster.request("PATCH", path, patch)
        if status not in (200, 404):
            raise RuntimeError(f"refreshing {name}: {status} {body}")

    def sync(self, revision: str, *, rejected: bool = False) -> SyncResult:
        """Waits for ArgoCD's sync of `revision` (a SHA or its prefix) to end; ok when it
        succeeded. A failed attempt that ArgoCD will retry ends the wait only for a `rejected`
        revision: otherwise it may be transient (the application controller not having seen the
        AppProject yet) and the retry decides. The result is read from the one Application object
        that showed the end: a retry started afterwards clears the per-resource messages."""
        self.refresh()

        def ended(s: AppState) -> bool:
            if s.operation in ("Succeeded", "Failed", "Error"):
                return True
            return rejected and s.attempt_failed

        state: AppState = self.wait(
            f"ArgoCD to sync {revision[:7]}",
            lambda: (
                (s := self.state()) and s.operation_revision.startswith(revision) and ended(s) and s
            ),
        )
        self.out(f"    {state.line()}")
        lines = [state.operation_message, *state.unsynced]
        return SyncResult(state.operation == "Succeeded", "\n".join(line for line in lines if line))

    def record(self) -> HealthRecorder:
        """Starts recording every state the Application is written in (a watch: no state ArgoCD
        writes, however briefly, is missed)."""
        return HealthRecorder(self.cluster).start()

    def settled(
        self, revision: str, health: str, name: str = APPLICATION, timeout: float = 180.0
    ) -> AppState:
        """Waits until the Application `name` is Synced at `revision` with the given health."""
        state: AppState = self.wait(
            f"{name} Synced at {revision[:7]} and {health}",
            lambda: (
                (s := self.state(name))
                and s.sync == "Synced"
                and s.revision.startswith(revision)
                and s.health == health
                and s
            ),
            timeout,
            name,
        )
        self.out(f"    {state.line()}")
        return state


class HealthRecorder:
    """Every (sync revision, sync status, health) the Application showed while recording."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
        self.seen: list[tuple[str, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="app-health", daemon=True)

    def start(self) -> HealthRecorder:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[str, str, str]]:
        self._stop.set()
        return list(self.seen)

    def _run(self) -> None:
        path = APPLICATIONS.collection(NAMESPACE)
        query = {"fieldSelector": f"metadata.name={APPLICATION}", "timeoutSeconds": 600}
        while not self._stop.is_set():
            try:
                for event in self.kube.stream(path, query, timeout=630):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        state = AppState.from_object(event["object"])
                        self.seen.append((state.revision, state.sync, state.health))
                    if self._stop.is_set():
                        return
            except APIError:
                time.sleep(0.2)
