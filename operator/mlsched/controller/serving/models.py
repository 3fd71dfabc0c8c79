"""A SchedulingPolicy's spec → the policy objects a round runs, with learned models loaded.

Every round a policy's model and its card are read (model_sources.py: only from allowed
directories or the policy's own ConfigMap, never more than --max-model-bytes) and hashed. The
spec's `sha256` pin is checked every round. Loads are cached by (phase, algorithm, model sha256,
card sha256): everything a load checks (the card is for this algorithm and phase, the graph is
the card's digest, the encoder, the graph's tensors) is a function of that key, so a hit gives
the very verdict a new load would, whichever policy or namespace loaded it first, and the same
model with another card is another entry. An entry that no policy used in its latest
resolution is evicted (a policy that changed model, or was deleted).

A missing, corrupt, mismatched, refused or unloadable model never stops scheduling: the round
runs `spec.fallback` and the reason lands in the `ModelLoaded` condition (and, when it changes,
in a Warning Event). Where `updatePolicy: Auto` adopted published versions, the newest one that
loads serves (then the shipped model) before any heuristic: a broken publication keeps the
previous good model, with ModelLoaded=False naming the broken one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import ModelRef, SchedulingPolicySpec
from mlsched.formats.model_sources import (
    DEFAULT_MAX_MODEL_BYTES, ModelBundle, ModelDirs, ModelLoadError, ReadConfigMap,
    read_configmap_model, read_path,
)
from mlsched.policies import registry
from mlsched.policies.base import AllocationPolicy, GroupingPolicy, PlacementPolicy

__all__ = ["ModelLoadError", "ModelResolver", "ResolvedPolicy", "Verdict"]

PolicyKey = tuple[str, str]  # (namespace, name)
CacheKey = tuple[str, str, str, str | None]  # phase, algorithm, model sha256, card sha256

#: What a phase runs when its configured algorithm is unknown or its model cannot serve
#: (allocation uses spec.fallback instead).
PHASE_DEFAULTS = {"grouping": "none", "placement": "load-balance"}
#: Groupings the operator can carry out (controller/scheduling/pools.py: pool labels, node affinity, CPU
#: requests divided by the pool's share). A grouping the registry knows but the cluster cannot
#: run would fall back to none with FallbackActive; today every one can.
CLUSTER_GROUPINGS = frozenset({"none", "harmony", "isolated", "naive"})
_VERB = {"grouping": "grouping", "allocation": "allocating", "placement": "placing"}
# Stand-ins for the model's and card's names in a cached failure's message: one entry may
# serve several policies, and each is told the names it knows (its path or its ConfigMap key).
_MODEL_MARK, _CARD_MARK = "\x00model\x00", "\x00card\x00"


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
    # "phase/algorithm" -> the reference the serving model loaded from (None: the shipped one).
    served_refs: dict[str, ModelRef | None] = field(default_factory=dict)


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
    """Builds policy objects; caches learned ones by (phase, algorithm, model and card digest)."""

    def __init__(self, read_configmap: ReadConfigMap, model_dirs: Sequence[str] = (),
                 max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES, execution_provider: str = "CPU"):
        # One per process (the operator's hardware), so not part of the cache key.
        self.execution_provider = execution_provider
        self.read_configmap = read_configmap
        self.model_dirs = ModelDirs(model_dirs)
        self.max_model_bytes = max_model_bytes
        self._loaded: dict[CacheKey, Any] = {}  # a loaded policy, or a _Failure
        self._uses: dict[PolicyKey, frozenset[CacheKey]] = {}  # per policy, its latest resolution
        # Entries resolutions in progress are using, so that another policy's eviction keeps them.
        self._in_flight: dict[int, set[CacheKey]] = {}
        self._tickets = itertools.count()

    async def resolve(self, policy: PolicyKey, spec: SchedulingPolicySpec,
                      adopted: Mapping[str, Mapping[str, Sequence[ModelRef]]] | None = None) -> ResolvedPolicy:
        """`adopted`: phase -> algorithm -> the published versions to try, newest first, where
        the spec names no model (version_adoption.py), read and checked like any ConfigMap
        model; the shipped model comes after them."""
        ticket, used = next(self._tickets), set()
        self._in_flight[ticket] = used
        try:
            return await self._resolve(policy, spec, used, adopted or {})
        finally:
            del self._in_flight[ticket]
            self._uses[policy] = frozenset(used)
            self._evict()

    def forget(self, policy: PolicyKey) -> None:
        """The policy is gone (or its daemon stopped): its entries go unless another uses them."""
        self._uses.pop(policy, None)
        self._evict()

    def cached(self) -> set[CacheKey]:
        return set(self._loaded)

    def _evict(self) -> None:
        live = set().union(*self._uses.values(), *self._in_flight.values())
        for key in self._loaded.keys() - live:
            del self._loaded[key]

    async def _resolve(self, policy: PolicyKey, spec: SchedulingPolicySpec, used: set[CacheKey],
                       adopted: Mapping[str, Mapping[str, Sequence[ModelRef]]]) -> ResolvedPolicy:
        notes: list[str] = []
        fallback = spec.fallback
        if not registry.known("allocation", fallback) or needs_model("allocation", fallback, spec):
            fallback = "drf"
            notes.append(f"fallback {spec.fallback!r} is unusable, the fallback is drf")
        defaults = {**PHASE_DEFAULTS, "allocation": fallback}
        chosen = {"grouping": spec.grouping, "allocation": spec.allocation, "placement": spec.placement}
        built: dict[str, Any] = {}
        active: dict[str, str] = {}
        served: dict[str, ModelRef | None] = {}  # "phase/algorithm" -> what it loaded from
        loaded_notes: list[str] = []
        failure: ModelLoadError | None = None
        failed = False
        for phase in ("grouping", "allocation", "placement"):
            name, default = chosen[phase], defaults[phase]
            if not registry.known(phase, name):
                notes.append(f"unknown {phase} {name!r}, {_VERB[phase]} with {default}")
                built[phase] = registry.make(phase, default)
            elif phase == "grouping" and name not in CLUSTER_GROUPINGS:
                notes.append(f"grouping {name!r} runs in the simulator only so far, grouping with "
                             f"{default}")
                built[phase] = registry.make(phase, default)
            elif needs_model(phase, name, spec):
                key = f"{phase}/{name}"
                pinned = spec.models.for_phase(phase).get(name)
                # A pinned model, or else the adopted versions newest first and then the
                # shipped model (None): the first that loads serves.
                refs = [pinned] if pinned is not None else [*adopted.get(phase, {}).get(name, ()), None]
                errors: list[tuple[ModelRef | None, ModelLoadError]] = []
                for ref in refs:
                    try:
                        built[phase], digest = await self._learned(policy, phase, name, ref, used)
                    except ModelLoadError as err:
                        errors.append((ref, err))
                        continue
                    active[key], served[key] = digest, ref
                    loaded_notes.append(f"{key}: sha256 {digest}")
                    break
                for ref, err in errors:
                    failed = failed or err.attempted
                    failure = failure or err
                    loaded_notes.append(f"{key}: {_named(ref, pinned)}{err}")
                if key not in active:
                    notes.append(f"{key} unavailable ({errors[0][1].reason}), {_VERB[phase]} with {default}")
                    built[phase] = registry.make(phase, default)
                elif errors:
                    notes.append(f"{key}: {len(errors)} newer published version(s) unusable "
                                 f"({errors[0][1].reason}), serving {_describe(served[key])}")
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
                              active, loaded, ready, failed, fallback_placement, served)

    # ---- learned models -------------------------------------------------------------------
    async def _learned(self, policy: PolicyKey, phase: str, name: str, ref: ModelRef | None,
                       used: set[CacheKey]) -> tuple[Any, str]:
        bundle = await self._read(policy[0], name, ref)
        digest = bundle.digest
        if ref is not None and ref.sha256 and ref.sha256 != digest:
            raise ModelLoadError("ModelDigestMismatch",
                                 f"sha256 is {digest}, the reference pins {ref.sha256}")
        key = (phase, name, digest, bundle.card_digest)
        used.add(key)  # before any await: a concurrent eviction must keep it
        cached = self._loaded.get(key)
        if cached is None:
            cached = await asyncio.to_thread(self._load_bundle, phase, name, bundle)
            self._loaded[key] = cached
        if isinstance(cached, _Failure):
            # Counted (the metric) the first time this policy meets the verdict, not every round.
            raise cached.error(bundle, attempted=key not in self._uses.get(policy, ()))
        return cached, digest

    async def _read(self, namespace: str, name: str, ref: ModelRef | None) -> ModelBundle:
        limit = self.max_model_bytes
        if ref is None:
            path = shipped_model(name)
            if path is None:
                raise ModelLoadError("NoModelReference", f"spec.models has no entry for {name!r} "
                                     "and the operator ships no model for it")
            # Chosen by the operator, not named by a tenant: no allow-list, still bounded.
            return await asyncio.to_thread(read_path, path, None, limit)
        if ref.path:
            return await asyncio.to_thread(read_path, ref.path, self.model_dirs, limit)
        cm = ref.config_map_key_ref
        return await read_configmap_model(self.read_configmap, namespace, cm.name, cm.key, limit)

    def _load_bundle(self, phase: str, name: str, bundle: ModelBundle) -> Any:
        """The policy loaded from the bytes read and hashed (ONNX Runtime takes bytes: nothing
        is written to disk), or a _Failure when the model is refused."""
        from mlsched.policies.onnx_runner import ModelBytes

        loaded = _load(phase, name, ModelBytes(bundle.model, bundle.card, _MODEL_MARK, _CARD_MARK),
                       self.execution_provider)
        if isinstance(loaded, ModelLoadError):
            return _Failure(loaded.reason, str(loaded))
        return loaded


def _describe(ref: ModelRef | None) -> str:
    if ref is None:
        return "the shipped model"
    if ref.config_map_key_ref is not None:
        return f"ConfigMap {ref.config_map_key_ref.name}"
    return ref.path or "the model"


def _named(ref: ModelRef | None, pinned: ModelRef | None) -> str:
    """The prefix naming an adopted published version in a message ("" for a pinned or shipped
    model, whose messages already say where they came from)."""
    return "" if ref is None or ref is pinned else f"published version in {_describe(ref)}: "


@dataclass(frozen=True)
class _Failure:
    """A cached refusal, its message naming the model and card by marks."""

    reason: str
    message: str

    def error(self, bundle: ModelBundle, attempted: bool) -> ModelLoadError:
        text = self.message.replace(_MODEL_MARK, bundle.model_name).replace(_CARD_MARK, bundle.card_name)
        return ModelLoadError(self.reason, text, attempted)


def _load(phase: str, name: str, model: Any, provider: str = "CPU") -> Any:
    """Load through the registry; every way of failing becomes a ModelLoadError (returned,
    so that the cache remembers a bad file instead of retrying it every round)."""
    from mlsched.policies.onnx_runner import ProviderUnavailable

    try:
        return registry.make(phase, name, registry.PolicyContext(model_path=model,
                                                                 execution_provider=provider))
    except ProviderUnavailable as err:
        return ModelLoadError("ExecutionProviderUnavailable", str(err))
    except ImportError as err:
        return ModelLoadError("RunnerUnavailable", f"the {name} runner cannot be imported: {err}")
    except ModelLoadError as err:  # the runner refused the model, and says why (ModelInvalid)
        return err
    except ValueError as err:  # the registry's contract for missing/corrupt/mismatched models
        return ModelLoadError("ModelInvalid", str(err) or type(err).__name__)
    except Exception as err:  # onnxruntime raises its own types for unreadable graphs
        return ModelLoadError("ModelLoadFailed", f"{type(err).__name__}: {err}")
