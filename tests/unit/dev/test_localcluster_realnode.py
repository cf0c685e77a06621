"""The real node's pure parts: OCI archives, containerd / CNI / kubelet configuration, the lock."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from gpuplace_dev.localcluster.images import GPU_PROBE_IMAGE, gpu_probe_image, oci_archive
from gpuplace_dev.localcluster.nodebinaries import NodeBinaries
from gpuplace_dev.localcluster.realnode import (
    POD_GATEWAY,
    POD_RANGE_END,
    POD_SUBNET,
    TENANT_ADDRESSES,
    NodeLock,
    RealNodeError,
    RealNodeLayout,
    cni_config,
    containerd_config,
    kubelet_args,
    kubelet_configuration,
)


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name: m for m in archive.getmembers()}


def read(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        handle = archive.extractfile(name)
        assert handle is not None
        return handle.read()


def test_oci_archive_is_a_valid_content_addressed_layout() -> None:
    data = oci_archive(gpu_probe_image(b"\x7fELF probe"))
    names = members(data)
    assert {"oci-layout", "index.json"} <= set(names)
    # Every blob is named by its digest.
    for name in names:
        if name.startswith("blobs/sha256/") and names[name].isfile():
            assert hashlib.sha256(read(data, name)).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(read(data, "index.json"))
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == GPU_PROBE_IMAGE
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "dev"
    manifest = json.loads(read(data, "blobs/sha256/" + entry["digest"].removeprefix("sha256:")))
    config = json.loads(
        read(data, "blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
    )
    assert config["config"]["Entrypoint"] == ["/bin/gpu-probe"]
    layer = read(data, "blobs/sha256/" + manifest["layers"][0]["digest"].removeprefix("sha256:"))
    # An uncompressed layer: its digest is its diff_id.
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    files = members(layer)
    assert files["bin"].isdir()
    assert read(layer, "bin/gpu-probe") == b"\x7fELF probe"
    assert files["bin/gpu-probe"].mode == 0o755
    assert files["bin/env"].issym() and files["bin/env"].linkname == "gpu-probe"


def test_oci_archive_is_reproducible() -> None:
    assert oci_archive(gpu_probe_image(b"x")) == oci_archive(gpu_probe_image(b"x"))
    assert oci_archive(gpu_probe_image(b"x")) != oci_archive(gpu_probe_image(b"y"))


@pytest.fixture
def binaries(tmp_path: Path) -> NodeBinaries:
    root = tmp_path / "cache"
    return NodeBinaries(
        root=root,
        kubelet=root / "kubelet",
        containerd=root / "containerd" / "containerd",
        ctr=root / "containerd" / "ctr",
        containerd_dir=root / "containerd",
        runc=root / "runc",
        cni_bin_dir=root / "cni",
        pause=root / "pause",
        gpu_probe=root / "gpu-probe",
        dra_driver=root / "gpuplace-dra-driver",
    )


def test_containerd_config_keeps_its_state_below_the_node_directory(
    tmp_path: Path, binaries: NodeBinaries
) -> None:
    layout = RealNodeLayout(tmp_path / "node")
    config = tomllib.loads(containerd_config(layout, binaries))
    assert config["version"] == 3
    assert config["root"] == str(layout.containerd_root)
    assert config["state"] == str(layout.containerd_state)
    assert config["grpc"]["address"] == str(layout.containerd_socket)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    # What DRA needs, and what a VM without CAP_SYS_RESOURCE needs.
    assert runtime["enable_cdi"] is True
    assert runtime["cdi_spec_dirs"] == [str(layout.cdi_dir)]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc["BinaryName"] == str(binaries.runc)
    assert runc["Root"] == str(layout.runc_root)
    assert runtime["cni"]["bin_dirs"] == [str(binaries.cni_bin_dir)]
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "gpuplace.local/pause:dev"


def test_cni_config_changes_no_routing(tmp_path: Path) -> None:
    bridge = cni_config(RealNodeLayout(tmp_path))["plugins"][0]
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_SUBNET, "rangeEnd": POD_RANGE_END}]]
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path))


def test_no_pod_gets_a_tenant_address_or_the_gateway(tmp_path: Path) -> None:
    bridge = cni_config(RealNodeLayout(tmp_path), "10.96.0.0/12")["plugins"][0]
    [[pod_range]] = bridge["ipam"]["ranges"]
    subnet = ipaddress.ip_network(pod_range["subnet"])
    gateway = ipaddress.ip_interface(POD_GATEWAY)
    assert gateway.ip in subnet and pod_range["gateway"] == str(gateway.ip)
    assert len(set(TENANT_ADDRESSES)) == 2
    for address in TENANT_ADDRESSES:
        tenant = ipaddress.ip_address(address)
        assert tenant in subnet  # on the pods' link: they answer it
        assert tenant > ipaddress.ip_address(pod_range["rangeEnd"])
        assert tenant not in (gateway.ip, subnet.broadcast_address)


def test_kubelet_configuration_and_args(tmp_path: Path, binaries: NodeBinaries) -> None:
    layout = RealNodeLayout(tmp_path)
    config = kubelet_configuration(
        layout,
        port=12345,
        ca_file=tmp_path / "ca",
        serving_cert=tmp_path / "c",
        serving_key=tmp_path / "k",
    )
    assert config["address"] == "127.0.0.1" and config["port"] == 12345
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert (config["cgroupDriver"], config["failCgroupV1"], config["failSwapOn"]) == (
        "cgroupfs",
        False,
        False,
    )
    assert config["imageGCHighThresholdPercent"] == 100
    argv = kubelet_args(binaries, layout, labels={"b": "2", "a": "1"}, extra=["--v=2"])
    assert "--hostname-override=localhost" in argv
    assert f"--root-dir={layout.kubelet_root}" in argv
    assert "--node-labels=a=1,b=2" in argv
    assert argv[-1] == "--v=2"


def test_node_lock_admits_one_holder(tmp_path: Path) -> None:
    first, second = NodeLock(tmp_path / "lock"), NodeLock(tmp_path / "lock")
    first.acquire(1.0)
    waited: list[bool] = []
    with pytest.raises(RealNodeError, match="another real node holds"):
        second.acquire(0.6, on_wait=lambda: waited.append(True))
    assert waited == [True]
    first.release()
    second.acquire(1.0)
    second.release()
