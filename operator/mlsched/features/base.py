"""What every state encoder declares: its name, version and the tensors it produces.

A learned policy's ONNX graph is trained on one encoder's tensors. Its model card names the
encoder (name + version + parameters such as DL²'s window); the runner asks the registry for
that encoder and compares the spaces it declares with the card's inputs and the graph's, so a
model trained on other features is refused at load time, never served wrong numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor; the leading batch dimension is implied and not listed. A -1 is a
    dimension that varies per call (Harmony's jobs and nodes): the graph must leave it free."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "TensorSpec":
        return cls(str(raw["name"]), tuple(int(x) for x in raw["shape"]), str(raw.get("dtype", "float32")))


class Encoder(Protocol):
    """A versioned mapping from cluster state to a policy network's tensors.

    `version` changes whenever a feature's meaning, order or scaling changes: a model trained
    on one version must not be served with another."""

    name: str
    version: str

    def inputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]: ...

    def outputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]: ...
