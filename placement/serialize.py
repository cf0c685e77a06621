"""A validated map written back as the PlacementMap YAML a user would commit.

The inverse of `validate.parse_map` up to formatting and comments: parsing what `dump_map` writes
gives an equal map. Used to show or store a map that did not come from a file.
"""

from __future__ import annotations

from typing import Any

import yaml

from placement.maps import DeclaredSlot, PlacementMap, Rollout
from placement.types import API_VERSION, KIND


def slot_document(slot: DeclaredSlot) -> dict[str, Any]:
    out: dict[str, Any] = {"index": slot.index, "node": slot.node}
    if slot.count is not None:
        out["count"] = slot.count
    else:
        out["devices"] = [d if isinstance(d, int) else str(d) for d in slot.devices]
    if slot.require is not None:
        require: dict[str, Any] = {}
        if slot.require.product is not None:
            require["product"] = slot.require.product
        if slot.require.min_memory_mib is not None:
            require["minMemoryMiB"] = slot.require.min_memory_mib
        out["require"] = require
    return out


def map_document(pmap: PlacementMap) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pmap.key.name, "namespace": pmap.key.namespace},
        "spec": {
            "sharing": pmap.sharing.value,
            "indexing": pmap.indexing.value,
            "envMode": pmap.env_mode.value,
            "placements": [slot_document(s) for s in pmap.slots],
            **_rollout_document(pmap),
            **_rank_document(pmap),
        },
    }


def _rank_document(pmap: PlacementMap) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if pmap.ranks.index_label:
        out["indexLabel"] = pmap.ranks.index_label
    if pmap.ranks.pods_per_job:
        out["podsPerJob"] = pmap.ranks.pods_per_job
    if pmap.gang is not None:
        out["gang"] = {"timeoutSeconds": pmap.gang.timeout_seconds}
    return out


def _rollout_document(pmap: PlacementMap) -> dict[str, Any]:
    if pmap.rollout == Rollout():
        return {}  # the default is left out, as users write it
    return {
        "rollout": {
            "strategy": pmap.rollout.strategy.value,
            "maxUnavailable": pmap.rollout.max_unavailable,
        }
    }


#: Unicode line breaks that PyYAML writes raw inside a quoted scalar and then folds into a space
#: when it reads the text back; written as escapes (\N, \L, \P) they survive.
_UNICODE_BREAKS = ("\x85", "\u2028", "\u2029")


def dump_map(pmap: PlacementMap) -> str:
    document = map_document(pmap)
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    if any(b in text for b in _UNICODE_BREAKS):
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=False)
    return text
