"""Which namespaces' pods the binder places or holds by a gpu-scheduling-map line of their own: the
chart's `global.legacy.namespaceSelector` (with the namespaces the webhook never sees), the same
selector that narrows the webhook's legacy entry. A legacy pod outside it was never checked by
the webhook, so the binder neither places it nor counts what its line claims (docs/trust.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kubeio.informer import Informer
from placement.annotations import LEGACY_ANNOTATION
from placement.grants import NodeSelector


@dataclass(frozen=True)
class LegacyScope:
    """`selector` over namespace labels (None: every namespace); `namespaces` the trimmed
    namespaces informer it reads them from (controller/trim.py). Read on the binder's and the
    informers' threads: a dict lookup in the informer's store, whose thread alone writes it."""

    selector: NodeSelector | None = None
    namespaces: Informer | None = None

    def selects(self, namespace: str) -> bool:
        if self.selector is None:
            return True
        if self.namespaces is None:
            return False
        obj = self.namespaces.get("", namespace)
        if obj is None:
            return False  # not seen (yet): nothing is placed by a line of a namespace unknown
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return self.selector.matches(labels)

    def refusal(self, namespace: str) -> str:
        return (
            f"namespace {namespace} is not selected by the legacy namespace selector "
            f"(--legacy-namespace-selector, the chart's global.legacy.namespaceSelector): "
            f"gpuplace places no pod of it by annotation {LEGACY_ANNOTATION}; label the "
            "namespace to match, or give the pod label gpuplace.io/map"
        )
