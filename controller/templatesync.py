"""dra enforcement: one ResourceClaimTemplate per map of the model, kept in step with it. Its queue
has one key, `TEMPLATES`, added by the model keeper when it publishes a model and by the templates'
informer when someone else changes or deletes one; a reconcile syncs every template against the
published snapshot's maps, on the leader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from controller.dra import TemplateKeeper
from controller.informers import snapshot
from controller.snapshot import Published
from controller.workqueue import WorkQueue
from kubeio.client import Obj
from kubeio.informer import DELETED, Informer

#: The templates queue's one key.
TEMPLATES: Final = "templates"
#: After someone else's change, the sync waits this long: the informer's store then holds the
#: echo of our own last writes, which a sync against it would otherwise undo and redo.
SETTLE_SECONDS = 0.5


class TemplateSync:
    def __init__(
        self,
        keeper: TemplateKeeper,
        templates: Informer,
        published: Published,
        queue: WorkQueue[str],
        holds_lease: Callable[[], bool],
    ) -> None:
        self.keeper = keeper
        self.templates = templates
        self.published = published
        self.queue = queue
        self.holds_lease = holds_lease

    def on_template(self, event: str, _obj: Obj, _old: Obj | None) -> None:
        """The templates' informer handler (informer thread)."""
        if event in (DELETED, "MODIFIED"):  # someone else changed one: put it back
            self.queue.add_after(TEMPLATES, SETTLE_SECONDS)

    def reconcile(self, _keys: list[str]) -> None:
        """One ResourceClaimTemplate per map of the published model."""
        if not self.holds_lease():
            return
        self.keeper.sync(list(self.published.current.model.maps), snapshot(self.templates))
