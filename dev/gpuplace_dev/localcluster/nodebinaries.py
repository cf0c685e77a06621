"""Where the real node's binaries are: ``hack/build-node.sh`` builds them into
``$GPUPLACE_CACHE/node`` (default ``~/.cache/gpuplace/node``), one directory per pinned release
(``hack/node.versions``; the kubelet's release is the control plane's), and prints that directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuplace_dev.localcluster.binaries import BinariesError, cache_root, kubernetes_version

_HACK = Path(__file__).resolve().parents[3] / "hack"
_BUILD_SCRIPT = _HACK / "build-node.sh"
_VERSIONS = _HACK / "node.versions"
_PROBE_SOURCES = _HACK / "gpu-probe"
_DRA_SOURCES = _HACK / "dra-driver"
_PIN = re.compile(r"^(\w+)=(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class NodeBinaries:
    """Absolute paths of everything a real node runs, and the image payloads."""

    root: Path
    kubelet: Path
    containerd: Path
    ctr: Path
    #: The directory of containerd, containerd-shim-runc-v2 and ctr: containerd finds its shim on
    #: PATH.
    containerd_dir: Path
    runc: Path
    #: bridge, host-local, loopback.
    cni_bin_dir: Path
    #: The static pause binary the sandbox image is made of.
    pause: Path
    #: The static gpu-probe binary the workload image is made of.
    gpu_probe: Path
    #: The fake GPU DRA driver's kubelet plugin (hack/dra-driver).
    dra_driver: Path

    def all_paths(self) -> tuple[Path, ...]:
        return (
            self.kubelet,
            self.containerd,
            self.ctr,
            self.containerd_dir / "containerd-shim-runc-v2",
            self.runc,
            self.cni_bin_dir / "bridge",
            self.cni_bin_dir / "host-local",
            self.cni_bin_dir / "loopback",
            self.pause,
            self.gpu_probe,
            self.dra_driver,
        )

    def missing(self) -> list[Path]:
        return [p for p in self.all_paths() if not (p.is_file() and os.access(p, os.X_OK))]


def node_versions() -> dict[str, str]:
    """The pins of ``hack/node.versions`` (containerd, runc, cni_plugins)."""
    try:
        text = _VERSIONS.read_text()
    except FileNotFoundError:
        raise BinariesError(
            f"{_VERSIONS}: not found; the real node is built from a gpuplace checkout"
        ) from None
    pins = dict(_PIN.findall(text))
    for key in ("containerd", "runc", "cni_plugins"):
        if key not in pins:
            raise BinariesError(f"{_VERSIONS}: no '{key}=vX.Y.Z' line")
    return pins


def probe_hash(sources: Path = _PROBE_SOURCES) -> str:
    """What names the gpu-probe build (or the DRA driver's): the sources of hack/gpu-probe, as
    build-node.sh hashes them (every file, in byte order of their names, concatenated)."""
    digest = hashlib.sha256()
    for path in sorted(sources.iterdir(), key=lambda p: p.name.encode()):
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cached_node_binaries() -> NodeBinaries:
    """Where the pinned releases are (or will be) in the cache."""
    pins = node_versions()
    k8s = kubernetes_version()
    root = cache_root() / "node"
    containerd_dir = root / f"containerd-{pins['containerd']}"
    return NodeBinaries(
        root=root,
        kubelet=root / f"kubelet-{k8s}" / "kubelet",
        containerd=containerd_dir / "containerd",
        ctr=containerd_dir / "ctr",
        containerd_dir=containerd_dir,
        runc=root / f"runc-{pins['runc']}" / "runc",
        cni_bin_dir=root / f"cni-plugins-{pins['cni_plugins']}",
        pause=root / f"pause-{k8s}" / "pause",
        gpu_probe=root / f"gpu-probe-{probe_hash()}" / "gpu-probe",
        dra_driver=root / f"dra-driver-{probe_hash(_DRA_SOURCES)}" / "gpuplace-dra-driver",
    )


def find_node_binaries(*, build: bool = True) -> NodeBinaries:
    """The built node components; with ``build`` builds what is missing first (several minutes the
    first time; progress goes to stderr)."""
    binaries = cached_node_binaries()
    if not binaries.missing():
        return binaries
    if build:
        result = subprocess.run(
            ["bash", str(_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if result.returncode != 0:
            raise BinariesError(
                f"{_BUILD_SCRIPT} failed with exit status {result.returncode}; its messages are above"
            )
    missing = binaries.missing()
    if missing:
        raise BinariesError(
            f"{binaries.root}: missing {', '.join(str(p) for p in missing)}; run `make node` "
            "(hack/build-node.sh)"
        )
    return binaries
