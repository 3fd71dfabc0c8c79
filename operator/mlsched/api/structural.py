"""A checker for the apiserver's structural-schema rules, so violations fail here, not at apply.

Follows the rules in the Kubernetes CRD documentation ("Specifying a structural schema"):
every node typed (except preserve-unknown-fields / int-or-string nodes), no `$ref` or
`definitions`, junctors (allOf/anyOf/oneOf/not) that only restate constraints, `nullable` a
plain boolean outside junctors, `metadata` restricted to name/generateName, plus a few
OpenAPI 3.0 details JSON Schema tools get wrong (boolean exclusiveMinimum, no `const`).
"""

from __future__ import annotations

from typing import Any

_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
_ALLOWED = {
    "description", "type", "format", "title", "default", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf",
    "oneOf", "anyOf", "not", "properties", "additionalProperties", "externalDocs", "example",
    "nullable", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
    "x-kubernetes-map-type", "x-kubernetes-validations",
}
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
# Keys a junctor branch may not set: they would make the type ambiguous.
_NOT_IN_JUNCTOR = {"type", "description", "default", "additionalProperties", "nullable"}
_ENUM_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


def structural_errors(schema: dict[str, Any]) -> list[str]:
    """Every violation in an openAPIV3Schema (the CRD root); empty means structural."""
    errors: list[str] = []
    if schema.get("type") != "object":
        errors.append("<root>: type must be object")
    meta = schema.get("properties", {}).get("metadata")
    if meta is not None and set(meta.get("properties", {})) - {"name", "generateName"}:
        errors.append("metadata: only name and generateName may be constrained")
    _check(schema, "<root>", errors, in_junctor=False)
    return errors


def _check(node: Any, path: str, errors: list[str], in_junctor: bool) -> None:
    if not isinstance(node, dict):
        errors.append(f"{path}: schema node must be a mapping")
        return
    for key in node:
        if key not in _ALLOWED:
            errors.append(f"{path}: keyword {key!r} is not allowed in a CRD schema")
    if in_junctor:
        for key in _NOT_IN_JUNCTOR & node.keys():
            errors.append(f"{path}: {key!r} is not allowed inside a junctor")
    else:
        _check_typed(node, path, errors)
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            errors.append(f"{path}: {key} must be a boolean in OpenAPI 3.0")
    if "nullable" in node and not isinstance(node["nullable"], bool):
        errors.append(f"{path}: nullable must be a boolean")
    if node.get("uniqueItems") is True:
        errors.append(f"{path}: uniqueItems is forbidden")
    for rule in node.get("x-kubernetes-validations", []):
        if not (isinstance(rule, dict) and rule.get("rule")
                and isinstance(rule.get("message"), str)):
            errors.append(f"{path}: x-kubernetes-validations entries need rule and message")
    for name, sub in node.get("properties", {}).items():
        _check(sub, f"{path}.{name}".removeprefix("<root>."), errors, in_junctor)
    if isinstance(node.get("additionalProperties"), dict):
        _check(node["additionalProperties"], f"{path}.*", errors, in_junctor)
    if "items" in node:
        _check(node["items"], f"{path}[]", errors, in_junctor)
    for junctor in _JUNCTORS:
        branches = node.get(junctor)
        if branches is None:
            continue
        for i, branch in enumerate(branches if isinstance(branches, list) else [branches]):
            _check(branch, f"{path}.{junctor}[{i}]", errors, in_junctor=True)
            # Rule 2: a field named in a junctor must also be specified outside it.
            for name in set(branch.get("properties", {})) - set(node.get("properties", {})):
                errors.append(f"{path}: {junctor} names field {name!r} not specified outside")


def _check_typed(node: dict[str, Any], path: str, errors: list[str]) -> None:
    kind = node.get("type")
    untyped_ok = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
        "x-kubernetes-int-or-string")
    if kind is None:
        if not untyped_ok:
            errors.append(f"{path}: missing type")
        return
    if kind not in _TYPES:
        errors.append(f"{path}: unknown type {kind!r}")
    if kind == "object":
        props, extra = node.get("properties"), node.get("additionalProperties")
        if props is not None and extra is not None:
            errors.append(f"{path}: properties and additionalProperties are mutually exclusive")
        if extra is not None and not isinstance(extra, dict):
            errors.append(f"{path}: additionalProperties must be a schema, not {extra!r}")
        for name in node.get("required", []):
            if name not in (props or {}):
                errors.append(f"{path}: required field {name!r} is not a property")
    elif kind == "array":
        if not isinstance(node.get("items"), dict):
            errors.append(f"{path}: array without an items schema")
        elif node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node.get("x-kubernetes-list-map-keys", []):
                if key not in item.get("required", []) and "default" not in item.get(
                        "properties", {}).get(key, {}):
                    errors.append(f"{path}: list map key {key!r} must be required or defaulted")
    elif node.get("x-kubernetes-preserve-unknown-fields"):
        errors.append(f"{path}: preserve-unknown-fields on a {kind} node")
    py_type = _ENUM_TYPES.get(kind)
    for value in node.get("enum", []):
        is_bool = isinstance(value, bool)
        if py_type and (not isinstance(value, py_type) or (kind != "boolean" and is_bool)):
            errors.append(f"{path}: enum value {value!r} is not a {kind}")
