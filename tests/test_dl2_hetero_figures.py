"""The shipped typed DL² (policy_models/artifacts/dl2-hetero, issue 54) on held-out
heterogeneous traces: its figures in docs/dl2.md re-checked with whole simulations.

One trace per cluster size of bench/bench_hetero.py's held-out set (seed 540103: the bench
uses 540100-540104; training used seeds 1000+ and validated on 50000+ at 13, 60 and 500
nodes), plus a 12-node cluster no bench row uses. The issue's floors: <= 0.75 x its agnostic
version (the shipped untyped model with load-balance) and <= 0.90 x the best heuristic (the
lowest of drf, optimus, drf-hetero, optimus-hetero with gpu-type-aware placement).
"""

import sys
from pathlib import Path

import pytest

from mlsched.features.card import ModelCard, card_path
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.sim.scenarios import hetero_cluster, hetero_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_hetero import HEURISTICS, TYPED_DL2, avg_jct_h  # noqa: E402

pytestmark = pytest.mark.figures


def test_the_shipped_typed_model_sees_gpu_types_and_says_where_it_was_trained():
    card = ModelCard.read(card_path(TYPED_DL2))
    assert card.encoder_params == {"window": 40, "gpu_types": True}
    assert card.domain["gpu_types"] == ["k80", "p100", "v100"]
    assert card.training["args"]["gpu_types"] == "v100,p100,k80"
    assert DL2Policy.load(str(TYPED_DL2)).typed


@pytest.mark.parametrize("per_type,seed", [(4, 540107), (6, 540103), (10, 540103)])
def test_typed_dl2_beats_its_agnostic_version_and_the_best_heuristic(per_type, seed):
    types = hetero_cluster(per_type)
    trace = hetero_trace(len(types), seed)
    typed = avg_jct_h(trace, types, seed, "dl2", "gpu-type-aware", str(TYPED_DL2))
    agnostic = avg_jct_h(trace, types, seed, "dl2", "load-balance")
    best = min(avg_jct_h(trace, types, seed, h, "gpu-type-aware") for h in HEURISTICS)
    assert typed <= 0.75 * agnostic, (typed, agnostic)
    assert typed <= 0.90 * best, (typed, best)
