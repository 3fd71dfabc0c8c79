"""Turn a pydantic JSON Schema into a Kubernetes *structural* OpenAPI v3 schema.

Pydantic emits JSON Schema 2020-12; the apiserver wants OpenAPI 3.0 with structural rules.
The differences handled here, and why:

- `$ref` / `$defs` are forbidden in CRDs, so every reference is inlined (field-level keys such
  as a description or default win over the referenced model's).
- `Optional[X] = None` arrives as `anyOf: [X, {type: null}]`, which is not structural. It
  becomes plain X, left out of `required`. We never emit `nullable: true`: the apiserver then
  prunes explicit nulls before defaulting, so "null" and "absent" mean the same thing to the
  operator, and clearing a field in a merge patch (`null`) still deletes it.
- JSON Schema's numeric `exclusiveMinimum: 0` is OpenAPI 3.0's `minimum: 0` +
  `exclusiveMinimum: true`.
- `additionalProperties: false` (extra="forbid") is dropped: structural schemas prune unknown
  fields anyway and do not allow it next to `properties`. `additionalProperties: true` is only
  accepted where the field asked for `x-kubernetes-preserve-unknown-fields`.
- `title` (pydantic's field names in Title case) is noise in `kubectl explain`; dropped.

Anything else unexpected raises `UnsupportedSchema`, so a new field type cannot slip a
non-structural construct into the CRDs.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

# Emitted in this order so the YAML reads naturally; unknown keys are errors.
_KEY_ORDER = (
    "description", "type", "format", "enum", "default", "minimum", "exclusiveMinimum",
    "maximum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
    "minProperties", "maxProperties", "properties", "required", "additionalProperties", "items",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-validations",
)
_DROPPED = {"title"}
_PRESERVE = "x-kubernetes-preserve-unknown-fields"


class UnsupportedSchema(ValueError):
    pass


def openapi_schema(model: type[BaseModel], replace: dict[str, Any] | None = None) -> dict[str, Any]:
    """The structural openAPIV3Schema of `model`, by alias (camelCase).

    `replace` swaps top-level properties for hand-written schemas before conversion (the
    object envelope: apiVersion, kind, metadata belong to the apiserver, not to our models).
    """
    raw = model.model_json_schema(mode="validation", by_alias=True)
    defs = raw.pop("$defs", {})
    for name, schema in (replace or {}).items():
        raw["properties"][name] = schema
    return _convert(raw, defs, model.__name__)


def _resolve(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """Inline $ref and collapse Optional's anyOf until neither is left at this node."""
    while True:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            node = {**copy.deepcopy(defs[name]), **siblings}
        elif "anyOf" in node:
            branches = [b for b in node["anyOf"] if b != {"type": "null"}]
            if len(branches) != 1:
                raise UnsupportedSchema(f"{where}: unions other than Optional[X] are not "
                                        "structural")
            siblings = {k: v for k, v in node.items() if k != "anyOf"}
            if siblings.get("default", 0) is None:
                del siblings["default"]  # "unset" is expressed by omission, not a null default
            node = {**copy.deepcopy(branches[0]), **siblings}
        else:
            return node


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    node = _resolve(dict(node), defs, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{where}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs, f"{where}.*")
            elif value is True and not node.get(_PRESERVE):
                raise UnsupportedSchema(f"{where}: free-form object without {_PRESERVE}")
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "x-kubernetes-validations":
            order = ("rule", "message", "fieldPath")
            out[key] = [{k: r[k] for k in order if k in r} for r in value]
        elif key in _KEY_ORDER:
            out[key] = copy.deepcopy(value)
        else:
            raise UnsupportedSchema(f"{where}: JSON Schema keyword {key!r} has no CRD equivalent")
    return {k: out[k] for k in _KEY_ORDER if k in out}
