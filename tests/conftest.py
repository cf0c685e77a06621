"""How the suite runs in parallel (`make test`: pytest-xdist, `-n WORKERS --dist loadfile`).

Each test file goes to one worker as a whole, so a file's module fixtures (a controller, a
webhook) start once. The tests that run pods on the machine's one real node
(``REAL_NODE_PATHS``) all go to one worker, one after the other: they would otherwise wait on
each other for the real-node lock. A test marked ``real_node`` elsewhere fails at collection.
Without ``-n`` the suite runs in one process, in the same order.
"""

from __future__ import annotations

import pytest

#: Where the tests that need the real node live (node id prefixes; scheduled as one unit).
REAL_NODE_PATHS = (
    "tests/e2e/",
    "tests/e2e_chart/",
    "tests/e2e_argocd/",
    "tests/integration/test_real_node",
)
#: The scope name of that unit.
REAL_NODE_SCOPE = "real-node"


def real_node_path(nodeid: str) -> bool:
    return nodeid.startswith(REAL_NODE_PATHS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `config.rootpath` is the repository: node ids read tests/..., as REAL_NODE_PATHS does.
    misplaced = [
        item.nodeid
        for item in items
        if item.get_closest_marker("real_node") and not real_node_path(item.nodeid)
    ]
    if misplaced:
        raise pytest.UsageError(
            "tests marked real_node must live under one of "
            f"{', '.join(REAL_NODE_PATHS)} (tests/conftest.py): {', '.join(misplaced[:5])}"
        )


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Scheduling(), "gpuplace-scheduling")


class _Scheduling:
    """Registered only where pytest-xdist is installed (its hook is unknown to pytest without)."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object | None:
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415 - only with xdist

        class ByFileRealNodeTogether(LoadFileScheduling):  # type: ignore[misc]
            """Files in collection order (the real node's unit first, unit tests last to fill
            the tail), each file one unit, the real node's files one unit."""

            def _split_scope(self, nodeid: str) -> str:
                if real_node_path(nodeid):
                    return REAL_NODE_SCOPE
                return str(super()._split_scope(nodeid))

        config.option.loadscopereorder = False
        return ByFileRealNodeTogether(config, log)
