"""A pydantic model's JSON schema as a structural OpenAPI v3 schema (what a CRD version holds).

`$ref`s are inlined, `X | None` becomes X (the apiserver drops nulls of non-nullable fields),
`int | str` becomes `x-kubernetes-int-or-string`, titles and null defaults go. Anything else the
model's schema uses is an error here, so that a model change the CRD cannot express fails the
generator instead of loosening the CRD.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

#: JSON-schema keywords carried into the CRD as they are.
_KEPT = frozenset(
    {
        "type",
        "description",
        "enum",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "required",
    }
)
#: Keywords pydantic writes that a CRD does without (unknown fields are pruned or refused anyway).
_DROPPED = frozenset({"title", "additionalProperties"})


class SchemaError(ValueError):
    """The model uses a JSON-schema construct a structural CRD schema cannot express."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI v3 schema of `model` (by alias), with every reference inlined."""
    schema = model.model_json_schema(by_alias=True)
    return _convert(schema, schema.get("$defs", {}), model.__name__)


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    node = _flatten(node, defs, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KEPT:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            if value is not None:
                out["default"] = value
        elif key == "properties":
            out["properties"] = {
                name: _convert(child, defs, f"{where}.{name}") for name, child in value.items()
            }
        elif key == "items":
            out["items"] = _convert(value, defs, f"{where}[]")
        elif key == "additionalProperties" and isinstance(value, dict):
            out["additionalProperties"] = _convert(value, defs, f"{where}{{}}")
        elif key.startswith("x-kubernetes-"):
            out[key] = value
        elif key not in _DROPPED and key != "$defs":
            raise SchemaError(f"{where}: {key!r} has no structural CRD equivalent")
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{where}: no type")
    return out


def _flatten(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """`node` with its `$ref` inlined and an optional or int-or-string `anyOf` resolved; the
    node's own keys (description, default) win over the referenced definition's."""
    own = dict(node)
    ref = own.pop("$ref", None)
    if isinstance(ref, str):
        target = _flatten(defs[ref.rsplit("/", 1)[-1]], defs, where)
        return {**target, **own}
    choices = own.pop("anyOf", None)
    if choices is None:
        return own
    members = [c for c in choices if c.get("type") != "null"]
    types = sorted(str(c.get("type")) for c in members)
    if len(members) == 1:
        return {**_flatten(members[0], defs, where), **own}
    if types == ["integer", "string"] and all(set(c) == {"type"} for c in members):
        return {**own, "x-kubernetes-int-or-string": True}
    raise SchemaError(f"{where}: a union of {types} has no structural CRD equivalent")
