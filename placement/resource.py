"""Maps and the placement policy read from their custom resources (PlacementMap, PlacementPolicy).

A custom resource is the same document a file holds, read from the apiserver: the apiserver has
checked its schema, and the same validation as a file's then checks the rest. It has no lines, so
its diagnostics name the object and the field path (`placementmap inference/llm:
spec.placements[2].devices[0]: ...`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from placement.grants import PlacementPolicy, policy_from_document
from placement.maps import PlacementMap
from placement.types import API_VERSION, KIND, POLICY_KIND, MapKey
from placement.validate import document_to_map
from placement.yamlsource import Document

#: What the document of a custom resource keeps of its metadata (the rest is the apiserver's).
_KEPT_METADATA = ("name", "namespace")


def resource_source_name(key: MapKey) -> str:
    """How located errors name a PlacementMap custom resource."""
    return f"placementmap {key}"


def policy_source_name(name: str) -> str:
    return f"placementpolicy {name}"


def _document(obj: Mapping[str, Any], kind: str, source: str) -> Document:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    value = {
        "apiVersion": obj.get("apiVersion", API_VERSION),
        "kind": obj.get("kind", kind),
        "metadata": {k: meta[k] for k in _KEPT_METADATA if k in meta},
        "spec": obj.get("spec"),
    }
    return Document(source, value, positioned=False)


def resource_key(obj: Mapping[str, Any]) -> MapKey:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return MapKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def resource_version(obj: Mapping[str, Any]) -> str:
    """A map's version: the digest of its spec (status writes and metadata do not change it)."""
    text = json.dumps(obj.get("spec"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def map_from_resource(obj: Mapping[str, Any]) -> PlacementMap:
    """The map a PlacementMap custom resource declares; raises PlacementError."""
    key = resource_key(obj)
    return document_to_map(_document(obj, KIND, resource_source_name(key)))


def policy_from_resource(obj: Mapping[str, Any]) -> PlacementPolicy:
    """The policy a PlacementPolicy custom resource declares; raises PlacementError."""
    meta = obj.get("metadata")
    name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
    doc = _document(obj, POLICY_KIND, policy_source_name(name))
    # The policy document has no namespace: a cluster-scoped object's metadata has none either.
    return policy_from_document(doc)


def generation(obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata")
    value = meta.get("generation") if isinstance(meta, dict) else None
    return value if isinstance(value, int) else 0
