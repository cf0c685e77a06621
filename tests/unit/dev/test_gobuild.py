"""gobuild: the lookup of a release built by a hack/ script into the cache (`find_built`) and the
reading of a pinned version from a go.mod, which the launchers of Go components share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuplace_dev.gobuild import find_built, go_mod_version


class NotBuiltError(Exception):
    pass


@dataclass(frozen=True)
class Release:
    root: Path

    def complete(self) -> bool:
        return (self.root / "bin").is_file()


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "build.sh"
    path.write_text(f"set -e\n{body}\n")
    return path


def test_a_complete_release_is_found_without_building(tmp_path: Path) -> None:
    (tmp_path / "bin").write_text("")
    release = Release(tmp_path)
    found = find_built(
        release, script(tmp_path, "exit 1"), build=True, not_built="x", error=NotBuiltError
    )
    assert found is release


def test_a_missing_release_is_built_by_its_script(tmp_path: Path) -> None:
    build = script(tmp_path, f"touch {tmp_path}/bin; echo {tmp_path}")
    found = find_built(Release(tmp_path), build, build=True, not_built="x", error=NotBuiltError)
    assert found.complete()


def test_without_build_a_missing_release_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(NotBuiltError, match=r": v1 is not built; run `make it`$"):
        find_built(
            Release(tmp_path),
            script(tmp_path, f"touch {tmp_path}/bin"),
            build=False,
            not_built="v1 is not built; run `make it`",
            error=NotBuiltError,
        )
    assert not Release(tmp_path).complete()


@pytest.mark.parametrize("body", ["exit 3", "true"])
def test_a_failed_or_incomplete_build_names_the_script(tmp_path: Path, body: str) -> None:
    build = script(tmp_path, body)
    with pytest.raises(NotBuiltError, match=f"{build} failed with exit status"):
        find_built(Release(tmp_path), build, build=True, not_built="x", error=NotBuiltError)


GO_MOD = """module example.com/wrapper

go 1.25

require github.com/argoproj/argo-cd/v3 v3.2.11

require (
\tsigs.k8s.io/jobset v0.11.0
\tsigs.k8s.io/jobset/extra v9.9.9
\tsigs.k8s.io/lws v0.8.0 // indirect
)
"""


@pytest.mark.parametrize(
    ("module", "version"),
    [
        ("github.com/argoproj/argo-cd/v3", "v3.2.11"),
        ("sigs.k8s.io/jobset", "v0.11.0"),
        ("sigs.k8s.io/lws", "v0.8.0"),
    ],
)
def test_a_pinned_version_is_read_from_a_require_line_or_block(
    tmp_path: Path, module: str, version: str
) -> None:
    go_mod = tmp_path / "go.mod"
    go_mod.write_text(GO_MOD)
    assert go_mod_version(go_mod, module, NotBuiltError) == version


def test_a_module_the_go_mod_does_not_require_is_an_error_naming_the_file(tmp_path: Path) -> None:
    go_mod = tmp_path / "go.mod"
    go_mod.write_text(GO_MOD)
    with pytest.raises(NotBuiltError, match=f"{go_mod}: no 'sigs.k8s.io/kueue vX.Y.Z' requirement"):
        go_mod_version(go_mod, "sigs.k8s.io/kueue", NotBuiltError)
