"""LIF and Tiresias-style placement (issue 15's baselines): LIF's fitted slowdown agrees with
the interference model it was profiled on, LIF keeps a sensitive task away from a noisy
neighbour when it can, Tiresias consolidates a skewed model and spreads the others, and no
rule ever picks a node the task does not fit on."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import job, make_snapshot
from mlsched.cluster.ledger import Ledger
from mlsched.policies import registry
from mlsched.policies.placement import interference_aware as ia
from mlsched.workloads import interference

MODELS = list(interference.DEMAND)


def held_out_error(degree: int, samples: int = 60) -> float:
    """Mean |predicted − true| / true step time over random co-tenant sets the fit never saw."""
    rng = np.random.default_rng(12345)
    errors = []
    for victim in MODELS:
        for _ in range(samples):
            placements = {"v": (victim, [0] * int(rng.integers(1, 3)))}
            for k in range(int(rng.integers(1, 5))):
                placements[f"n{k}"] = (MODELS[int(rng.integers(len(MODELS)))], [0] * int(rng.integers(1, 4)))
            load = sum(len(n) * interference.DEMAND[m][:2] for j, (m, n) in placements.items() if j != "v")
            true = 1.0 / interference.job_speed_factors(placements)["v"]
            errors.append(abs(1.0 + float(ia.predicted_slowdown(victim, load, degree)) - true) / true)
    return float(np.mean(errors))


def test_lif_fits_the_profiled_model_quadratic_better_than_linear():
    line, quad = held_out_error(1), held_out_error(2)
    assert line < 0.15 and quad < 0.07
    assert quad < line


def ledger_for(policy, jobs, nodes=3, cpu=8.0):
    return Ledger(make_snapshot(jobs, nodes=nodes, cpu=cpu), policy)


def test_lif_keeps_a_cpu_sensitive_task_away_from_a_noisy_neighbour():
    """CTC (cnn-text-classification) is the noisy one; ResNeXt the most CPU-sensitive
    (interference.py). With a CTC job on node 0 and a WLM job (quiet) on node 1, LIF puts
    ResNeXt next to WLM; load-balance, which sees only reserved resources, does not care."""
    noisy, quiet = job("ctc", model="cnn-text-classification"), job("wlm", model="wlm")
    victim = job("rx", model="resnext-110")
    for degree in (1, 2):
        lif = ia.LeastInterferenceFirst(degree)
        ledger = ledger_for(lif, [noisy, quiet, victim], nodes=2)
        ledger.book(noisy, "worker", 0)
        ledger.book(quiet, "worker", 1)
        assert lif.choose_node(ledger, victim, "worker", victim.demand("worker")) == 1


def test_lif_with_calibrated_sensitivities_weighs_each_victim_by_its_factor():
    """A cluster's calibration (retraining) can tell LIF that a model suffers less than the
    profile says: with ResNeXt's factor 0 (and WLM's 1), the slowdown it would suffer next to
    CTC no longer counts, so the quiet neighbour's own slowdown decides and ResNeXt joins CTC."""
    noisy, quiet = job("ctc", model="cnn-text-classification"), job("wlm", model="wlm")
    victim = job("rx", model="resnext-110")
    scores = {}
    for label, known in (("profile", None), ("ones", {m: 1.0 for m in MODELS}),
                         ("numb", {"resnext-110": 0.0, "cnn-text-classification": 0.0})):
        lif = ia.LeastInterferenceFirst(1, known)
        ledger = ledger_for(lif, [noisy, quiet, victim], nodes=2)
        ledger.book(noisy, "worker", 0)
        ledger.book(quiet, "worker", 1)
        scores[label] = [lif._score(ledger, n, "rx", "resnext-110") for n in (0, 1)]
        node = lif.choose_node(ledger, victim, "worker", victim.demand("worker"))
        assert node == (0 if label == "numb" else 1), label
    assert scores["ones"] == scores["profile"]
    assert scores["numb"][0] == 0.0 < scores["numb"][1]


def test_lif_ties_go_to_the_lowest_node_and_a_jobs_own_tasks_do_not_count():
    lif = ia.LeastInterferenceFirst(1)
    a, b = job("a"), job("b")
    ledger = ledger_for(lif, [a, b])
    ledger.book(a, "ps", 0)
    assert lif.choose_node(ledger, a, "worker", a.demand("worker")) == 0  # no co-tenant anywhere
    assert lif.choose_node(ledger, b, "worker", b.demand("worker")) == 1  # away from a


def test_tiresias_consolidates_vgg_and_spreads_resnet():
    tiresias = ia.TiresiasPlacement()
    assert tiresias.consolidates("vgg-16") and not tiresias.consolidates("resnet-50")
    vgg, resnet, other = job("vgg", model="vgg-16"), job("rn", model="resnet-50"), job("o")
    ledger = ledger_for(tiresias, [vgg, resnet, other])
    ledger.book(other, "worker", 0)  # node 0 is the fullest, node 2 the emptiest of 1 and 2
    ledger.book(vgg, "ps", 1)
    assert tiresias.choose_node(ledger, vgg, "worker", vgg.demand("worker")) == 1  # its own node
    assert tiresias.choose_node(ledger, resnet, "worker", resnet.demand("worker")) == 2  # least loaded


@pytest.mark.parametrize("name", ["lif-line", "lif-quad", "tiresias"])
def test_no_rule_picks_a_node_the_task_does_not_fit_on(name):
    policy = registry.make_placement(name, registry.PolicyContext(sticky=False))
    jobs = [job(f"j{i}", model=MODELS[i % len(MODELS)]) for i in range(12)]
    ledger = ledger_for(policy, jobs, nodes=3)
    placed = 0
    for j in jobs:
        for role in ("ps", "worker"):
            node = policy.choose_node(ledger, j, role, j.demand(role))
            fits = ledger.fits_mask(j.demand(role), j)
            if node is None:
                assert not fits.any()
                continue
            assert fits[node]
            ledger.book(j, role, node)
            placed += 1
    assert placed > 0 and (ledger.free >= -1e-9).all()


def test_an_unknown_model_is_placed_with_the_catalog_means():
    lif = ia.LeastInterferenceFirst(2)
    custom = job("c", model="my-own-bert", ps_demand=np.array([2.0, 0.0, 8.0]),
                 worker_demand=np.array([2.0, 1.0, 8.0]))
    noisy = job("ctc", model="cnn-text-classification")
    ledger = ledger_for(lif, [custom, noisy], nodes=2)
    ledger.book(noisy, "worker", 0)
    assert lif.choose_node(ledger, custom, "worker", custom.demand("worker")) == 1
    assert ia.TiresiasPlacement().consolidates("my-own-bert") is False
