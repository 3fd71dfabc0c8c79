"""(phase, algorithm name) -> implementation, for `mlsched simulate` and SchedulingPolicy alike.

Every phase's factory takes a PolicyContext, so any phase can have a learned policy that loads
a model file. Some policies need what only one caller has: `optimus-oracle` needs the
simulator's true speed function; learned policies need their model file (the shipped one when
none is named). Asking for a policy that cannot be built in the caller's context is a clear
error. Placement policies come wrapped in stickiness unless the context says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mlsched.policies.allocation.drf import DRF
from mlsched.policies.allocation.hetero import HeteroDRF, HeteroOptimus
from mlsched.policies.allocation.optimus import Optimus
from mlsched.policies.allocation.simple import FIFO, SRTF, Fixed
from mlsched.policies.allocation.tetris import Tetris
from mlsched.policies.base import AllocationPolicy, GroupingPolicy, PlacementPolicy
from mlsched.policies.grouping.harmony import Harmony
from mlsched.policies.grouping.none import NoGrouping
from mlsched.policies.grouping.partitions import isolated, naive
from mlsched.policies.placement.gpu_type_aware import GpuTypeAware
from mlsched.policies.placement.heuristics import BinPack, FirstFit, LoadBalance, TetrisPlacement
from mlsched.policies.placement.interference_aware import LeastInterferenceFirst, TiresiasPlacement
from mlsched.policies.placement.sticky import Sticky
from mlsched.policies.speed_estimate import TrueSpeed
from mlsched.workloads.speed_models import SpeedModel

PHASES = ("grouping", "allocation", "placement")


class UnknownPolicyError(ValueError):
    pass


@dataclass
class PolicyContext:
    speed_model: SpeedModel | None = None  # the simulator's true speed function
    # A learned policy's model: an ONNX file (its card sits beside it), or the bytes of both
    # (onnx_runner.ModelBytes: what the operator read from a ConfigMap or an allowed path).
    model_path: Any = None
    sticky: bool = True  # placement: keep unchanged tasks where they ran
    execution_provider: str = "CPU"  # where a learned policy's model runs (onnx_runner.PROVIDERS)
    # harmony placement: LIF-Line served where the simulator's model says the network's layout
    # loses (policies/placement/guarded.py); False: the network alone
    placement_guard: bool = True


@dataclass(frozen=True)
class Entry:
    build: Callable[[PolicyContext], Any]
    learned: bool = False  # needs a model file (and so a card, a runner, a fallback)


def _oracle(ctx: PolicyContext) -> AllocationPolicy:
    if ctx.speed_model is None:
        raise UnknownPolicyError("optimus-oracle needs the true speed function; it exists only in the simulator")
    speed = ctx.speed_model
    return Optimus(lambda snapshot: TrueSpeed(speed), name="optimus-oracle")


def _dl2(ctx: PolicyContext) -> AllocationPolicy:
    from mlsched.policies.allocation.dl2 import DL2Policy  # imported lazily: loads onnxruntime

    return DL2Policy.load(ctx.model_path, provider=ctx.execution_provider)


def _chic(pair: bool):
    def build(ctx: PolicyContext) -> AllocationPolicy:
        from mlsched.policies.allocation.chic import ChicPolicy  # imported lazily: loads onnxruntime

        return ChicPolicy.load(ctx.model_path, pair=pair, provider=ctx.execution_provider)
    return build


def _sticky(policy: PlacementPolicy, ctx: PolicyContext) -> PlacementPolicy:
    return Sticky(policy) if ctx.sticky else policy


def _placement(cls) -> Entry:
    return Entry(lambda ctx: _sticky(cls(), ctx))


def _harmony_alone(ctx: PolicyContext) -> PlacementPolicy:
    from mlsched.policies.placement.harmony import HarmonyPlacement  # imported lazily: loads onnxruntime

    return _sticky(HarmonyPlacement.load(ctx.model_path, provider=ctx.execution_provider), ctx)


def _harmony(ctx: PolicyContext) -> PlacementPolicy:
    """Harmony placement under its guard: LIF-Line served where the simulator's model says
    the network's layout loses (policies/placement/guarded.py)."""
    from mlsched.policies.placement.guarded import GuardedPlacement

    if not ctx.placement_guard:
        return _harmony_alone(ctx)
    return GuardedPlacement(_harmony_alone(ctx), _sticky(LeastInterferenceFirst(degree=1), ctx),
                            speed=ctx.speed_model)

#: Allocations that value a worker by its GPU type and the placement that keeps a job's
#: workers on one type, which they need: with a type-blind placement a job's workers spread
#: over types and run at the slowest one's pace, which the allocation did not count on
#: (`mlsched simulate` warns; docs/simulator.md "GPU types").
TYPE_AWARE_PLACEMENT = {"drf-hetero": "gpu-type-aware", "optimus-hetero": "gpu-type-aware"}


def type_blind_pairs(allocations, placements) -> list[tuple[str, str]]:
    """(allocation, placement) pairs where a type-aware allocation runs with another placement."""
    return [(a, p) for a in allocations for p in placements
            if a in TYPE_AWARE_PLACEMENT and p != TYPE_AWARE_PLACEMENT[a]]


REGISTRY: dict[str, dict[str, Entry]] = {
    "allocation": {
        "fixed": Entry(lambda ctx: Fixed()),
        "fifo": Entry(lambda ctx: FIFO()),
        "srtf": Entry(lambda ctx: SRTF()),
        "drf": Entry(lambda ctx: DRF()),
        "tetris": Entry(lambda ctx: Tetris()),
        "optimus": Entry(lambda ctx: Optimus()),
        "optimus-oracle": Entry(_oracle),
        # heterogeneity-aware (GPU types, workloads/gpu_types.py): pair with gpu-type-aware
        "drf-hetero": Entry(lambda ctx: HeteroDRF()),
        "optimus-hetero": Entry(lambda ctx: HeteroOptimus()),
        "dl2": Entry(_dl2, learned=True),
        "chic": Entry(_chic(pair=False), learned=True),
        "chic-pair": Entry(_chic(pair=True), learned=True),
    },
    "placement": {
        "load-balance": _placement(LoadBalance),
        "bin-pack": _placement(BinPack),
        "first-fit": _placement(FirstFit),
        "tetris": _placement(TetrisPlacement),
        "lif-line": _placement(lambda: LeastInterferenceFirst(degree=1)),
        "lif-quad": _placement(lambda: LeastInterferenceFirst(degree=2)),
        "tiresias": _placement(TiresiasPlacement),
        # stickiness built in (a type-blind Sticky could send a task to another GPU type)
        "gpu-type-aware": Entry(lambda ctx: GpuTypeAware(sticky=ctx.sticky)),
        "harmony": Entry(_harmony, learned=True),
    },
    "grouping": {
        "none": Entry(lambda ctx: NoGrouping()),
        "isolated": Entry(lambda ctx: isolated()),
        "naive": Entry(lambda ctx: naive()),
        "harmony": Entry(lambda ctx: Harmony()),
    },
}

# Kept for callers that list one phase's names.
ALLOCATION = REGISTRY["allocation"]
PLACEMENT = REGISTRY["placement"]
GROUPING = REGISTRY["grouping"]


def register(phase: str, name: str, build: Callable[[PolicyContext], Any], learned: bool = False) -> None:
    """Add a policy (docs/architecture.md has a worked example)."""
    if phase not in REGISTRY:
        raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
    REGISTRY[phase][name] = Entry(build, learned)


def known(phase: str, name: str) -> bool:
    return name in REGISTRY.get(phase, {})


def is_learned(phase: str, name: str) -> bool:
    entry = REGISTRY.get(phase, {}).get(name)
    return bool(entry and entry.learned)


def make(phase: str, name: str, ctx: PolicyContext | None = None) -> Any:
    if phase not in REGISTRY:
        raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
    entries = REGISTRY[phase]
    if name not in entries:
        raise UnknownPolicyError(f"unknown {phase} policy {name!r}; known: {', '.join(entries)}")
    return entries[name].build(ctx or PolicyContext())


def make_allocation(name: str, ctx: PolicyContext | None = None) -> AllocationPolicy:
    return make("allocation", name, ctx)


def make_placement(name: str, ctx: PolicyContext | None = None) -> PlacementPolicy:
    return make("placement", name, ctx)


def make_grouping(name: str, ctx: PolicyContext | None = None) -> GroupingPolicy:
    return make("grouping", name, ctx)
