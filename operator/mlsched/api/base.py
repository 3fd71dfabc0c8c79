"""The base every API model derives from, CEL rules mirrored in Python, and readable errors.

Why the pieces live together: a CEL rule is written once (`CelRule`) and used twice — crdgen puts
its `rule` into the CRD's `x-kubernetes-validations` for the apiserver, and `ApiModel` runs its
`check` when a dict is parsed, so a test or the operator sees the same verdict as `kubectl apply`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry plus the same rule as a Python predicate."""

    rule: str  # CEL, evaluated by the apiserver on `self` (this object)
    message: str  # shown by both the apiserver and `describe_errors`
    check: Callable[[Any], bool]  # the Python twin of `rule`, called with the model instance
    field_path: str | None = None  # ".max": where the error points, for both sides

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _add_cel_rules(schema: dict[str, Any], cls: type) -> None:
    rules = getattr(cls, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_schema() for r in rules]


#: Field-level marker for the apiserver to refuse changes after creation (a transition rule:
#: it needs the old object, so `immutable_changes` is its Python twin, not a model validator).
IMMUTABLE: dict[str, Any] = {
    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "field is immutable"}]
}

#: Field-level marker for free-form objects such as pod templates: the apiserver keeps them
#: as they are instead of pruning them against a schema.
PRESERVE_UNKNOWN: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


class ApiModel(BaseModel):
    """Spec-side base: camelCase on the wire, snake_case in Python, unknown fields rejected.

    Rejecting unknown fields costs nothing at runtime (the apiserver has already pruned
    anything the CRD does not declare, and the CRD is generated from these models) and it turns
    a typo in a sample or test fixture into an error instead of a silently dropped setting.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_add_cel_rules,
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _run_cel_rules(self) -> Self:
        for rule in type(self).cel_rules:
            if not rule.check(self):
                # The sub-field travels in the context so describe_errors can point at it,
                # the way the apiserver uses fieldPath.
                field = (rule.field_path or "").lstrip(".")
                raise PydanticCustomError("cel_rule", rule.message, {"field": field})
        return self

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> Self:
        """Parse a raw object (a kopf body, a YAML document); raise InvalidObject on errors."""
        try:
            return cls.model_validate(plain(obj))
        except ValidationError as exc:
            raise InvalidObject(_object_label(cls, obj), exc) from None

    def to_k8s(self) -> dict[str, Any]:
        """The wire form for patches: camelCase keys, RFC 3339 times, unset fields omitted.

        Omitting None means "leave as is" in a merge patch; to clear a field, put an explicit
        None into the patch yourself.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Status-side base: unknown fields are ignored, because status is written by the operator
    (possibly a newer or older one during a rollout) and must never make an object unreadable."""

    model_config = ConfigDict(extra="ignore")


class InvalidObject(ValueError):
    """An object that does not match its model; `str()` is one line naming every bad field."""

    def __init__(self, label: str, error: ValidationError):
        self.errors = describe_errors(error)
        super().__init__(f"{label}: {'; '.join(self.errors)}")


def describe_errors(error: ValidationError) -> list[str]:
    """Pydantic errors as 'spec.replicaSpecs.worker.max: must be >= min' lines."""
    lines = []
    for err in error.errors():
        loc = list(err["loc"])
        field = (err.get("ctx") or {}).get("field") if err["type"] == "cel_rule" else None
        if field:
            loc.extend(field.split("."))
        path = _dotted(loc)
        lines.append(f"{path}: {err['msg']}" if path else err["msg"])
    return lines


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _object_label(cls: type, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = "/".join(str(meta[k]) for k in ("namespace", "name") if meta.get(k))
    return f"{cls.__name__} {name}".strip()


def plain(obj: Any) -> Any:
    """Deep-copy Mappings and sequences into dicts and lists (kopf bodies are read-only views)."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


def immutable_changes(old: BaseModel, new: BaseModel) -> list[str]:
    """Names (camelCase) of IMMUTABLE fields whose value differs between two specs.

    The apiserver enforces these with `self == oldSelf`; this is for code paths that compare
    specs without an apiserver (tests, a dry-run CLI).
    """
    changed = []
    for name, info in type(new).model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        rules = extra.get("x-kubernetes-validations", [])
        frozen = any(r.get("rule") == "self == oldSelf" for r in rules)
        if frozen and getattr(old, name) != getattr(new, name):
            changed.append(info.alias or name)
    return changed
