"""Builders for webhook tests: `make_pod("web-3").label(MAP, "llm").obj()`, reviews, models."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

import jsonpatch

from placement.annotations import MAP_LABEL, PLACEMENT_KEY, PLACEMENT_MAP_LABEL
from placement.devices import DeclaredDevices
from placement.model import CompiledMap, CompiledSlot, Model
from placement.reasons import Reason
from placement.types import EnvMode, GpuUuid, Indexing, MapKey, NodeName
from webhook.pods import wired_env

NS = "inference"
MAP = MAP_LABEL
#: What the pods webhook must be called for, in the chart and in `gpuplace webhook`'s registration.
POD_CREATE_RULES = [
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
]


class PodBuilder:
    def __init__(self, name: str, namespace: str = NS) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": namespace},
            "spec": {"containers": []},
        }
        if name:
            self._obj["metadata"]["name"] = name
        self._default_container = True

    def label(self, key: str, value: str) -> PodBuilder:
        self._obj["metadata"].setdefault("labels", {})[key] = value
        return self

    def annotation(self, key: str, value: str) -> PodBuilder:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def generate_name(self, prefix: str) -> PodBuilder:
        self._obj["metadata"].pop("name", None)
        self._obj["metadata"]["generateName"] = prefix
        return self

    def owner(self, kind: str, name: str = "owner", controller: bool = True) -> PodBuilder:
        self._obj["metadata"].setdefault("ownerReferences", []).append(
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": name,
                "uid": "1",
                "controller": controller,
            }
        )
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self._obj["spec"]["schedulerName"] = name
        return self

    def node(self, name: str) -> PodBuilder:
        self._obj["spec"]["nodeName"] = name
        return self

    def container(
        self,
        name: str,
        env: list[dict[str, Any]] | None = None,
        *,
        init: bool = False,
        env_from: list[dict[str, Any]] | None = None,
    ) -> PodBuilder:
        self._default_container = False
        container: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.0-base"}
        if env is not None:
            container["env"] = env
        if env_from is not None:
            container["envFrom"] = env_from
        self._obj["spec"].setdefault("initContainers" if init else "containers", []).append(
            container
        )
        return self

    def obj(self) -> dict[str, Any]:
        out = copy.deepcopy(self._obj)
        if self._default_container:
            out["spec"]["containers"] = [{"name": "main", "image": "nvcr.io/nvidia/cuda"}]
        return out


def make_pod(name: str, namespace: str = NS) -> PodBuilder:
    return PodBuilder(name, namespace)


def admitted_container(name: str = "c") -> dict[str, Any]:
    """A container as the webhook leaves it on a map's pod (placement/admitted.py): the binder
    places a map's pod only when every container carries this wiring."""
    return {"name": name, "env": [dict(e) for e in wired_env(EnvMode.INDEX)]}


def make_configmap(
    name: str, text: str | None, namespace: str = NS, *, labelled: bool = True
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {},
    }
    if labelled:
        obj["metadata"]["labels"] = {PLACEMENT_MAP_LABEL: "true"}
    if text is not None:
        obj["data"][PLACEMENT_KEY] = text
    return obj


def map_header(name: str = "llm", namespace: str = NS) -> str:
    """A PlacementMap document up to its `spec:` line (six lines): the spec follows, indented."""
    return (
        "apiVersion: gpuplace.io/v1alpha1\n"
        "kind: PlacementMap\n"
        "metadata:\n"
        f"  name: {name}\n"
        f"  namespace: {namespace}\n"
        "spec:\n"
    )


def placement_yaml(name: str = "llm", namespace: str = NS, devices: str = "[0, 1]") -> str:
    return map_header(name, namespace) + (
        "  placements:\n"
        "    - index: 0\n"
        "      node: gpu-a-01\n"
        f"      devices: {devices}\n"
        "    - index: 1\n"
        "      node: gpu-a-02\n"
        "      devices: [2]\n"
    )


def review(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    kind: str = "Pod",
    resource: str = "pods",
    uid: str = "3d9f1b2c-0000-4000-8000-000000000001",
    namespace: str | None = None,
    name: str | None = None,
    old: Mapping[str, Any] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    meta = (obj or old or {}).get("metadata", {})
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "operation": operation,
        "namespace": meta.get("namespace", NS) if namespace is None else namespace,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": copy.deepcopy(obj) if obj is not None else None,
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": dry_run,
    }
    if name is not None:
        request["name"] = name
    elif meta.get("name"):
        request["name"] = meta["name"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


class ModelBuilder:
    def __init__(self, generation: int = 1) -> None:
        self._generation = generation
        self._maps: dict[MapKey, CompiledMap] = {}

    def map(
        self,
        name: str,
        indices: Iterable[int] = (0, 1, 2, 3),
        *,
        namespace: str = NS,
        env_mode: EnvMode = EnvMode.INDEX,
        indexing: Indexing = Indexing.AUTO,
        blocked: Mapping[int, tuple[str, str]] | None = None,
    ) -> ModelBuilder:
        key = MapKey(namespace, name)
        blocked = blocked or {}
        slots = {}
        for i in indices:
            reason, message = blocked.get(i, ("", ""))
            slots[i] = CompiledSlot(
                index=i,
                node=NodeName(f"gpu-node-{i // 8:02d}"),
                devices=(GpuUuid(f"GPU-00000000-0000-0000-0000-{i:012d}"),),
                device_indices=(i % 8,),
                declared=DeclaredDevices((i % 8,)),
                blocked=Reason(reason) if reason else "",
                message=message,
            )
        self._maps[key] = CompiledMap(
            key, slots, indexing=indexing, env_mode=env_mode, generation=self._generation
        )
        return self

    def obj(self) -> Model:
        return Model(self._generation, self._maps)


def make_model(generation: int = 1) -> ModelBuilder:
    return ModelBuilder(generation)


def patch_of(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch operations in an AdmissionReview answer ([] when there is none)."""
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def patched(obj: Mapping[str, Any], answer: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` after the answer's patch, applied by an independent RFC 6902 implementation."""
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), patch_of(answer))
    return result


def env_of(pod: Mapping[str, Any], container: int = 0, init: bool = False) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = pod["spec"]["initContainers" if init else "containers"]
    env: list[dict[str, Any]] = items[container].get("env") or []
    return env
