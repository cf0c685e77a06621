"""Where a local cluster keeps its files, and the state file that lets another process stop it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplace_dev.localcluster.process import ProcessRecord

STATE_VERSION = 1


@dataclass(frozen=True)
class ClusterLayout:
    """The files of one cluster below its directory.

    ``kubeconfig`` (admin), ``pki/`` (CA, serving and client certificates, service-account keys),
    ``etcd/`` (data), ``logs/<component>.log``, ``kubeconfigs/`` (per component),
    ``kwok.yaml``, ``audit-policy.yaml`` (audit log in ``logs/audit.log``), ``kube-scheduler.yaml`` (with a scheduler QPS), ``state.json`` (while running), ``.gpuplace-cluster`` (marker).
    """

    directory: Path

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.directory / "pki"

    @property
    def ca_cert(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.pki / "ca.key"

    def cert(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"

    @property
    def service_account_key(self) -> Path:
        return self.pki / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.pki / "sa.pub"

    def component_kubeconfig(self, component: str) -> Path:
        return self.directory / "kubeconfigs" / f"{component}.kubeconfig"

    @property
    def etcd_data(self) -> Path:
        return self.directory / "etcd"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def audit_policy(self) -> Path:
        return self.directory / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """One JSON audit event a line: every Binding (pods/binding create) the apiserver got."""
        return self.logs / "audit.log"

    @property
    def kwok_config(self) -> Path:
        return self.directory / "kwok.yaml"

    @property
    def scheduler_config(self) -> Path:
        return self.directory / "kube-scheduler.yaml"

    @property
    def tracing_config(self) -> Path:
        return self.directory / "apiserver-tracing.yaml"

    @property
    def kubectl_cache(self) -> Path:
        return self.directory / "kubectl-cache"

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def marker(self) -> Path:
        """Marks a directory as a cluster's, so that tools may remove it without asking."""
        return self.directory / ".gpuplace-cluster"

    def create(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
        for sub in (self.pki, self.logs, self.etcd_data, self.directory / "kubeconfigs"):
            sub.mkdir(parents=True, exist_ok=True)
        self.etcd_data.chmod(0o700)
        self.pki.chmod(0o700)


@dataclass(frozen=True)
class ClusterState:
    """What ``state.json`` records about a running cluster."""

    server: str
    kubeconfig: Path
    processes: tuple[ProcessRecord, ...]
    startup_seconds: float

    def write(self, path: Path) -> None:
        data = {
            "version": STATE_VERSION,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "startupSeconds": round(self.startup_seconds, 3),
            "processes": [
                {"name": p.name, "pid": p.pid, "startTicks": p.start_ticks, "log": str(p.log)}
                for p in self.processes
            ],
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> ClusterState:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            return cls(
                server=str(data["server"]),
                kubeconfig=Path(data["kubeconfig"]),
                startup_seconds=float(data["startupSeconds"]),
                processes=tuple(
                    ProcessRecord(
                        name=str(p["name"]),
                        pid=int(p["pid"]),
                        start_ticks=int(p["startTicks"]),
                        log=Path(p["log"]),
                    )
                    for p in data["processes"]
                ),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: not a gpuplace cluster state file ({error})") from error
