"""Installs print no setuptools deprecation banner: `project.license` is an SPDX expression
(PEP 639), which needs setuptools 77 or later in the build requirements."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_license_is_an_spdx_string_and_the_build_backend_supports_it() -> None:
    data = tomllib.loads(PYPROJECT.read_text())
    assert data["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert minimum is not None and int(minimum.group(1)) >= 77, setuptools
    assert not any("License ::" in c for c in data["project"].get("classifiers", []))
