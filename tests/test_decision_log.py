"""The decision log's record format: what the operator writes is what retraining reads."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from mlsched.policies.decision_log import (
    DecisionRecorder, IntervalRecord, JobInterval, RoundDecisions,
)


def _decisions(steps: int = 5, dim: int = 7, actions: int = 4) -> RoundDecisions:
    rng = np.random.default_rng(0)
    rec = DecisionRecorder(algorithm="dl2", phase="allocation", kind="round",
                           time="2026-11-23T10:00:00Z", model_sha256="ab" * 32, model_version="3",
                           encoder="dl2-state", encoder_version="dl2-state-v2",
                           encoder_params={"window": 2}, epsilon=0.1)
    state = np.zeros(dim, np.float32)
    for k in range(steps):
        state[k % dim] = rng.uniform(0, 3)  # updated in place, as the encoders do
        mask = rng.random(actions) < 0.7
        mask[-1] = True
        rec.record(state, mask, k % actions, 0.5, 0.4, k % 2 == 0, window=k // 3)
    return rec.finish()


def _record(decisions: list[RoundDecisions]) -> IntervalRecord:
    job = JobInterval(name="a", uid="u1", model_type="resnet-50", architecture="ParameterServer",
                      total_epochs=10, created="2026-11-23T09:00:00Z", ps=1, workers=2,
                      placement={"ps": ["n1"], "worker": ["n1", "n2"]}, epochs_at_start=1.5,
                      epochs=0.5, reward=0.05)
    return IntervalRecord(namespace="ns", policy="default", policy_uid="p1", interval=7,
                          start="2026-11-23T10:00:00Z", end="2026-11-23T10:20:00Z", length_s=1200,
                          algorithms={"allocation": "dl2", "placement": "load-balance"}, nodes=13,
                          reward=0.05, jobs=[job], decisions=decisions)


def test_the_recorder_keeps_each_step_as_it_was_then():
    d = _decisions()
    assert d.steps == 5 and d.states.shape == (5, 7) and d.masks.dtype == bool
    # The state vector was changed in place after every step: each row is its own copy.
    assert len({tuple(row) for row in d.states}) == 5
    assert list(d.windows) == [0, 0, 0, 1, 1]


def test_an_empty_recorder_records_nothing():
    rec = DecisionRecorder(algorithm="dl2", phase="allocation", kind="round", time="t",
                           model_sha256="0" * 64, model_version=None, encoder="e",
                           encoder_version="v", encoder_params={}, epsilon=0.0)
    assert rec.finish() is None and len(rec) == 0


def test_a_record_round_trips_through_bytes():
    d = _decisions()
    record = _record([d])
    data = record.to_bytes()
    assert data == record.to_bytes()  # deterministic: rewriting a record is a no-op
    back = IntervalRecord.from_bytes(data)
    assert back.jobs == record.jobs and back.interval == 7 and back.reward == 0.05
    (b,) = back.decisions
    np.testing.assert_array_equal(b.actions, d.actions)
    np.testing.assert_array_equal(b.masks, d.masks)
    np.testing.assert_allclose(b.states, d.states, rtol=1e-3)  # float16 on the wire
    assert b.states.dtype == np.float32 and b.model_version == "3" and b.epsilon == 0.1


def test_a_records_size_fits_a_configmap_for_a_busy_dl2_round():
    # DL² at J = 40: 1,166 features per state; 300 inferences in one round.
    d = _decisions(steps=300, dim=1166, actions=121)
    assert len(_record([d]).to_bytes()) < 1024 * 1024


@pytest.mark.parametrize(("data", "said"), [
    (b"not gzip", "gzip'd JSON expected"),
    (gzip.compress(json.dumps({"format": "other"}).encode()), "format 'other'"),
    (gzip.compress(json.dumps({"format": "mlsched.io/interval-record", "version": 99}).encode()),
     "version 99"),
], ids=["not-gzip", "other-format", "newer-version"])  # gzip's header holds a time: ids must not
def test_a_foreign_or_newer_record_is_refused_with_the_reason(data, said):
    with pytest.raises(ValueError, match=said):
        IntervalRecord.from_bytes(data)
