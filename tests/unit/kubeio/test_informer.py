"""Informer against a scripted apiserver (a fake at gpuplace's own boundary, `Kube`): paged list,
watch from the list's resourceVersion, bookmarks, resume, 410 Gone and relist, failures, resync."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kubeio.errors import APIError, APINotFoundError
from kubeio.informer import ADDED, DELETED, MODIFIED, SYNC, Informer

PATH = "/api/v1/namespaces/ml/pods"
Event = tuple[str, str, str | None]  # (kind, name, old resourceVersion)


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": rv}}


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


GONE = ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})


class Apiserver:
    """Lists answer from `lists` (each a list of pages); watches replay `watches` in order (each a
    list of events, or an exception to raise); then a watch waits, empty, until the test ends."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.list_queries: list[dict[str, Any]] = []
        self.watch_queries: list[dict[str, Any]] = []
        self.idle = threading.Event()
        self.done = threading.Event()
        self._pages: list[dict[str, Any]] = []

    def request(
        self, method: str, path: str, *, query: dict[str, Any], shape: Any = None
    ) -> dict[str, Any]:
        assert (method, path, shape) == ("GET", PATH, None)
        self.list_queries.append(query)
        if not query.get("continue"):
            self._pages = list(self.lists.pop(0))
        return self._pages.pop(0)

    def stream(
        self, path: str, query: dict[str, Any], timeout: float, shape: Any = None
    ) -> Iterator[dict[str, Any]]:
        assert path == PATH
        self.watch_queries.append(dict(query))
        if not self.watches:
            self.idle.set()
            self.done.wait(0.05)
            return
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        yield from script


def page(items: list[dict[str, Any]], rv: str, cont: str = "") -> dict[str, Any]:
    return {"items": items, "metadata": {"resourceVersion": rv, "continue": cont}}


def run(api: Apiserver, **kwargs: Any) -> tuple[Informer, list[Event]]:
    informer = Informer(api, PATH, name="pods", **kwargs)  # type: ignore[arg-type]
    seen: list[Event] = []

    def handler(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        old_rv = old["metadata"]["resourceVersion"] if old is not None else None
        seen.append((kind, obj["metadata"]["name"], old_rv))

    informer.add_handler(handler)
    informer.start()
    assert api.idle.wait(30), "the informer never got through its script"
    informer.stop()
    api.done.set()
    informer.join(30)
    return informer, seen


def names(informer: Informer) -> dict[str, str]:
    return {k[1]: o["metadata"]["resourceVersion"] for k, o in informer.store.items()}


def test_a_paged_list_then_a_watch_from_its_resource_version() -> None:
    api = Apiserver(
        [[page([pod("a", "1")], "5", cont="t1"), page([pod("b", "2")], "5")]],
        [[ev(ADDED, pod("c", "6")), ev(MODIFIED, pod("a", "7")), ev(DELETED, pod("b", "8"))]],
    )
    informer, seen = run(api, page_size=1)
    assert [q.get("continue") for q in api.list_queries] == ["", "t1"]
    assert api.list_queries[0]["limit"] == 1
    assert api.watch_queries[0]["resourceVersion"] == "5"
    assert api.watch_queries[0]["allowWatchBookmarks"] == "true"
    assert seen == [
        (ADDED, "a", None),
        (ADDED, "b", None),
        (ADDED, "c", None),
        (MODIFIED, "a", "1"),
        (DELETED, "b", "2"),
    ]
    assert names(informer) == {"a": "7", "c": "6"}
    assert informer.synced.is_set()


def test_a_watch_the_server_ends_resumes_from_the_last_event_or_bookmark_without_a_list() -> None:
    api = Apiserver(
        [[page([], "5")]],
        [[ev(ADDED, pod("a", "6"))], [ev("BOOKMARK", {"metadata": {"resourceVersion": "9"}})], []],
    )
    _, seen = run(api)
    assert [q["resourceVersion"] for q in api.watch_queries[:3]] == ["5", "6", "9"]
    assert len(api.list_queries) == 1
    assert seen == [(ADDED, "a", None)]  # a bookmark is no event for handlers


def test_410_gone_lists_again_and_emits_only_the_difference() -> None:
    api = Apiserver(
        [
            [page([pod("keep", "1"), pod("change", "2"), pod("gone", "3")], "5")],
            [page([pod("keep", "1"), pod("change", "8"), pod("new", "9")], "10")],
        ],
        [[GONE]],
    )
    informer, seen = run(api)
    assert seen[3:] == [(MODIFIED, "change", "2"), (ADDED, "new", None), (DELETED, "gone", None)]
    assert api.watch_queries[-1]["resourceVersion"] == "10"
    assert names(informer) == {"keep": "1", "change": "8", "new": "9"}


@pytest.mark.parametrize(
    ("failure", "lists"),
    [(APIError(500, "InternalError", "boom"), 2), (APIError(403, "Forbidden", "no"), 1)],
)
def test_a_failed_watch_is_retried_and_a_server_error_lists_again(
    failure: APIError, lists: int
) -> None:
    api = Apiserver([[page([pod("a", "1")], "5")], [page([pod("a", "1")], "6")]], [failure])
    informer, seen = run(api)
    assert len(api.list_queries) == lists
    assert seen == [(ADDED, "a", None)]  # an unchanged object is not re-announced
    assert informer.failing_since is None  # the next list or watch succeeded


def test_a_handler_that_raises_does_not_stop_the_informer() -> None:
    api = Apiserver([[page([pod("a", "1")], "5")]], [[ev(ADDED, pod("b", "6"))]])
    informer = Informer(api, PATH)  # type: ignore[arg-type]
    calls: list[str] = []

    def bad(_kind: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        calls.append(obj["metadata"]["name"])
        raise RuntimeError("handler bug")

    informer.add_handler(bad)
    informer.start()
    assert api.idle.wait(30)
    informer.stop()
    api.done.set()
    informer.join(30)
    assert calls == ["a", "b"]
    assert set(names(informer)) == {"a", "b"}


def test_resync_redelivers_every_cached_object() -> None:
    api = Apiserver([[page([pod("a", "1"), pod("b", "2")], "5")]], [])
    informer, seen = run(api)
    informer.resync()
    assert sorted(e for e in seen if e[0] == SYNC) == [(SYNC, "a", "1"), (SYNC, "b", "2")]


class AbsentFirst(Apiserver):
    """Answers the first list 404 (a CRD not installed yet), then as scripted."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[Any]) -> None:
        super().__init__(lists, watches)
        self.absent = True

    def request(
        self, method: str, path: str, *, query: dict[str, Any], shape: Any = None
    ) -> dict[str, Any]:
        if self.absent:
            self.absent = False
            raise APINotFoundError(404, "NotFound", "the server could not find the resource")
        return super().request(method, path, query=query, shape=shape)


def test_an_optional_resource_that_is_not_served_is_empty_synced_and_listed_again() -> None:
    api = AbsentFirst([[page([pod("a", "1")], "5")]], [])
    informer, seen = run(api, optional=True, absent_retry_seconds=0.01)
    assert informer.synced.is_set() and informer.failing_since is None
    assert seen == [(ADDED, "a", None)]  # listed again once served


def test_a_required_resource_that_is_not_served_is_a_failure() -> None:
    api = AbsentFirst([[page([pod("a", "1")], "5")]], [])
    informer = Informer(api, PATH, name="pods")  # type: ignore[arg-type]
    informer.start()
    try:
        assert not informer.wait_synced(0.1)
        assert informer.failing_since is not None
    finally:
        informer.stop()
        api.done.set()


def test_a_transform_trims_each_object_before_the_store_and_the_handlers() -> None:
    """The store holds what the transform returns, listed or watched, and handlers see the same
    (client-go's SetTransform): nothing of what it dropped is kept anywhere."""
    big = {**pod("a", "1"), "spec": {"huge": "x" * 1000}}
    watched = {**pod("b", "3"), "spec": {"huge": "y" * 1000}}
    gone = {**pod("a", "4"), "spec": {"huge": "z"}}
    api = Apiserver([[page([big], "2")]], [[ev(ADDED, watched), ev(DELETED, gone)]])
    handed: list[dict[str, Any]] = []

    def trim(obj: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": obj["metadata"], "kept": len(obj.get("spec", {}).get("huge", ""))}

    informer = Informer(api, PATH, name="pods", transform=trim)  # type: ignore[arg-type]
    informer.add_handler(lambda _kind, obj, _old: handed.append(obj))
    informer.start()
    assert api.idle.wait(30), "the informer never got through its script"
    informer.stop()
    api.done.set()
    informer.join(30)
    assert informer.store == {("ml", "b"): {"metadata": watched["metadata"], "kept": 1000}}
    assert [sorted(o) for o in handed] == [["kept", "metadata"]] * 3
    assert [o["kept"] for o in handed] == [1000, 1000, 1]
