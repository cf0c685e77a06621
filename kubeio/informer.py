"""Watch-fed caches: list once, then watch from the list's resourceVersion, resume on expiry.

Handlers run on the informer's thread and must be quick (enqueue, don't work). After a relist the
informer emits the difference to its store, so a handler never misses a delete it slept through.

A `transform` (client-go's SetTransform) trims each object as it arrives, before the store keeps
it and before any handler sees it: the cache then holds only what its readers read, so fields a
writer of the object is free to grow (a pod's annotations) cost nothing to hold. The caller, who
knows what it reads, passes the transform in; this module knows no resource's fields. The
memory a page of whole objects took stays with the process's allocator after they are freed
(small blocks among the kept ones); `after_page` lets the caller hand it back.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubeio.client import Kube, Obj, obj_key
from kubeio.errors import APIError, APIGoneError, APINotFoundError, status_error
from kubeio.shapes import Shape

log = logging.getLogger(__name__)

Handler = Callable[[str, Obj, Obj | None], None]  # (ADDED|MODIFIED|DELETED|SYNC, obj, old)
#: An object as the apiserver sent it -> the object the store keeps. It must keep
#: metadata.namespace, metadata.name and metadata.resourceVersion (the store's key, and how a
#: relist tells a changed object), and must not fail on any object of its resource.
Transform = Callable[[Obj], Obj]
ADDED, MODIFIED, DELETED, SYNC = "ADDED", "MODIFIED", "DELETED", "SYNC"


class Informer:
    """A watch-fed cache of one resource.

    Contract: the informer's thread is the only writer of `store`; it holds `lock` while it
    changes the store and while handlers run, so a reader that takes `lock` sees a store
    consistent with every event delivered so far. `synced` is set after the first full list.
    `failing_since` is written by the informer's thread and read by health checks (a float swap).
    """

    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str = "",
        resync_seconds: float = 0.0,
        watch_timeout_seconds: int = 300,
        page_size: int = 500,
        optional: bool = False,
        absent_retry_seconds: float = 30.0,
        transform: Transform | None = None,
        after_page: Callable[[], None] | None = None,
        shape: Shape | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.name = name or path
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.resync_seconds = resync_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.page_size = page_size
        #: A resource the cluster may not serve (a CRD not installed): a 404 on its list is an
        #: empty list, tried again every `absent_retry_seconds`, and not a failure.
        self.optional = optional
        self.absent_retry_seconds = absent_retry_seconds
        self.transform = transform
        #: Called after each page of a list has been trimmed and its whole objects dropped: the
        #: caller may give the memory they held back to the system (see the module's docstring).
        self.after_page = after_page
        #: The fields built of each object as it is decoded (`kubeio.shapes`); the transform
        #: then runs on those. None: every field is built.
        self.shape = shape
        self._absent_logged = False
        self.store: dict[tuple[str, str], Obj] = {}
        self.synced = threading.Event()
        self._handlers: list[Handler] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rv = ""
        #: monotonic time of the first failure since the last successful list or watch; None
        #: while healthy. Read by health checks from other threads (a float swap is atomic).
        self.failing_since: float | None = None
        self.lock = threading.RLock()  # held while the store changes and handlers run

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer:{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.synced.wait(timeout)

    def healthy(self, grace_seconds: float) -> bool:
        """Whether the informer runs and has not been failing to list or watch for longer than
        `grace_seconds` (a short apiserver restart is not a reason to restart this process)."""
        if self._thread is None or not self._thread.is_alive():
            return self._stop.is_set()
        failing = self.failing_since
        return failing is None or time.monotonic() - failing < grace_seconds

    def _failed(self) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.store.get((namespace, name))

    def _selectors(self) -> dict[str, Any]:
        return {"labelSelector": self.label_selector, "fieldSelector": self.field_selector}

    def _emit(self, event: str, obj: Obj, old: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(event, obj, old)
            except Exception:
                log.exception("handler failed", extra={"informer": self.name, "event": event})

    def _list(self) -> None:
        began = time.monotonic()
        items: list[Obj] = []
        rv = ""
        for page in self._pages():
            rv = str(page.get("metadata", {}).get("resourceVersion", ""))
            if self.transform is None:
                items.extend(page.get("items") or [])
            else:
                # Trimmed page by page: a relist holds one page of whole objects at a time,
                # and what the transform dropped is freed before the next page is asked for.
                items.extend(self.transform(o) for o in page.get("items") or [])
                del page
                if self.after_page is not None:
                    self.after_page()
        self._rv = rv
        self.failing_since = None
        fresh = {obj_key(o): o for o in items}
        with self.lock:
            for key, obj in fresh.items():
                old = self.store.get(key)
                self.store[key] = obj
                if old is None:
                    self._emit(ADDED, obj, None)
                elif old.get("metadata", {}).get("resourceVersion") != obj["metadata"].get(
                    "resourceVersion"
                ):
                    self._emit(MODIFIED, obj, old)
            for key in [k for k in self.store if k not in fresh]:
                self._emit(DELETED, self.store.pop(key), None)
        if not self.synced.is_set():
            log.info(
                "informer %s synced: %d objects listed in %.2f s",
                self.name,
                len(fresh),
                time.monotonic() - began,
            )
        self.synced.set()

    def _page(self, cont: str) -> Obj:
        query = {"limit": self.page_size, "continue": cont, **self._selectors()}
        shape = self.shape.page if self.shape is not None else None
        return self.kube.request("GET", self.path, query=query, shape=shape)

    def _pages(self) -> Iterator[Obj]:
        """The list's pages in order."""
        page = self._page("")
        while True:
            cont = page.get("metadata", {}).get("continue", "")
            yield page
            del page
            if not cont:
                return
            page = self._page(cont)

    def _watch(self) -> None:
        last_resync = time.monotonic()
        while not self._stop.is_set():
            query = {
                **self._selectors(),
                "resourceVersion": self._rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": self.watch_timeout_seconds,
            }
            for event in self.kube.stream(
                self.path,
                query,
                timeout=self.watch_timeout_seconds + 30,
                shape=self.shape.event if self.shape is not None else None,
            ):
                if self._stop.is_set():
                    return
                self.failing_since = None
                kind = event.get("type")
                obj = event.get("object", {})
                if kind == "ERROR":
                    raise status_error(obj)
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    self._rv = str(rv)
                if kind == "BOOKMARK":
                    continue
                if self.transform is not None:
                    obj = self.transform(obj)
                self._apply(str(kind), obj)
                if self.resync_seconds and time.monotonic() - last_resync > self.resync_seconds:
                    self.resync()
                    last_resync = time.monotonic()
            self.failing_since = None  # the server ended the watch cleanly: not failing
            if self.resync_seconds and time.monotonic() - last_resync > self.resync_seconds:
                self.resync()
                last_resync = time.monotonic()

    def _apply(self, kind: str, obj: Obj) -> None:
        """One watched change into the store and to the handlers."""
        key = obj_key(obj)
        with self.lock:
            old = self.store.get(key)
            if kind == DELETED:
                self.store.pop(key, None)
                self._emit(DELETED, obj, old)
                return
            self.store[key] = obj
            self._emit(ADDED if old is None else MODIFIED, obj, old)

    def _absent(self) -> None:
        """The resource is not served: nothing of it exists (what was cached is gone too)."""
        if not self._absent_logged:
            log.warning(
                "%s is not served by the apiserver (is its CRD installed?); treating it as empty "
                "and listing again every %.0f s",
                self.path,
                self.absent_retry_seconds,
                extra={"informer": self.name},
            )
            self._absent_logged = True
        self.failing_since = None
        with self.lock:
            for key in list(self.store):
                self._emit(DELETED, self.store.pop(key), None)
        self.synced.set()
        self._stop.wait(self.absent_retry_seconds)

    def resync(self) -> None:
        """Re-delivers every cached object, so level-triggered handlers converge."""
        with self.lock:
            for obj in list(self.store.values()):
                self._emit(SYNC, obj, obj)

    def _run(self) -> None:
        backoff = 0.2
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    try:
                        self._list()
                    except APINotFoundError:
                        if not self.optional:
                            raise
                        self._absent()
                        continue
                    need_list = False
                    self._absent_logged = False
                self._watch()
                backoff = 0.2
            except APIGoneError:
                log.info("watch expired, listing again", extra={"informer": self.name})
                need_list = True
            except APIError as exc:
                log.warning("watch failed: %s", exc, extra={"informer": self.name})
                self._failed()
                gone = self.optional and exc.status == 404  # the CRD went: list to find out
                need_list = need_list or gone or exc.status in (0, 500, 503)
                self._stop.wait(backoff * (1 + random.random()))  # noqa: S311 - jitter only
                backoff = min(backoff * 2, 10.0)
            except Exception:
                log.exception("informer crashed; restarting", extra={"informer": self.name})
                self._failed()
                need_list = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
