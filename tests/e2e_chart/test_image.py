"""The gpuplace image as `make image` builds it (hack/build-image.sh: the Dockerfile through buildah,
on a Debian base from mmdebstrap): reproducible, and holding what the chart expects of it.

The archive is read as the OCI layout it is (index, manifest, config, layers), and its root
filesystem, unpacked, runs `gpuplace` under chroot as the image's user.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import chart

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
CHROOT = shutil.which("chroot") or shutil.which("chroot", path="/usr/sbin:/sbin") or "chroot"
BUILD_TOOLS = ("gcc", "cc", "c++", "make", "ld", "pip", "pip3", "apt-get", "dpkg-buildpackage")


@pytest.fixture(scope="module")
def image() -> tuple[Path, str]:
    first = chart.build_image(force=True)
    again = chart.build_image(force=True)
    assert again.archive == first.archive
    assert again.digest == first.digest, "two builds of the same commit gave two digests"
    return first.archive, first.digest


class Archive:
    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)  # noqa: SIM115 - closed by the fixture

    def blob(self, digest: str) -> bytes:
        member = self.tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        assert member is not None, digest
        return member.read()

    def json(self, name: str) -> Any:
        member = self.tar.extractfile(name)
        assert member is not None, name
        return json.loads(member.read())


@pytest.fixture(scope="module")
def archive(image: tuple[Path, str]) -> Iterator[Archive]:
    opened = Archive(image[0])
    yield opened
    opened.tar.close()


@pytest.fixture(scope="module")
def rootfs(archive: Archive, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's layers unpacked in order (OCI whiteouts applied)."""
    root = tmp_path_factory.mktemp("rootfs")
    manifest = json.loads(archive.blob(archive.json("index.json")["manifests"][0]["digest"]))
    for layer in manifest["layers"]:
        path = root.parent / "layer.tar"
        path.write_bytes(archive.blob(layer["digest"]))
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if name.name.startswith(".wh."):
                    target = root / name.parent / name.name.removeprefix(".wh.")
                    subprocess.run(["rm", "-rf", str(target)], check=True)
                    continue
                tar.extract(member, root, filter="fully_trusted")
        path.unlink()
    return root


def test_the_archive_names_the_image_and_its_digest(
    image: tuple[Path, str], archive: Archive
) -> None:
    [descriptor] = archive.json("index.json")["manifests"]
    assert descriptor["digest"] == image[1]
    assert (
        descriptor["annotations"]["io.containerd.image.name"]
        == f"gpuplace.local/gpuplace:{VERSION}"
    )


def test_the_image_runs_gpuplace_as_user_65532(archive: Archive) -> None:
    manifest = json.loads(archive.blob(archive.json("index.json")["manifests"][0]["digest"]))
    config = json.loads(archive.blob(manifest["config"]["digest"]))["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["gpuplace"]
    assert config["Cmd"] == ["--help"]
    assert "PATH=/opt/gpuplace/bin:" in " ".join(config["Env"])


def test_the_image_holds_gpuplace_and_no_build_tools(rootfs: Path) -> None:
    site = next((rootfs / "opt/gpuplace/lib").glob("python3.*/site-packages"))
    assert (site / f"gpuplace-{VERSION}.dist-info").is_dir()
    assert not list(site.glob("pip-*.dist-info")) and not list(site.glob("setuptools-*"))
    for directory in ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin", "opt/gpuplace/bin"):
        for tool in BUILD_TOOLS:
            assert not (rootfs / directory / tool).exists(), f"/{directory}/{tool}"
    assert "gpuplace:x:65532:65532:" in (rootfs / "etc/passwd").read_text()


def test_the_image_holds_no_development_environment(rootfs: Path) -> None:
    """The local cluster, the ArgoCD launcher and the demo (dev/, gpuplace_dev) are not shipped."""
    site = next((rootfs / "opt/gpuplace/lib").glob("python3.*/site-packages"))
    assert (site / "gpuplace" / "cli.py").is_file()
    assert not (site / "gpuplace_dev").exists()
    assert not list(site.glob("gpuplace_dev-*"))
    for name in ("localcluster", "localargocd", "demo"):
        assert not (site / "gpuplace" / name).exists(), name
    assert not list(rootfs.glob("opt/gpuplace/**/dev/pyproject.toml"))


def test_the_image_runs_the_cli_as_its_user(rootfs: Path) -> None:
    def run(*argv: str) -> str:
        result = subprocess.run(
            [CHROOT, "--userspec=65532:65532", str(rootfs), *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={"PATH": "/opt/gpuplace/bin:/usr/bin:/bin", "GIT_PYTHON_REFRESH": "quiet"},
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    # The subcommands, as the help lists them: a name at the start of an indented line.
    commands = set(re.findall(r"^ {4}([a-z][a-z-]*)(?: |$)", run("gpuplace", "--help"), re.M))
    assert {"controller", "webhook", "agent", "plan"} <= commands, commands
    # The shipped command line lacks the development environment's subcommands.
    assert "cluster" not in commands and "demo" not in commands, commands
    version = run("python", "-c", "import importlib.metadata as m; print(m.version('gpuplace'))")
    assert version.strip() == VERSION
    # Bytecode was compiled at build time: the read-only root filesystem needs no writes.
    assert list(
        (rootfs / "opt/gpuplace/lib").glob("python3.*/site-packages/placement/__pycache__/*.pyc")
    )
