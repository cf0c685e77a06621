"""kubeio.configmapwatch: ConfigMaps that together hold one value (the compiled model), decoded
again only when one changed; the last value that decoded kept while a write is seen half-way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from kubeio.client import Kube, Obj
from kubeio.configmapwatch import ConfigMapWatch
from placement.model import MANIFEST_NAME, MODEL_CONFIGMAPS, encode_model
from tests.unit.webhook.test_webhook_review import model_of


def configmap(name: str, data: Mapping[str, str], version: str) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": version}, "data": dict(data)}


def store(watch: ConfigMapWatch[Any], *objects: Obj) -> None:
    watch.informer.store = {("gpuplace-system", o["metadata"]["name"]): o for o in objects}


class Counting:
    """A codec that joins the ConfigMaps' `v` values, and refuses a set with an `x`."""

    name = "joined"
    label_selector = "joined=true"

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, objects: Sequence[Obj]) -> str:
        self.decoded += 1
        values = sorted(o["data"]["v"] for o in objects)
        if "x" in values:
            raise ValueError("half-way")
        return ",".join(values)

    def describe(self, value: str) -> str:
        return repr(value)


def test_the_watch_selects_by_the_codec_and_decodes_only_after_a_change() -> None:
    codec = Counting()
    watch = ConfigMapWatch(cast(Kube, None), "gpuplace-system", codec)
    assert watch.informer.label_selector == "joined=true" and watch.informer.name == "joined"
    assert watch.read() == "" and codec.decoded == 1
    store(watch, configmap("a", {"v": "1"}, "10"), configmap("b", {"v": "2"}, "11"))
    assert watch.read() == "1,2" and watch.read() == "1,2" and codec.decoded == 2
    store(watch, configmap("a", {"v": "1"}, "10"), configmap("b", {"v": "3"}, "12"))
    assert watch.read() == "1,3" and codec.decoded == 3
    assert watch.shards() == {"a": {"v": "1"}, "b": {"v": "3"}}


def test_a_set_that_does_not_decode_keeps_the_last_value() -> None:
    codec = Counting()
    watch = ConfigMapWatch(cast(Kube, None), "gpuplace-system", codec)
    store(watch, configmap("a", {"v": "x"}, "1"))
    assert watch.read() is None  # none decoded yet
    store(watch, configmap("a", {"v": "1"}, "2"))
    assert watch.read() == "1"
    store(watch, configmap("a", {"v": "1"}, "2"), configmap("b", {"v": "x"}, "3"))
    assert watch.read() == "1" and watch.read() == "1" and codec.decoded == 3


def test_the_model_watch_reads_the_stored_model_and_keeps_it_through_a_half_write() -> None:
    watch = ConfigMapWatch(cast(Kube, None), "gpuplace-system", MODEL_CONFIGMAPS)
    assert watch.informer.label_selector == "gpuplace.io/model=true"
    old, new = encode_model(model_of(1, 3)), encode_model(model_of(2, 4))
    store(watch, *(configmap(name, data, "1") for name, data in old.items()))
    assert watch.read() == model_of(1, 3)
    # The manifest of generation 2 before its shards: generation 1 still serves.
    half = {**old, MANIFEST_NAME: new[MANIFEST_NAME]}
    store(watch, *(configmap(name, data, "2") for name, data in half.items()))
    model = watch.read()
    assert model is not None and model.generation == model_of(1, 3).generation
    assert MODEL_CONFIGMAPS.describe(model) == f"generation {model.generation}"
