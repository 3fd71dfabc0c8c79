"""Serving a learned allocation with exploration and a decision log (issue 17): the probabilities
recorded are the ones the serving policy used, a seeded round replays exactly, and without
exploration or recording the policy decides as it always did."""

from __future__ import annotations

import numpy as np
import pytest

from mlsched.formats.serving import applied_epsilon, seed, serve
from mlsched.policies import registry
from mlsched.policies.exploration import Serving, greedy_behaviour, sampling_behaviour
from mlsched.policies.round import run_round
from conftest import job, make_snapshot


def snapshot():
    jobs = [job(f"j{i}", arrival=float(i), epochs=50 + 10 * i) for i in range(6)]
    return make_snapshot(jobs, nodes=6)


def decide(allocation):
    return run_round(snapshot(), allocation, registry.make_placement("load-balance"))


def counts(decision):
    return {n: (d.ps, d.workers) for n, d in decision.jobs.items()}


@pytest.fixture(scope="module")
def dl2():
    return registry.make_allocation("dl2")


@pytest.fixture(scope="module")
def chic():
    return registry.make_allocation("chic")


def serving_of(policy, epsilon, record=True, interval=3):
    return serve({"allocation": policy}, namespace="ns", policy="p", interval=interval,
                 kind="round", time="2026-01-01T00:00:00Z", epsilon=epsilon, record=record,
                 versions={"allocation/dl2": 4})


def test_no_exploration_and_no_recording_serves_the_cached_policy_itself(dl2):
    s = serving_of(dl2, 0.0, record=False)
    assert s.phases["allocation"] is dl2 and s.recorders == []


def test_recording_without_exploration_changes_no_decision(dl2):
    plain = counts(decide(dl2))
    s = serving_of(dl2, 0.0)
    assert counts(decide(s.phases["allocation"])) == plain
    (log,) = s.decisions()
    assert log.steps > 0 and log.algorithm == "dl2" and log.phase == "allocation"
    assert log.model_version == "4" and log.model_sha256 == dl2.card.onnx_sha256
    assert log.epsilon == 0.0 and log.kind == "round"
    assert np.all(log.behaviour_probs == 1.0)  # greedy, no exploration: mu = 1
    assert log.masks[np.arange(log.steps), log.actions].all()  # only allowed actions
    assert log.states.shape == (log.steps, dl2.card.inputs[0].shape[0])
    assert not log.granted[-1] or log.actions[-1] != log.masks.shape[1] - 1


def test_dl2_exploration_records_the_behaviour_probability_and_replays(dl2):
    s = serving_of(dl2, 0.5)
    first = counts(decide(s.phases["allocation"]))
    (log,) = s.decisions()
    allowed = log.masks.sum(axis=1)
    # Which steps were greedy is known from the network's own choice on the same state.
    explored = log.behaviour_probs < 0.5
    assert explored.any() and (~explored).any()
    np.testing.assert_allclose(log.behaviour_probs[~explored], 0.5 + 0.5 / allowed[~explored],
                               rtol=1e-6)
    np.testing.assert_allclose(log.behaviour_probs[explored], 0.5 / allowed[explored], rtol=1e-6)
    assert greedy_behaviour(0.5, 4, 1, 1) == pytest.approx(0.625)
    # The same policy, interval, kind and time: the same decision and log.
    again = serving_of(dl2, 0.5)
    assert counts(decide(again.phases["allocation"])) == first
    np.testing.assert_array_equal(again.decisions()[0].actions, log.actions)
    # Another interval explores differently.
    other = serving_of(dl2, 0.5, interval=4)
    decide(other.phases["allocation"])
    assert not np.array_equal(other.decisions()[0].actions, log.actions)


def test_chic_records_sampling_probabilities(chic):
    plain = counts(decide(chic))
    s = serving_of(chic, 0.0)
    assert counts(decide(s.phases["allocation"])) == plain  # its own sampling stream, unchanged
    (log,) = s.decisions()
    np.testing.assert_allclose(log.behaviour_probs, log.policy_probs, rtol=1e-6)
    explored = serving_of(chic, 0.3)
    decide(explored.phases["allocation"])
    (log,) = explored.decisions()
    allowed = log.masks.sum(axis=1)
    np.testing.assert_allclose(log.behaviour_probs, 0.7 * log.policy_probs + 0.3 / allowed,
                               rtol=1e-5)
    assert sampling_behaviour(0.3, 3, 0.5) == pytest.approx(0.45)


def test_exploration_is_bounded_and_seeded():
    assert applied_epsilon(0.5, 0.2) == 0.2 and applied_epsilon(0.1, 0.2) == 0.1
    assert seed("a", "p", 1, "round", "t") == seed("a", "p", 1, "round", "t")
    assert seed("a", "p", 1, "round", "t") != seed("a", "p", 2, "round", "t")
    with pytest.raises(ValueError):
        Serving(epsilon=0.1)  # no generator
    with pytest.raises(ValueError):
        Serving(epsilon=1.5, rng=np.random.default_rng(0))


def test_heuristics_are_served_as_they_are():
    drf = registry.make_allocation("drf")
    s = serving_of(drf, 0.2)
    assert s.phases["allocation"] is drf and s.decisions() == []


def test_the_operator_bound_is_a_setting():
    from mlsched.controller.__main__ import parse_args
    from mlsched.controller.process.config import OperatorConfig

    assert OperatorConfig().max_exploration == 0.2
    assert OperatorConfig.from_env({"MLSCHED_MAX_EXPLORATION": "0.05"}).max_exploration == 0.05
    assert any("--max-exploration" in p for p in OperatorConfig(max_exploration=1.5).problems())
    assert parse_args(["--max-exploration", "0.3"]).max_exploration == 0.3
