"""Serving learned policies with ONNX Runtime: load any card-described graph, check both.

A model is `<name>.onnx` with `<name>.card.json` beside it (features/card.py). Loading checks,
in order: the card parses; it is for the algorithm and phase asked for; the file's sha256 is
the card's (and a pinned digest, if any); the card's encoder is one this mlsched has, at the
same version, and declares the same input and output tensors as the card; the graph's inputs
and outputs are the card's, by name and shape. Every mismatch is a ModelLoadError with the
reason, never a silently wrong answer. Which algorithm runs the graph, and how it turns
outputs into decisions, is the algorithm's business (e.g. policies/allocation/dl2.py).

A model comes as a file (the card beside it) or as bytes (`ModelBytes`: what the operator read
from a ConfigMap or an allowed path, already bounded and hashed): ONNX Runtime takes bytes, so
nothing is written to disk to be read back.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlsched.features import registry as encoders
from mlsched.features.base import TensorSpec
from mlsched.features.card import CardError, ModelCard, card_path


class ModelLoadError(ValueError):
    """A model that cannot serve, wherever that was found: read from its source
    (formats/model_sources.py: not found, not allowed, too large, parts that do not join) or
    checked against its card here. `reason` is the CamelCase reason of the SchedulingPolicy's
    ModelLoaded condition; `attempted` is False when the policy already had this verdict (the
    failure metric counts it once). A ValueError: the policy registry's contract for a model
    that is missing, corrupt or mismatched."""

    def __init__(self, reason: str, message: str, attempted: bool = True):
        super().__init__(message)
        self.reason = reason
        self.attempted = attempted

    def __reduce__(self):  # pickled with all three (a process pool's worker raising it)
        return type(self), (self.reason, str(self), self.attempted)


class ProviderUnavailable(RuntimeError):
    """The execution provider asked for cannot run here (not in this onnxruntime build, or
    its device is missing). Not a ValueError: the model itself is fine."""


#: Execution providers by the name configuration uses (`--execution-provider`). CUDA needs
#: the `gpu` extra (onnxruntime-gpu, which replaces the CPU-only onnxruntime) and a GPU.
PROVIDERS = {"CPU": "CPUExecutionProvider", "CUDA": "CUDAExecutionProvider"}
DEFAULT_PROVIDER = "CPU"


def shipped_models_dir() -> Path:
    """Where the shipped artifacts are: $MLSCHED_MODELS_DIR, or policy_models/artifacts/ (found
    as files, never imported)."""
    env = os.environ.get("MLSCHED_MODELS_DIR")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("policy_models")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("ModelNotFound",
                             "no model given and the policy_models artifacts are not installed; "
                             "pass --model PATH or set MLSCHED_MODELS_DIR")
    return Path(list(spec.submodule_search_locations)[0]) / "artifacts"


def default_model_path(algorithm: str) -> Path:
    """The shipped model of a learned algorithm: <shipped_models_dir>/<algorithm>/<algorithm>.onnx."""
    return shipped_models_dir() / algorithm / f"{algorithm}.onnx"


@dataclass
class LoadedModel:
    path: Path
    card: ModelCard
    session: object  # onnxruntime.InferenceSession

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [t.name for t in self.card.outputs]
        values = self.session.run(names, {k: v.astype(np.float32, copy=False) for k, v in feeds.items()})
        return dict(zip(names, values))

    def bind(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]):
        """Bind numpy buffers (float32, contiguous, batch first) as the graph's inputs and
        outputs once; `run_bound` then runs on whatever they hold, with no per-call copy."""
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, array in inputs.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for name, array in outputs.items():
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        return binding

    def run_bound(self, binding) -> None:
        self.session.run_with_iobinding(binding)


@dataclass(frozen=True)
class ModelBytes:
    """A model and its card as bytes (`card` None: it has none), with the names messages call
    them by (a path, a ConfigMap key)."""

    model: bytes
    card: bytes | None
    model_name: str
    card_name: str

    def read_card(self) -> ModelCard:
        where = f"model card {self.card_name}"
        if self.card is None:
            raise CardError(f"{where}: No such file or directory")
        try:
            raw = json.loads(self.card)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CardError(f"{where} is not valid JSON: {exc}") from None
        return ModelCard.from_json(raw, where)


def load_model(source: str | Path | ModelBytes | None, algorithm: str, phase: str,
               expected_sha256: str | None = None, provider: str = DEFAULT_PROVIDER) -> LoadedModel:
    """The model (a file, its card beside it, or ModelBytes; None: the shipped one) checked
    against its card, in a session on `provider` (a PROVIDERS key); ProviderUnavailable if
    that provider cannot run here."""
    if isinstance(source, ModelBytes):
        model, name = source.model, source.model_name
        read_card = source.read_card
    else:
        model_path = Path(source) if source else default_model_path(algorithm)
        if not model_path.is_file():
            raise ModelLoadError("ModelNotFound", f"model file {model_path} does not exist")
        model, name = model_path.read_bytes(), str(model_path)

        def read_card() -> ModelCard:
            return ModelCard.read(card_path(model_path))
    try:
        card = read_card()
    except CardError as exc:
        raise ModelLoadError("ModelInvalid", str(exc)) from None
    if (card.algorithm, card.phase) != (algorithm, phase):
        raise ModelLoadError("ModelInvalid",
                             f"{name} is the {card.phase} model of {card.algorithm!r}, "
                             f"not the {phase} model of {algorithm!r}")
    digest = hashlib.sha256(model).hexdigest()
    if digest != card.onnx_sha256:
        raise ModelLoadError("ModelInvalid",
                             f"{name} sha256 {digest[:12]}… does not match its card ({card.onnx_sha256[:12]}…): "
                             "the file is corrupt or not the one the card describes")
    if expected_sha256 and digest != expected_sha256.lower():
        raise ModelLoadError("ModelInvalid",
                             f"{name} sha256 {digest[:12]}… is not the expected {expected_sha256[:12]}…")
    check_encoder(card, name)
    session = _session(model, name, provider)
    _check_graph(session.get_inputs(), card.inputs, "inputs", name)
    _check_graph(session.get_outputs(), card.outputs, "outputs", name)
    return LoadedModel(Path(name), card, session)


def check_encoder(card: ModelCard, where: str) -> None:
    try:
        encoder = encoders.get(card.encoder_name)
    except ValueError as exc:
        raise ModelLoadError("ModelInvalid", f"{where}: {exc}") from None
    if card.encoder_version != encoder.version:
        raise ModelLoadError("ModelInvalid",
                             f"{where} was trained with state encoder {card.encoder_version!r}; "
                             f"this mlsched has {encoder.version!r}: retrain or use a matching release")
    try:
        expected = (tuple(encoder.inputs(card.encoder_params)), tuple(encoder.outputs(card.encoder_params)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError("ModelInvalid",
                             f"{where}: encoder parameters {card.encoder_params} are unusable: {exc}") from None
    if expected != (card.inputs, card.outputs):
        raise ModelLoadError("ModelInvalid",
                             f"{where}: the card's tensors {_names(card.inputs)} -> {_names(card.outputs)} "
                             f"are not what encoder {encoder.version} produces with {card.encoder_params}: "
                             f"{_names(expected[0])} -> {_names(expected[1])}")


def _names(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{t.name}{list(t.shape)}" for t in specs)


def _check_graph(nodes, specs: tuple[TensorSpec, ...], what: str, path: str) -> None:
    """The graph's tensors by name, with a free (or 1) batch dimension and the card's shape."""
    graph = {n.name: list(n.shape) for n in nodes}
    wanted = {t.name: t for t in specs}
    if set(graph) != set(wanted):
        raise ModelLoadError("ModelInvalid",
                             f"{path}: graph {what} {sorted(graph)} are not the card's {sorted(wanted)}")
    for name, shape in graph.items():
        if len(shape) != len(wanted[name].shape) + 1 or not all(
                _dim_matches(d, w) for d, w in zip(shape[1:], wanted[name].shape)):
            raise ModelLoadError("ModelInvalid",
                                 f"{path}: graph {what[:-1]} {name!r} has shape {shape}, "
                                 f"the card says [batch, {', '.join(map(str, wanted[name].shape))}]")


def _dim_matches(graph_dim, card_dim: int) -> bool:
    """A card's -1 is a dimension that varies per call (jobs, nodes): the graph must leave it
    symbolic; any other card dimension must be the graph's number."""
    if card_dim == -1:
        return not isinstance(graph_dim, int)
    return graph_dim == card_dim


def provider_name(provider: str) -> str:
    """`CPU` or `CUDA` → ONNX Runtime's name for it; a ValueError naming the choices."""
    try:
        return PROVIDERS[provider]
    except KeyError:
        raise ValueError(f"unknown execution provider {provider!r}; choose one of "
                         f"{', '.join(PROVIDERS)}") from None


def _session(model: bytes, path: str, provider: str = DEFAULT_PROVIDER):
    """A session on the model's bytes (`path`: its name in messages)."""
    import onnxruntime as ort

    wanted = provider_name(provider)
    available = ort.get_available_providers()
    if wanted not in available:
        hint = (" (install the gpu extra, onnxruntime-gpu, in place of onnxruntime)"
                if provider == "CUDA" else "")
        raise ProviderUnavailable(f"execution provider {provider} is not in this onnxruntime "
                                  f"build{hint}; it has {', '.join(available)}")
    opts = ort.SessionOptions()
    # Tiny networks, one request at a time: one thread, no spinning (kopf's event loop shares the core).
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    # CPU stays listed after CUDA for any operator CUDA lacks.
    providers = [wanted] + (["CPUExecutionProvider"] if wanted != "CPUExecutionProvider" else [])
    try:
        session = ort.InferenceSession(model, opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
        raise ModelLoadError("ModelInvalid", f"{path} is not a loadable ONNX model: {exc}") from None
    # A build with CUDA but no usable GPU (no device, no driver) quietly runs on the CPU:
    # asked for CUDA, that is a failure to report, not a silent slowdown.
    if session.get_providers()[0] != wanted:
        raise ProviderUnavailable(f"execution provider {provider} did not start (no usable "
                                  f"device or driver?); the session runs on "
                                  f"{', '.join(session.get_providers())}")
    return session


def greedy_action(probs: np.ndarray, mask: np.ndarray) -> int:
    """The first most probable allowed action, np.argmax(np.where(mask, probs, -1)) for
    probabilities (>= 0), mostly without the where: when the first maximum over all actions is
    allowed, it is that action. Graphs give masked actions probability exactly 0, so it is
    allowed unless every allowed probability is 0 too; only then mask explicitly."""
    best = int(probs.argmax())
    if mask[best]:
        return best
    return int(np.where(mask, probs, -1.0).argmax())
