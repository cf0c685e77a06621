"""Reading several clusters at once: which kubeconfig contexts a command reads, and one reading
of each, concurrently, where a cluster that cannot be read is a result that says why (never a
failure of the others).

A cluster is named by its kubeconfig context: the ArgoCD cluster name, the repository's
`clusters/<name>` directory and the context are meant to be the same word (docs/fleet.md)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes import config as k8s_config
from kubernetes.config import ConfigException

from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError

T = TypeVar("T")

#: Seconds a fleet read waits for one cluster's answer before calling it unreachable.
DEFAULT_TIMEOUT = 10.0

#: What reading an unreachable, refusing or misconfigured cluster raises.
READ_ERRORS = (APIError, ConfigException, OSError, ValueError)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One cluster's answer: `value`, or (unreachable) `error`, the reason."""

    cluster: str
    value: T | None = None
    error: str = ""

    @property
    def reachable(self) -> bool:
        return not self.error


def kubeconfig_contexts(kubeconfig: str | None) -> list[str]:
    """The names of the kubeconfig's contexts, in the file's order ([] without a kubeconfig)."""
    try:
        contexts, _current = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, TypeError):
        return []
    return [str(c["name"]) for c in contexts or []]


def contexts_to_read(
    kubeconfig: str | None, given: Sequence[str], all_contexts: bool
) -> list[str | None]:
    """The contexts a command reads: each `--context` once, in order; every context of the
    kubeconfig with `--all-contexts`; the current one (None) when neither is given."""
    if all_contexts:
        found = kubeconfig_contexts(kubeconfig)
        if not found:
            raise ValueError(
                f"--all-contexts: no context in {kubeconfig or 'the default kubeconfig'}"
            )
        return list(found)
    unique = list(dict.fromkeys(given))
    return list(unique) if unique else [None]


def read_one(
    cluster: str,
    kubeconfig: str | None,
    context: str | None,
    read: Callable[[Kube], T],
    timeout: float = DEFAULT_TIMEOUT,
) -> Reading[T]:
    """`read` against one context; an error (no such context, refused, timed out, forbidden)
    becomes the reading's `error`."""
    kube: Kube | None = None
    try:
        kube = Kube.connect(
            ClientSettings(kubeconfig=kubeconfig, context=context, timeout_seconds=timeout)
        )
        return Reading(cluster, read(kube))
    except READ_ERRORS as exc:
        return Reading(cluster, error=_reason(exc))
    finally:
        if kube is not None:
            kube.close()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:300]


def read_all(
    kubeconfig: str | None,
    contexts: Sequence[str | None],
    read: Callable[[Kube], T],
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Reading[T]]:
    """One reading per context, the clusters read concurrently, in the order given. A context
    of None (the current one) is named "current"."""
    names = [c if c is not None else "current" for c in contexts]
    if len(contexts) == 1:
        return [read_one(names[0], kubeconfig, contexts[0], read, timeout)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(contexts))) as pool:
        futures = [
            pool.submit(read_one, name, kubeconfig, context, read, timeout)
            for name, context in zip(names, contexts, strict=True)
        ]
        return [f.result() for f in futures]


def unreachable_text(reading: Reading[Any]) -> str:
    return f"unreachable: {reading.error}"
