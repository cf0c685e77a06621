"""dra enforcement: one ResourceClaimTemplate per map of the model, kept in step with it."""

from __future__ import annotations

from controller.dra import TemplateKeeper
from controller.informers import snapshot
from kubeio.client import Obj
from kubeio.informer import DELETED, Informer
from placement.types import MapKey


class TemplateSync:
    """Marked by a published model (`mark`, reconcile loop) and by someone else's change to a
    template (`on_template`, the templates' informer thread); synced by the reconcile loop. The
    mark is a flag: a sync that misses one made meanwhile runs again at the next pass."""

    def __init__(self, keeper: TemplateKeeper, templates: Informer) -> None:
        self.keeper = keeper
        self.templates = templates
        self._dirty = False

    def mark(self) -> None:
        self._dirty = True

    def on_template(self, event: str, _obj: Obj, _old: Obj | None) -> None:
        if event in (DELETED, "MODIFIED"):  # someone else changed one: put it back
            self._dirty = True

    def sync(self, maps: list[MapKey]) -> None:
        """One ResourceClaimTemplate per map of the model, after it changed."""
        if not self._dirty:
            return
        self._dirty = False
        current = snapshot(self.templates)
        self.keeper.sync(maps, current)
