"""Fixtures of the installed-chart tests (`make e2e-chart`): a local cluster with the real node
and its pod network, gpuplace's image built here and its chart installed with helm.

- ``installed`` (module): the cluster with the chart installed and every component's pods Ready on
  node ``localhost``; the image it runs (``installed.image``).
- ``ns`` (function): a fresh namespace on that cluster, deleted after the test.

Every test here is marked ``chart`` and ``real_node``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster, chart

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.chart)
            item.add_marker(pytest.mark.real_node)


@dataclass
class Installed:
    cluster: LocalCluster
    image: chart.BuiltImage
    nvml: Path


@contextlib.contextmanager
def chart_on_the_real_node(
    tmp_path_factory: pytest.TempPathFactory, values: Sequence[Mapping[str, Any]] = ()
) -> Iterator[Installed]:
    """A cluster with the real node and the chart installed from the image built here, with
    `values` over the local ones; stopped on exit."""
    image = chart.build_image()
    cluster = LocalCluster(
        tmp_path_factory.mktemp("chart-cluster"),
        real_nodes=1,
        scheduler=True,
        pod_network=True,
        policies=False,
    )
    try:
        cluster.start()
        chart.import_image(cluster, image)
        nvml = chart.nvml_directory(cluster, chart.fake_nvml(4))
        chart.install(cluster, image, nvml, values=values)
        yield Installed(cluster, image, nvml)
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    with chart_on_the_real_node(tmp_path_factory) as running:
        yield running


@pytest.fixture
def ns(installed: Installed) -> Iterator[str]:
    name = f"chart-{uuid.uuid4().hex[:6]}"
    installed.cluster.create_namespace(name)
    yield name
    installed.cluster.delete_namespace(name)
