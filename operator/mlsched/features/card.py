"""Model cards: the JSON file beside every shipped ONNX graph, for every learned policy.

    {
      "algorithm": "dl2", "phase": "allocation",
      "encoder": {"name": "dl2-state", "version": "dl2-state-v2", "params": {"window": 40}},
      "inputs":  [{"name": "state", "shape": [1126], "dtype": "float32"}, ...],
      "outputs": [{"name": "probs", "shape": [121], "dtype": "float32"}],
      "actions": "what the outputs mean, in words",
      "onnx_sha256": "...",
      "training": {...provenance: command, wall time, simulator version, data...},
      "validation": {...numbers on validation traces...},
      "extras": {...whatever one algorithm needs, e.g. network architecture...},
      "domain": {...the setting it was trained in: cluster sizes and shapes, load, job mix...}
    }

Shapes leave out the batch dimension. Everything but training, validation and extras is
checked when a model is loaded (policies/onnx_runner.py); those three are for people.
`domain` (policies/model_domain.py has its format) is checked against every round the model
serves; a card without one (a user's own model) is written without the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlsched.features.base import TensorSpec

PHASES = ("grouping", "allocation", "placement")


class CardError(ValueError):
    pass


@dataclass(frozen=True)
class ModelCard:
    algorithm: str
    phase: str
    encoder_name: str
    encoder_version: str
    encoder_params: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    actions: str
    onnx_sha256: str
    training: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    domain: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "algorithm": self.algorithm, "phase": self.phase,
            "encoder": {"name": self.encoder_name, "version": self.encoder_version,
                        "params": self.encoder_params},
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "actions": self.actions, "onnx_sha256": self.onnx_sha256,
            "training": self.training, "validation": self.validation, "extras": self.extras,
        }
        if self.domain:
            out["domain"] = self.domain
        return out

    @classmethod
    def from_json(cls, raw: Any, where: str = "model card") -> "ModelCard":
        if not isinstance(raw, dict):
            raise CardError(f"{where} is not a JSON object")
        try:
            enc = raw["encoder"]
            card = cls(
                algorithm=str(raw["algorithm"]), phase=str(raw["phase"]),
                encoder_name=str(enc["name"]), encoder_version=str(enc["version"]),
                encoder_params=dict(enc.get("params") or {}),
                inputs=tuple(TensorSpec.from_json(t) for t in raw["inputs"]),
                outputs=tuple(TensorSpec.from_json(t) for t in raw["outputs"]),
                actions=str(raw.get("actions", "")), onnx_sha256=str(raw["onnx_sha256"]),
                training=dict(raw.get("training") or {}), validation=dict(raw.get("validation") or {}),
                extras=dict(raw.get("extras") or {}), domain=dict(raw.get("domain") or {}),
            )
        except KeyError as exc:
            raise CardError(f"{where} lacks field {exc}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise CardError(f"{where} has a malformed field: {exc}") from None
        if card.phase not in PHASES:
            raise CardError(f"{where}: phase {card.phase!r} is not one of {', '.join(PHASES)}")
        return card

    @classmethod
    def read(cls, path: Path) -> "ModelCard":
        try:
            raw = json.loads(path.read_text())
        except OSError as exc:
            raise CardError(f"model card {path}: {exc.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CardError(f"model card {path} is not valid JSON: {exc}") from None
        return cls.from_json(raw, f"model card {path}")

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def card_path(model_path: Path) -> Path:
    stem = model_path.stem if model_path.suffix == ".onnx" else model_path.name
    return model_path.parent / f"{stem}.card.json"
