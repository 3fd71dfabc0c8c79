"""Policy names -> implementations, for `mlsched simulate` and SchedulingPolicy objects alike.

Some policies need context: `optimus-oracle` needs the true speed function, which only the
simulator has; learned policies need their model file. Asking for a policy that cannot be
built in the caller's context is a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mlsched.policies.allocation.drf import DRF
from mlsched.policies.allocation.optimus import Optimus
from mlsched.policies.allocation.simple import FIFO, SRTF, Fixed
from mlsched.policies.allocation.tetris import Tetris
from mlsched.policies.base import AllocationPolicy, GroupingPolicy, PlacementPolicy
from mlsched.policies.grouping import NoGrouping
from mlsched.policies.placement.heuristics import BinPack, FirstFit, LoadBalance, TetrisPlacement
from mlsched.policies.speed_estimate import TrueSpeed
from mlsched.workloads.speed_models import SpeedModel


class UnknownPolicyError(ValueError):
    pass


@dataclass
class PolicyContext:
    speed_model: SpeedModel | None = None  # the simulator's true speed function
    model_path: str | None = None  # a learned policy's ONNX file (its card sits beside it)


def _oracle(ctx: PolicyContext) -> AllocationPolicy:
    if ctx.speed_model is None:
        raise UnknownPolicyError("optimus-oracle needs the true speed function; it exists only in the simulator")
    speed = ctx.speed_model
    return Optimus(lambda snapshot: TrueSpeed(speed), name="optimus-oracle")


def _dl2(ctx: PolicyContext) -> AllocationPolicy:
    from mlsched.policies.dl2 import DL2Policy  # imported lazily: loads onnxruntime

    return DL2Policy.load(ctx.model_path)


ALLOCATION: dict[str, Callable[[PolicyContext], AllocationPolicy]] = {
    "fixed": lambda ctx: Fixed(),
    "fifo": lambda ctx: FIFO(),
    "srtf": lambda ctx: SRTF(),
    "drf": lambda ctx: DRF(),
    "tetris": lambda ctx: Tetris(),
    "optimus": lambda ctx: Optimus(),
    "optimus-oracle": _oracle,
    "dl2": _dl2,
}

PLACEMENT: dict[str, Callable[[], PlacementPolicy]] = {
    "load-balance": LoadBalance,
    "bin-pack": BinPack,
    "first-fit": FirstFit,
    "tetris": TetrisPlacement,
}

GROUPING: dict[str, Callable[[], GroupingPolicy]] = {"none": NoGrouping}


def _unknown(kind: str, name: str, known) -> UnknownPolicyError:
    return UnknownPolicyError(f"unknown {kind} policy {name!r}; known: {', '.join(known)}")


def make_allocation(name: str, ctx: PolicyContext | None = None) -> AllocationPolicy:
    if name not in ALLOCATION:
        raise _unknown("allocation", name, ALLOCATION)
    return ALLOCATION[name](ctx or PolicyContext())


def make_placement(name: str) -> PlacementPolicy:
    if name not in PLACEMENT:
        raise _unknown("placement", name, PLACEMENT)
    return PLACEMENT[name]()


def make_grouping(name: str) -> GroupingPolicy:
    if name not in GROUPING:
        raise _unknown("grouping", name, GROUPING)
    return GROUPING[name]()
