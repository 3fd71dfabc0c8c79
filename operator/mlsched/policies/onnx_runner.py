"""Serving learned policies with ONNX Runtime: load a model file and its card, check both.

A model is `<name>.onnx` with `<name>.card.json` beside it. The card names the kind of policy,
the state-encoder version and shape it was trained with, the model types it knows, how and on
what it was trained, its validation results and the sha256 of the ONNX file. Every mismatch
(missing file, corrupt bytes, wrong digest, other encoder version, other catalog) is a
ModelLoadError with the reason, never a silently wrong answer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlsched.features import dl2_state
from mlsched.workloads import catalog


_OUTPUTS = ["probs"]


class ModelLoadError(ValueError):
    pass


ENCODERS = {"dl2": dl2_state}


@dataclass(frozen=True)
class ModelCard:
    kind: str
    encoder_version: str
    window: int
    state_dim: int
    n_actions: int
    model_types: tuple[str, ...]
    onnx_sha256: str
    raw: dict

    @classmethod
    def read(cls, path: Path) -> "ModelCard":
        try:
            raw = json.loads(path.read_text())
        except OSError as exc:
            raise ModelLoadError(f"model card {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"model card {path} is not valid JSON: {exc}") from None
        try:
            return cls(raw["kind"], raw["encoder_version"], int(raw["window"]), int(raw["state_dim"]),
                       int(raw["n_actions"]), tuple(raw["model_types"]), raw["onnx_sha256"], raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"model card {path} lacks or mangles field {exc}") from None


def card_path(model_path: Path) -> Path:
    stem = model_path.stem if model_path.suffix == ".onnx" else model_path.name
    return model_path.parent / f"{stem}.card.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def default_model_path(kind: str) -> Path:
    """The artifact shipped in policy_models/artifacts/ (found as a file, never imported), or
    $MLSCHED_MODELS_DIR/<kind>/<kind>.onnx."""
    env = os.environ.get("MLSCHED_MODELS_DIR")
    if env:
        return Path(env) / kind / f"{kind}.onnx"
    spec = importlib.util.find_spec("policy_models")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("no model given and the policy_models artifacts are not installed; "
                             "pass --model PATH or set MLSCHED_MODELS_DIR")
    return Path(list(spec.submodule_search_locations)[0]) / "artifacts" / kind / f"{kind}.onnx"


@dataclass
class LoadedModel:
    path: Path
    card: ModelCard
    session: object  # onnxruntime.InferenceSession

    def probabilities(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(_OUTPUTS, {"state": state.astype(np.float32, copy=False),
                                           "mask": mask.astype(np.float32, copy=False)})[0]


def load_model(path: str | Path | None, kind: str, expected_sha256: str | None = None) -> LoadedModel:
    model_path = Path(path) if path else default_model_path(kind)
    if not model_path.is_file():
        raise ModelLoadError(f"model file {model_path} does not exist")
    card = ModelCard.read(card_path(model_path))
    digest = sha256_of(model_path)
    if card.kind != kind:
        raise ModelLoadError(f"{model_path} is a {card.kind!r} model, not {kind!r}")
    if digest != card.onnx_sha256:
        raise ModelLoadError(f"{model_path} sha256 {digest[:12]}… does not match its card ({card.onnx_sha256[:12]}…): "
                             "the file is corrupt or not the one the card describes")
    if expected_sha256 and digest != expected_sha256.lower():
        raise ModelLoadError(f"{model_path} sha256 {digest[:12]}… is not the expected {expected_sha256[:12]}…")
    encoder = ENCODERS[kind]
    if card.encoder_version != encoder.ENCODER_VERSION:
        raise ModelLoadError(f"{model_path} was trained with state encoder {card.encoder_version!r}; "
                             f"this mlsched has {encoder.ENCODER_VERSION!r}: retrain or use a matching release")
    if card.model_types != catalog.MODEL_NAMES:
        raise ModelLoadError(f"{model_path} knows model types {list(card.model_types)}, the catalog has "
                             f"{list(catalog.MODEL_NAMES)}: retrain")
    if card.state_dim != encoder.state_dim(card.window) or card.n_actions != encoder.n_actions(card.window):
        raise ModelLoadError(f"{model_path}: card shapes do not match encoder at J={card.window}")
    session = _session(model_path)
    inputs = {i.name: i.shape for i in session.get_inputs()}
    if set(inputs) != {"state", "mask"} or inputs["state"][-1] != card.state_dim or inputs["mask"][-1] != card.n_actions:
        raise ModelLoadError(f"{model_path}: graph inputs {inputs} do not match the card")
    return LoadedModel(model_path, card, session)


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # Tiny networks, one request at a time: one thread, no spinning (kopf's event loop shares the core).
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
        raise ModelLoadError(f"{path} is not a loadable ONNX model: {exc}") from None


class GreedyOnnxActor:
    """Serving: the most probable unmasked action.

    A round asks a few hundred times about one window whose state vector is updated in
    place, so the inputs and the output are bound to ONNX Runtime once per window (IO
    binding: no per-call dict, output allocation or input conversion)."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self._state = None  # the WindowState the binding reads from
        self._binding = None
        self._mask = self._probs = self._probs_row = None

    def _bind(self, state) -> None:
        import onnxruntime as ort

        vector = state.vector[None, :]  # float32, contiguous: bound without a copy
        self._mask = np.zeros((1, state.void + 1), dtype=np.float32)
        self._probs = np.zeros((1, state.void + 1), dtype=np.float32)
        self._probs_row = self._probs[0]
        binding = self.model.session.io_binding()
        binding.bind_ortvalue_input("state", ort.OrtValue.ortvalue_from_numpy(vector))
        binding.bind_ortvalue_input("mask", ort.OrtValue.ortvalue_from_numpy(self._mask))
        binding.bind_ortvalue_output("probs", ort.OrtValue.ortvalue_from_numpy(self._probs))
        self._state, self._binding = state, binding

    def act(self, state, mask: np.ndarray) -> int:
        if state is not self._state:
            self._bind(state)
        self._mask[0] = mask
        self.model.session.run_with_iobinding(self._binding)
        return greedy_action(self._probs_row, mask)


def greedy_action(probs: np.ndarray, mask: np.ndarray) -> int:
    """The first most probable allowed action, np.argmax(np.where(mask, probs, -1)) for
    probabilities (>= 0), mostly without the where: when the first maximum over all actions is
    allowed, it is that action. The graph gives masked actions probability exactly 0, so it is
    allowed unless every allowed probability is 0 too; only then mask explicitly."""
    best = int(probs.argmax())
    if mask[best]:
        return best
    return int(np.where(mask, probs, -1.0).argmax())
