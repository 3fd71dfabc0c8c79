"""What a CRD needs besides the schema: names, printer columns, categories.

Each kind's module declares one `CrdInfo` next to its models, so a printer column is edited in
the same place as the field it shows; crdgen turns it into YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

GROUP = "mlsched.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "mlsched"  # `kubectl get mlsched` lists every kind of this operator

ColumnType = Literal["string", "integer", "number", "boolean", "date"]


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str  # relative to the object root, e.g. ".status.phase"
    type: ColumnType = "string"
    description: str = ""
    priority: int = 0  # 0: always shown; 1: only with `kubectl get -o wide`

    def to_crd(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")


@dataclass(frozen=True)
class CrdInfo:
    model: type[BaseModel]  # the root model (apiVersion, kind, metadata, spec, status)
    kind: str
    plural: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    categories: tuple[str, ...] = field(default=(CATEGORY,))

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"
