"""A SchedulingPolicy's spec → the policy objects a round runs, with learned models loaded.

Model files are read every round (a file or a ConfigMap key) and hashed; a digest already
loaded reuses the loaded policy, so only a changed model is loaded again. A missing, corrupt,
mismatched or unloadable model never stops scheduling: the round runs `spec.fallback` and the
reason lands in the `ModelLoaded` condition (and, when it changes, in a Warning Event).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import ModelRef, SchedulingPolicySpec
from mlsched.policies import registry
from mlsched.policies.base import AllocationPolicy, GroupingPolicy, PlacementPolicy

ReadConfigMap = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]

#: What a phase runs when its configured algorithm is unknown or its model cannot serve
#: (allocation uses spec.fallback instead).
PHASE_DEFAULTS = {"grouping": "none", "placement": "load-balance"}
_VERB = {"grouping": "grouping", "allocation": "allocating", "placement": "placing"}


class ModelLoadError(Exception):
    """A model that cannot serve; `reason` is the CamelCase condition reason."""

    def __init__(self, reason: str, message: str, attempted: bool = True):
        super().__init__(message)
        self.reason = reason
        self.attempted = attempted  # False when the verdict came from the cache


@dataclass
class Verdict:
    status: bool
    reason: str
    message: str = ""


@dataclass
class ResolvedPolicy:
    allocation: AllocationPolicy
    placement: PlacementPolicy
    grouping: GroupingPolicy
    fallback: str  # a heuristic allocation: what runs when the configured one cannot
    active_models: dict[str, str] = field(default_factory=dict)  # "phase/algorithm" → sha256
    model_loaded: Verdict = field(default_factory=lambda: Verdict(True, "NoModelNeeded"))
    ready: Verdict = field(default_factory=lambda: Verdict(True, "Scheduling"))
    load_failed: bool = False  # a load was attempted this round and failed (for the metric)
    # Heuristic placement for a round that must be decided again after a learned phase raised.
    fallback_placement: PlacementPolicy | None = None


def needs_model(phase: str, algorithm: str, spec: SchedulingPolicySpec) -> bool:
    return registry.is_learned(phase, algorithm) or algorithm in spec.models.for_phase(phase)


def shipped_model(algorithm: str) -> str | None:
    """The model file installed with the operator for a learned algorithm (policy_models'
    artifacts, or $MLSCHED_MODELS_DIR), used when spec.models has no entry for it."""
    try:
        from mlsched.policies.onnx_runner import default_model_path

        path = default_model_path(algorithm)
    except (ImportError, ValueError):
        return None
    return str(path.resolve()) if path.is_file() else None


class ModelResolver:
    """Builds policy objects; caches learned ones by (phase, algorithm, file digest)."""

    def __init__(self, cache_dir: str, read_configmap: ReadConfigMap):
        self.cache_dir = cache_dir
        self.read_configmap = read_configmap
        self._loaded: dict[tuple[str, str, str], Any] = {}

    async def resolve(self, namespace: str, spec: SchedulingPolicySpec) -> ResolvedPolicy:
        notes: list[str] = []
        fallback = spec.fallback
        if not registry.known("allocation", fallback) or needs_model("allocation", fallback, spec):
            fallback = "drf"
            notes.append(f"fallback {spec.fallback!r} is unusable, the fallback is drf")
        defaults = {**PHASE_DEFAULTS, "allocation": fallback}
        chosen = {"grouping": spec.grouping, "allocation": spec.allocation, "placement": spec.placement}
        built: dict[str, Any] = {}
        active: dict[str, str] = {}
        loaded_notes: list[str] = []
        failure: ModelLoadError | None = None
        failed = False
        for phase in ("grouping", "allocation", "placement"):
            name, default = chosen[phase], defaults[phase]
            if not registry.known(phase, name):
                notes.append(f"unknown {phase} {name!r}, {_VERB[phase]} with {default}")
                built[phase] = registry.make(phase, default)
            elif needs_model(phase, name, spec):
                try:
                    built[phase], digest = await self._learned(
                        namespace, phase, name, spec.models.for_phase(phase).get(name))
                    active[f"{phase}/{name}"] = digest
                    loaded_notes.append(f"{phase}/{name}: sha256 {digest}")
                except ModelLoadError as err:
                    failed = failed or err.attempted
                    failure = failure or err
                    loaded_notes.append(f"{phase}/{name}: {err}")
                    notes.append(f"{phase}/{name} unavailable ({err.reason}), {_VERB[phase]} with {default}")
                    built[phase] = registry.make(phase, default)
            else:
                built[phase] = registry.make(phase, name)
        if failure is not None:
            loaded = Verdict(False, failure.reason, "; ".join(loaded_notes))
        elif active:
            loaded = Verdict(True, "ModelVerified", "; ".join(loaded_notes))
        else:
            loaded = Verdict(True, "NoModelNeeded")
        ready = Verdict(True, "FallbackActive", "; ".join(notes)) if notes else Verdict(True, "Scheduling")
        placement_learned = f"placement/{spec.placement}" in active
        fallback_placement = registry.make_placement("load-balance") if placement_learned else built["placement"]
        return ResolvedPolicy(built["allocation"], built["placement"], built["grouping"], fallback,
                              active, loaded, ready, failed, fallback_placement)

    # ---- learned models -------------------------------------------------------------------
    async def _learned(self, namespace: str, phase: str, name: str,
                       ref: ModelRef | None) -> tuple[Any, str]:
        if ref is None:
            path = shipped_model(name)
            if path is None:
                raise ModelLoadError("NoModelReference", f"spec.models has no entry for {name!r} "
                                     "and the operator ships no model for it")
            ref = ModelRef(path=path)
        files = await self._read(namespace, ref)
        key = ref.config_map_key_ref.key if ref.config_map_key_ref else os.path.basename(ref.path)
        digest = hashlib.sha256(files[key]).hexdigest()
        if ref.sha256 and ref.sha256 != digest:
            raise ModelLoadError("ModelDigestMismatch",
                                 f"sha256 is {digest}, spec pins {ref.sha256}")
        cached = self._loaded.get((phase, name, digest))
        if isinstance(cached, ModelLoadError):
            raise ModelLoadError(cached.reason, str(cached), attempted=False)
        if cached is None:
            path = ref.path or await asyncio.to_thread(self._materialize, digest, files, key)
            cached = await asyncio.to_thread(_load, phase, name, path)
            self._loaded[(phase, name, digest)] = cached
            if isinstance(cached, ModelLoadError):
                raise cached
        return cached, digest

    async def _read(self, namespace: str, ref: ModelRef) -> dict[str, bytes]:
        """The model file's bytes under its key; for a ConfigMap, every key (a model card kept
        next to the model in the same ConfigMap must land next to it on disk)."""
        if ref.path:
            try:
                data = await asyncio.to_thread(_read_file, ref.path)
            except FileNotFoundError:
                raise ModelLoadError("ModelNotFound", f"no file {ref.path}") from None
            except OSError as err:
                raise ModelLoadError("ModelNotFound", f"cannot read {ref.path}: {err}") from None
            return {os.path.basename(ref.path): data}
        cm = ref.config_map_key_ref
        body = await self.read_configmap(namespace, cm.name)
        if body is None:
            raise ModelLoadError("ModelNotFound", f"ConfigMap {namespace}/{cm.name} not found")
        files = {k: v.encode() for k, v in (body.get("data") or {}).items()}
        files.update({k: base64.b64decode(v) for k, v in (body.get("binaryData") or {}).items()})
        if cm.key not in files:
            raise ModelLoadError("ModelNotFound", f"ConfigMap {namespace}/{cm.name} has no key {cm.key!r}")
        return files

    def _materialize(self, digest: str, files: Mapping[str, bytes], key: str) -> str:
        folder = os.path.join(self.cache_dir, digest)
        os.makedirs(folder, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as out:
                out.write(data)
        return os.path.join(folder, key)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _load(phase: str, name: str, path: str) -> Any:
    """Load through the registry; every way of failing becomes a ModelLoadError (returned,
    so that the cache remembers a bad file instead of retrying it every round)."""
    try:
        return registry.make(phase, name, registry.PolicyContext(model_path=path))
    except ImportError as err:
        return ModelLoadError("RunnerUnavailable", f"the {name} runner cannot be imported: {err}")
    except ValueError as err:  # the registry's contract for missing/corrupt/mismatched models
        return ModelLoadError("ModelInvalid", str(err) or type(err).__name__)
    except Exception as err:  # onnxruntime raises its own types for unreadable graphs
        return ModelLoadError("ModelLoadFailed", f"{type(err).__name__}: {err}")
