"""Deterministic OCI archives for hack/build-image.sh (standard library only).

  python3 hack/oci.py base ROOTFS.tar NAME OUT.tar   a base image: one layer, the rootfs tar as it is
  python3 hack/oci.py pack LAYOUT_DIR NAME OUT.tar   an OCI layout directory packed as a tar
  python3 hack/oci.py digest OUT.tar                 the image's manifest digest
  python3 hack/oci.py id OUT.tar                     its config's digest (the image ID kubelets show)

Every entry of a packed archive is written in sorted order with mtime 0 and root ownership, so the
same image gives the same bytes: `make image` twice from one commit gives one digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
INDEX = "application/vnd.oci.image.index.v1+json"


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def info(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    entry.mode = 0o755 if directory else 0o644
    entry.size = size
    entry.mtime = 0
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    return entry


def index_for(name: str, manifest: bytes) -> bytes:
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": sha(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )


def write(out: Path, blobs: dict[str, Path | bytes], index: bytes) -> None:
    """An OCI layout tar of `blobs` (digest -> file or bytes) and `index`."""
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in ("blobs", "blobs/sha256"):
            archive.addfile(info(directory, directory=True))
        layout = canonical({"imageLayoutVersion": "1.0.0"})
        archive.addfile(info("index.json", len(index)), io.BytesIO(index))
        archive.addfile(info("oci-layout", len(layout)), io.BytesIO(layout))
        for digest in sorted(blobs):
            blob = blobs[digest]
            name = f"blobs/sha256/{digest.removeprefix('sha256:')}"
            if isinstance(blob, bytes):
                archive.addfile(info(name, len(blob)), io.BytesIO(blob))
            else:
                with blob.open("rb") as f:
                    archive.addfile(info(name, blob.stat().st_size), f)
    tmp.replace(out)


def base(rootfs: Path, name: str, out: Path) -> None:
    layer = file_sha(rootfs)
    config = canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": ["/bin/sh"],
            },
            "rootfs": {"type": "layers", "diff_ids": [layer]},
            "history": [{"created_by": "mmdebstrap (hack/build-image.sh)"}],
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": sha(config), "size": len(config)},
            "layers": [{"mediaType": LAYER, "digest": layer, "size": rootfs.stat().st_size}],
        }
    )
    blobs: dict[str, Path | bytes] = {layer: rootfs, sha(config): config, sha(manifest): manifest}
    write(out, blobs, index_for(name, manifest))


def pack(layout: Path, name: str, out: Path) -> None:
    """Repacks an OCI layout directory (one image) deterministically, named `name`."""
    index = json.loads((layout / "index.json").read_text())
    [descriptor] = index["manifests"]
    manifest = (layout / "blobs/sha256" / descriptor["digest"].removeprefix("sha256:")).read_bytes()
    blobs: dict[str, Path | bytes] = {
        f"sha256:{p.name}": p for p in sorted((layout / "blobs/sha256").iterdir())
    }
    write(out, blobs, index_for(name, manifest))


def digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise SystemExit(f"{archive}: no index.json")
        index = json.loads(member.read())
    return str(index["manifests"][0]["digest"])


def image_id(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        if index is None:
            raise SystemExit(f"{archive}: no index.json")
        digest = json.loads(index.read())["manifests"][0]["digest"]
        manifest = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        if manifest is None:
            raise SystemExit(f"{archive}: no manifest {digest}")
        return str(json.loads(manifest.read())["config"]["digest"])


def main(argv: list[str]) -> int:
    match argv:
        case ["base", rootfs, name, out]:
            base(Path(rootfs), name, Path(out))
        case ["pack", layout, name, out]:
            pack(Path(layout), name, Path(out))
        case ["digest", archive]:
            print(digest(Path(archive)))
        case ["id", archive]:
            print(image_id(Path(archive)))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
