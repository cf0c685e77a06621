"""Container images without a registry or a Docker engine: OCI image archives written from static
binaries, for ``ctr images import``.

One image is one uncompressed layer plus its config, manifest and index, in the OCI image layout
(``oci-layout``, ``index.json``, ``blobs/sha256/...``) packed as a tar. The index names the image
with the ``io.containerd.image.name`` annotation, which ``ctr images import`` uses as the image's
name. The archive is byte-for-byte reproducible: the same files give the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The pod sandbox image of the real node (containerd's pinned ``sandbox`` image).
PAUSE_IMAGE = "gpuplace.local/pause:dev"
#: The workload image: prints the GPU environment it started with, then waits (hack/gpu-probe).
GPU_PROBE_IMAGE = "gpuplace.local/gpu-probe:dev"

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class ImageFile:
    """A regular file of the image: its content and mode."""

    data: bytes
    mode: int = 0o755


@dataclass(frozen=True)
class Image:
    """What goes into an image: files by absolute path, symlinks (path -> target), and the
    container's defaults."""

    name: str
    files: Mapping[str, ImageFile]
    entrypoint: Sequence[str]
    symlinks: Mapping[str, str] = field(default_factory=dict)
    env: Sequence[str] = ("PATH=/bin",)
    architecture: str = "amd64"


def pause_image(pause: bytes) -> Image:
    return Image(PAUSE_IMAGE, {"/pause": ImageFile(pause)}, entrypoint=["/pause"])


def gpu_probe_image(probe: bytes) -> Image:
    """The probe at /bin/gpu-probe, and /bin/env pointing at it: the probe acts as env(1) when
    called so, which is what ``kubectl exec POD -- env`` runs."""
    return Image(
        GPU_PROBE_IMAGE,
        {"/bin/gpu-probe": ImageFile(probe)},
        entrypoint=["/bin/gpu-probe"],
        symlinks={"/bin/env": "gpu-probe"},
    )


def oci_archive(image: Image) -> bytes:
    """The image as an OCI image-layout tar."""
    layer = _layer(image)
    layer_digest = _digest(layer)
    config = _json(
        {
            "architecture": image.architecture,
            "os": "linux",
            "config": {
                "Entrypoint": list(image.entrypoint),
                "Env": list(image.env),
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "gpuplace_dev.localcluster.images"}],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": {"mediaType": _CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": _LAYER, "digest": layer_digest, "size": len(layer)}],
        }
    )
    tag = image.name.rsplit(":", 1)[1] if ":" in image.name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": _INDEX,
            "manifests": [
                {
                    "mediaType": _MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": image.architecture, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": image.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    entries: dict[str, bytes] = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
    }
    for blob in (layer, config, manifest):
        entries[f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}"] = blob
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in ("blobs", "blobs/sha256"):
            archive.addfile(_info(directory, tarfile.DIRTYPE, 0o755))
        for name, data in entries.items():
            archive.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return out.getvalue()


def _layer(image: Image) -> bytes:
    paths = {p.lstrip("/") for p in [*image.files, *image.symlinks]}
    directories = sorted({str(parent) for p in paths for parent in _parents(p)})
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in directories:
            archive.addfile(_info(directory, tarfile.DIRTYPE, 0o755))
        for path, file in sorted(image.files.items()):
            info = _info(path.lstrip("/"), tarfile.REGTYPE, file.mode, len(file.data))
            archive.addfile(info, io.BytesIO(file.data))
        for path, target in sorted(image.symlinks.items()):
            info = _info(path.lstrip("/"), tarfile.SYMTYPE, 0o777)
            info.linkname = target
            archive.addfile(info)
    return out.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
