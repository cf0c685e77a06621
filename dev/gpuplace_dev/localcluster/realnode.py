"""A real node for the local cluster: containerd, runc, CNI plugins and a kubelet on this machine.

Pods bound to it really run (images from `gpuplace_dev.localcluster.images`), so tests read what a
container printed and what ``kubectl exec`` shows. The node is named ``localhost``: the apiserver
reaches a kubelet by the node's host name first, the kubelet refuses a loopback node IP, and
``localhost`` resolves to 127.0.0.1 without touching /etc/hosts; the kubelet listens on 127.0.0.1
only. One real node runs on a machine at a time: ``/tmp/gpuplace-real-node.lock`` is held (flock)
by whoever started it and by containerd and the kubelet, so a detached node keeps it until stopped.

Its files live in ``<cluster>/node`` (`RealNodeLayout`; a symbolic link to
``/tmp/gpuplace-node-<hash>`` when the cluster's path is long, since Unix socket paths are limited
to 107 bytes and containerd and the kubelet put sockets deep below it), except what the kubelet and containerd
write to fixed places (``/run/containerd``, ``/var/lib/cni``, ``/var/lib/kubelet/device-plugins``,
``/var/log/containers``): those that did not exist before are recorded and removed on stop, with
the ``kubepods`` cgroups, the CNI bridge and every mount below the node's directory.

What the kubelet and containerd are given (see the config writers below, pure and unit-tested):

- containerd 2.x config v3: root, state, socket and runc state below the node directory; CDI on,
  spec directory ``<node>/cdi`` (`RealNodeLayout.cdi_dir`: a DRA plugin writes its specs there);
  ``restrict_oom_score_adj`` (without CAP_SYS_RESOURCE, as in many VMs, the negative OOM score CRI
  gives sandboxes makes runc fail); network namespaces mounted under the state directory; NRI off.
- CNI: a bridge with host-local IPAM on `POD_SUBNET`, no gateway and no NAT (no iptables rule
  changes); the IPAM state stays below the node directory.
- kubelet: cgroupfs driver, cgroup v1 allowed, swap allowed; Webhook authentication and
  authorization (the apiserver presents its kubelet client certificate); a client certificate for
  ``system:node:localhost`` from the cluster CA (Node authorization and NodeRestriction apply);
  image garbage collection off (the local images cannot be pulled again); pod logs below the node
  directory. ``kubelet_args`` adds flags, e.g. feature gates.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplace_dev.localcluster import network
from gpuplace_dev.localcluster.images import (
    PAUSE_IMAGE,
    Image,
    gpu_probe_image,
    oci_archive,
    pause_image,
)
from gpuplace_dev.localcluster.nodebinaries import NodeBinaries

REAL_NODE_NAME = "localhost"
# A fixed name on purpose: every checkout and user on the machine must agree on it.
REAL_NODE_LOCK = Path("/tmp/gpuplace-real-node.lock")  # noqa: S108
#: The pod addresses of the real node: outside the service range and kwok's pod range.
POD_SUBNET = "10.64.0.0/24"
#: The bridge's own address, with a pod network (gpuplace_dev.localcluster.network).
POD_GATEWAY = "10.64.0.1/24"
#: The last address a pod gets; those above it are the host's own (`TENANT_ADDRESSES`).
POD_RANGE_END = "10.64.0.250"
#: More addresses of the bridge, with a pod network: a test's client that connects from one is a
#: client apart from the apiserver, which reaches the pods from `POD_GATEWAY`, as a tenant's pod
#: is (two: a tenant with two pods).
TENANT_ADDRESSES = ("10.64.0.253", "10.64.0.254")
BRIDGE = "gpuplace0"
#: Paths the kubelet and containerd write whatever their directories are configured to.
SYSTEM_PATHS = (
    Path("/run/containerd"),
    Path("/var/lib/cni"),
    Path("/var/lib/kubelet/device-plugins"),
    Path("/var/log/containers"),
)
_MNT_DETACH = 2
#: Longer node directories move to a short one: the deepest sockets add about 60 bytes to it.
_MAX_NODE_DIRECTORY = 40
_SHORT_PREFIX = "gpuplace-node-"


class RealNodeError(RuntimeError):
    """The real node cannot start or stop cleanly."""


@dataclass(frozen=True)
class RealNodeLayout:
    """The files of the real node below ``<cluster>/node``."""

    directory: Path

    @property
    def containerd_root(self) -> Path:
        return self.directory / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.directory / "containerd-state"

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.directory / "containerd.toml"

    @property
    def runc_root(self) -> Path:
        return self.directory / "runc"

    @property
    def network_record(self) -> Path:
        """What gpuplace_dev.localcluster.network installed, for its removal."""
        return self.directory / "network.json"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.directory / "cni" / "ipam"

    @property
    def cdi_dir(self) -> Path:
        """containerd reads CDI specs from here (a DRA driver's kubelet plugin writes them)."""
        return self.directory / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.directory / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.directory / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.directory / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.directory / "pod-logs"

    @property
    def images(self) -> Path:
        return self.directory / "images"

    @property
    def created_paths(self) -> Path:
        """The system paths this node created, removed again on stop."""
        return self.directory / "created-paths.json"

    @property
    def plugins_registry(self) -> Path:
        """Where a kubelet plugin (a DRA driver) registers its socket with this kubelet."""
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        """Where kubelet plugins keep their own sockets (``<plugins>/<driver>/...``)."""
        return self.kubelet_root / "plugins"


class RealNode:
    """The real node of a running `LocalCluster` (``cluster.real_node``): its name, files and
    binaries, and ``ctr`` against its containerd (namespace ``k8s.io``, where the kubelet's pods
    are)."""

    def __init__(self, layout: RealNodeLayout, binaries: NodeBinaries) -> None:
        self.name = REAL_NODE_NAME
        self.layout = layout
        self.binaries = binaries

    def ctr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return ctr(self.binaries, self.layout, *args, timeout=timeout)


# --------------------------------------------------------------------------------- configuration


def containerd_config(layout: RealNodeLayout, binaries: NodeBinaries) -> str:
    """containerd's config (version 3) for the real node."""

    def q(path: Path | str) -> str:
        return json.dumps(str(path))

    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = {q(layout.containerd_root)}
state = {q(layout.containerd_state)}
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = {q(layout.containerd_socket)}

[ttrpc]
  address = {q(str(layout.containerd_socket) + ".ttrpc")}

[plugins.'io.containerd.internal.v1.opt']
  path = {q(layout.directory / "opt")}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(PAUSE_IMAGE)}

[{cri}]
  enable_cdi = true
  cdi_spec_dirs = [{q(layout.cdi_dir)}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [{cri}.cni]
    bin_dirs = [{q(binaries.cni_bin_dir)}]
    conf_dir = {q(layout.cni_conf_dir)}
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = {q(binaries.runc)}
        Root = {q(layout.runc_root)}
        SystemdCgroup = false
"""


def cni_config(layout: RealNodeLayout, services: str | None = None) -> dict[str, Any]:
    """One bridge, host-local addresses, no masquerading: pods reach each other and the kubelet
    reaches them through their network namespace. With ``services`` (the Service range; the pod
    network of an installed chart, gpuplace_dev.localcluster.network) the bridge holds
    `POD_GATEWAY` and pods get one route, to ``services`` through it; never a default route.
    Pods get addresses up to `POD_RANGE_END`: the ones above are the host's."""
    pod_range = {"subnet": POD_SUBNET, "rangeEnd": POD_RANGE_END}
    ipam: dict[str, Any] = {
        "type": "host-local",
        "ranges": [[pod_range]],
        "dataDir": str(layout.cni_ipam_dir),
    }
    if services is not None:
        ipam["ranges"] = [[{**pod_range, "gateway": POD_GATEWAY.split("/", maxsplit=1)[0]}]]
        ipam["routes"] = [{"dst": services}]
    return {
        "cniVersion": "1.0.0",
        "name": "gpuplace",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": services is not None,
                "isDefaultGateway": False,
                "ipMasq": False,
                "ipam": ipam,
            }
        ],
    }


def kubelet_configuration(
    layout: RealNodeLayout, *, port: int, ca_file: Path, serving_cert: Path, serving_key: Path
) -> dict[str, Any]:
    """The KubeletConfiguration of the real node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(layout.pod_logs),
        "clusterDomain": "cluster.local",
        # The local images cannot be pulled again once collected.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared development machine's disk or memory running low must not evict test pods.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "staticPodPath": "",
    }


def kubelet_args(
    binaries: NodeBinaries,
    layout: RealNodeLayout,
    *,
    labels: Mapping[str, str],
    extra: Iterable[str] = (),
) -> list[str]:
    argv = [
        str(binaries.kubelet),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubelet_kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={REAL_NODE_NAME}",
    ]
    if labels:
        argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return [*argv, *extra]


def containerd_args(binaries: NodeBinaries, layout: RealNodeLayout) -> list[str]:
    return [str(binaries.containerd), f"--config={layout.containerd_config}"]


def node_env(binaries: NodeBinaries, layout: RealNodeLayout) -> dict[str, str]:
    """containerd finds its shim on PATH; the kubelet runs mount(8) for tmpfs volumes."""
    return {
        "HOME": str(layout.directory),
        "PATH": f"{binaries.containerd_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


# --------------------------------------------------------------------------------- the lock


class NodeLock:
    """The machine-wide flock that lets one real node run at a time."""

    def __init__(self, path: Path = REAL_NODE_LOCK) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, timeout: float, on_wait: Callable[[], None] | None = None) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RealNodeError(
                        f"another real node holds {self.path} (only one runs on a machine at a "
                        f"time); waited {timeout:.0f}s. Stop it (gpuplace cluster down) or find "
                        f"its holder with: fuser -v {self.path}"
                    ) from None
                time.sleep(0.5)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --------------------------------------------------------------------------------- images


def node_images(binaries: NodeBinaries) -> list[Image]:
    return [
        pause_image(binaries.pause.read_bytes()),
        gpu_probe_image(binaries.gpu_probe.read_bytes()),
    ]


def import_images(binaries: NodeBinaries, layout: RealNodeLayout, images: Iterable[Image]) -> None:
    """Writes each image as an OCI archive and imports it into containerd's k8s.io namespace."""
    layout.images.mkdir(parents=True, exist_ok=True)
    for image in images:
        archive = layout.images / (image.name.replace("/", "_").replace(":", "_") + ".tar")
        archive.write_bytes(oci_archive(image))
        ctr(
            binaries,
            layout,
            "images",
            "import",
            "--label=io.cri-containerd.image=managed",
            str(archive),
        )


def ctr(
    binaries: NodeBinaries, layout: RealNodeLayout, *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``ctr -n k8s.io ARGS`` against the node's containerd; raises `RealNodeError` on failure."""
    argv = [
        str(binaries.ctr),
        f"--address={layout.containerd_socket}",
        "--namespace=k8s.io",
        *args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RealNodeError(
            f"ctr {' '.join(args)} exited with status {result.returncode}: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result


# --------------------------------------------------------------------------------- cleanup


def node_directory(link: Path, *, create: bool = False) -> Path:
    """The node directory that ``<cluster>/node`` stands for: itself, or, when its path is too long
    for the sockets below it, the short directory it links to (made and linked with ``create``)."""
    if link.is_symlink():
        return link.resolve()
    if not create or len(str(link)) <= _MAX_NODE_DIRECTORY:
        return link
    digest = hashlib.sha256(str(link.absolute()).encode()).hexdigest()[:10]
    short = Path(tempfile.gettempdir()) / f"{_SHORT_PREFIX}{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    link.symlink_to(short, target_is_directory=True)
    return short


def remove_node_directory(link: Path) -> None:
    """Removes the short directory ``<cluster>/node`` links to, and the link (after `cleanup`)."""
    if link.is_symlink():
        target = link.resolve()
        if target.name.startswith(_SHORT_PREFIX):
            shutil.rmtree(target, ignore_errors=True)
        link.unlink()


def record_created_paths(layout: RealNodeLayout) -> None:
    """Records which system paths do not exist yet: those the node creates are removed on stop.
    For each, the topmost missing ancestor is recorded (``/var/lib/kubelet`` when that is new)."""
    created: list[str] = []
    for path in SYSTEM_PATHS:
        top = None
        for candidate in [*reversed(path.parents), path]:
            if not candidate.exists():
                top = candidate
                break
        if top is not None:
            created.append(str(top))
    cgroups = [str(c) for c in _cgroup_roots() if not (c / "kubepods").exists()]
    layout.created_paths.write_text(json.dumps({"paths": created, "cgroupRoots": cgroups}))


def cleanup(layout: RealNodeLayout) -> list[str]:
    """Removes what a stopped node leaves behind; returns what it could not remove.

    Runs after the kubelet and containerd have exited: kills the containers of the node's shims and
    the shims, unmounts everything below the node directory, deletes the CNI bridge, removes the
    ``kubepods`` cgroups and the system paths the node created. Safe to run twice.
    """
    problems: list[str] = []
    _kill_shims(layout)
    problems += _unmount_below(layout.directory)
    problems += network.remove(layout.network_record)
    if Path("/sys/class/net", BRIDGE).exists() and shutil.which("ip"):
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    try:
        recorded = json.loads(layout.created_paths.read_text())
    except (FileNotFoundError, ValueError):
        recorded = {"paths": [], "cgroupRoots": []}
    for root in recorded.get("cgroupRoots", []):
        problems += _remove_cgroup_tree(Path(root) / "kubepods")
    for path in recorded.get("paths", []):
        problems += _unmount_below(Path(path))
        shutil.rmtree(path, ignore_errors=True)
        if Path(path).exists():
            problems.append(f"{path}: could not be removed")
    return problems


def _kill_shims(layout: RealNodeLayout) -> None:
    """SIGKILLs the processes under this node's containerd shims, then the shims. A shim is ours
    when its command line names this node's containerd socket; it reaps its containers (it is their
    subreaper), so they are its descendants."""
    address = str(layout.containerd_socket)
    parents: dict[int, int] = {}
    shims: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
        if (
            cmdline
            and cmdline[0].endswith(b"containerd-shim-runc-v2")
            and any(arg.decode(errors="replace") == address for arg in cmdline)
        ):
            shims.append(pid)
    if not shims:
        return
    descendants: list[int] = []
    frontier = set(shims)
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        descendants += children
        frontier = set(children)
    for pid in [*descendants, *shims]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in shims):
        time.sleep(0.05)


def _mounts_below(directory: Path) -> list[Path]:
    prefix = str(directory.resolve()) if directory.exists() else str(directory)
    found = []
    with contextlib.suppress(FileNotFoundError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = _unescape(line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return found


def _unmount_below(directory: Path) -> list[str]:
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(20):  # mounts can be stacked on one point
        mounts = _mounts_below(directory)
        if not mounts:
            return []
        for point in sorted(mounts, key=lambda p: len(p.parts), reverse=True):
            libc.umount2(str(point).encode(), _MNT_DETACH)
    return [f"{p}: still mounted" for p in _mounts_below(directory)]


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def _cgroup_roots() -> list[Path]:
    """The cgroup hierarchies' mount points (one on cgroup v2, one per controller on v1)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base]
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())


def _remove_cgroup_tree(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    directories = sorted(
        (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    )
    for directory in [*directories, root]:
        with contextlib.suppress(OSError):
            directory.rmdir()
    return [f"{root}: not empty (processes left in it)"] if root.exists() else []
