"""Decoding a resource's list pages and watch events into only the fields a cache keeps.

A pod as the apiserver sends it is about 2.5 KiB of JSON, most of it `managedFields`, defaults and
status a cache of gpuplace's never reads; decoding all of it into dicts, then trimming them
(`kubeio.informer.Transform`), cost the controller most of its start-up on a large cluster (40,000
pods: 1.6 s of orjson and 0.7 s of trimming). A `Shape` names the fields kept, as a TypedDict
(`total=False`) nested as deep as needed; msgspec's decoder then walks the rest of the text
without building it, about five times faster than building everything.

The caller, who knows what it reads, writes the TypedDict; this module knows no resource's
fields. The shape only chooses what is built: the informer's transform still runs on what it
built (bounds on sizes, filters on names). A body the shape cannot decode (a field of another
type than the TypedDict says: an apiserver newer than the shape) is decoded whole instead, as
without a shape, so a shape never loses an object.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec
import orjson

Obj = dict[str, Any]

#: A list's metadata (`continue` is a Python keyword: the functional form).
ListMeta = TypedDict(
    "ListMeta",
    {"resourceVersion": str, "continue": str, "remainingItemCount": int},
    total=False,
)


#: The event types whose object is one of the resource's (ERROR carries a Status, BOOKMARK a
#: bare object with only a resourceVersion: both are decoded whole).
_OBJECT_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


class Shape:
    """The fields of one resource a cache keeps: `item` is a TypedDict (total=False) of them."""

    def __init__(self, item: type) -> None:
        self.item = item
        # Made at run time, for the item's type: the functional form.
        page = TypedDict(  # type: ignore[misc]  # noqa: UP013
            f"{item.__name__}Page",
            {"metadata": ListMeta, "items": list[item] | None},  # type: ignore[valid-type]
            total=False,
        )
        # A watch event and its object, decoded in one pass.
        event = TypedDict(  # type: ignore[misc]  # noqa: UP013
            f"{item.__name__}Event", {"type": str, "object": item | None}, total=False
        )
        # The TypedDicts decode to plain dicts: typed as such for the informer's store.
        self._page: msgspec.json.Decoder[Obj] = msgspec.json.Decoder(page)
        self._event: msgspec.json.Decoder[Obj] = msgspec.json.Decoder(event)

    def page(self, data: bytes) -> Obj:
        """A list response: its metadata and its items, each with the shape's fields only."""
        try:
            decoded = self._page.decode(data)
        except msgspec.ValidationError:
            whole: Obj = orjson.loads(data)
            return whole
        except msgspec.DecodeError as exc:
            raise ValueError(f"the list is not JSON: {exc}") from exc
        if decoded.get("items") is None:
            decoded["items"] = []
        return decoded

    def event(self, line: bytes) -> Obj:
        """One line of a watch: {"type", "object"}, the object with the shape's fields only when
        it is one of the resource's. One pass over the line: the event and its object are
        decoded together (an ERROR's Status, a BOOKMARK, or an object the shape cannot decode is
        then decoded again, whole)."""
        try:
            event = self._event.decode(line)
        except msgspec.ValidationError:
            event = self._whole(line)
        except msgspec.DecodeError as exc:
            raise ValueError(f"the watch event is not JSON: {exc}") from exc
        else:
            if event.get("type", "") not in _OBJECT_EVENTS:
                event = self._whole(line)
        if event.get("object") is None:
            event["object"] = {}
        event.setdefault("type", "")
        return event

    @staticmethod
    def _whole(line: bytes) -> Obj:
        whole = orjson.loads(line)
        if not isinstance(whole, dict):
            raise ValueError("the watch event is not a JSON object")
        return whole
