"""`find_built`: the lookup of a release built by a hack/ script into the cache, which ArgoCD's and
Argo Workflows' launchers share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuplace_dev.builtcache import find_built


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
