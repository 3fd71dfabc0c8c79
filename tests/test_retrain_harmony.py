"""`mlsched retrain harmony` (policy_models/retrain/harmony.py): the cluster's records of a
fixed-count, Harmony-placed policy become a workload with each job's counts, a calibrated
simulator, a candidate trained from the active model, judged against it and published once.
Needs torch (the `train` extra, installed by `make dev`)."""

from __future__ import annotations

import base64
import importlib
import tomllib
from pathlib import Path

import numpy as np
import pytest

from mlsched.controller import model_versions
from mlsched.policies.onnx_runner import load_model
from policy_models.retrain import harmony, history, publish, workload

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fixed_history():
    """A 6-node cluster whose users fix their jobs' counts, placed by the shipped Harmony
    model, its models running ±30 % off the catalog's speeds."""
    factors = history.perturbation(0.3, seed=3)
    return factors, history.record_history(24, policy="fixed", nodes=6, speed_factors=factors, seed=3,
                                           placement="harmony")


def test_records_name_the_placement_and_the_workload_keeps_each_jobs_counts(fixed_history):
    _, records = fixed_history
    assert {r.algorithms["placement"] for r in records} == {"harmony"}
    assert harmony.recorded_allocation(records) == "fixed"
    load = workload.from_records(records, counts=True)
    jobs = load.trace(1)
    assert jobs and all(1 <= j.workers <= 4 for j in jobs)
    assert all((j.ps is None) == (j.arch == "allreduce") for j in jobs)
    assert all(1 <= j.ps <= 2 for j in jobs if j.ps is not None)
    # Arrivals per interval in which jobs arrived: placement traces bring nodes / 2 = 3 a slot
    # (counting every interval with a job present made it about 1).
    assert 2.4 <= load.rate <= 5.0, load.to_json()
    # A simulated trace is one recorded burst long: a 6-node placement trace has 24 jobs.
    assert load.burst_jobs == 24 and len(jobs) == 24
    # Without counts (DL²'s retrainer) the trace leaves them to the allocation, as before.
    assert all(j.workers is None and j.ps is None for j in workload.from_records(records).trace(1))


def test_a_policy_the_simulator_cannot_run_is_a_clear_error(fixed_history):
    _, records = fixed_history
    other = [type(r)(**{**r.__dict__, "algorithms": {"allocation": "my-own", "placement": "harmony"}})
             for r in records]
    with pytest.raises(ValueError, match="cannot simulate"):
        harmony.recorded_allocation(other)


def test_retraining_publishes_a_servable_placement_version_once(fixed_history, tmp_path):
    _, records = fixed_history
    history.write_records(records, tmp_path / "records")
    argv = ["--records", str(tmp_path / "records"), "--store", str(tmp_path / "store"), "--episodes", "2",
            "--validate-every", "1", "--validation-traces", "1", "--eval-traces", "1",
            "--margin", "-0.9"]  # a forced promotion: this test is about the publishing path
    report = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    assert report["status"] == "published" and report["version"] == 1, report
    evaluation = report["evaluation"]
    assert evaluation["allocation"] == "fixed" and evaluation["trained_through_interval"] == records[-1].interval
    assert evaluation["traces"] == 1 and np.isfinite(evaluation["ratio"])
    (cm,) = publish.DirStore(tmp_path / "store", "default").configmaps()
    version = model_versions.parse(cm)
    assert (version.phase, version.algorithm, version.version) == ("placement", "harmony", 1)
    assert version.model_ref["configMapKeyRef"]["key"] == "harmony.onnx"
    onnx = base64.b64decode(cm["binaryData"]["harmony.onnx"])
    served = tmp_path / "served"
    served.mkdir()
    (served / "harmony.onnx").write_bytes(onnx)
    (served / "harmony.card.json").write_text(cm["data"]["harmony.card.json"])
    model = load_model(served / "harmony.onnx", "harmony", "placement")
    assert model.card.training["mode"] == "simulator"
    # Every interval is consumed: a rerun (a Job restarted after publishing) trains nothing.
    again = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    assert again == {"status": "nothing-new", "trained_through_interval": records[-1].interval}


def test_a_candidate_that_is_not_better_by_the_margin_is_not_published(fixed_history, tmp_path):
    _, records = fixed_history
    history.write_records(records, tmp_path / "records")
    argv = ["--records", str(tmp_path / "records"), "--store", str(tmp_path / "store"), "--episodes", "0",
            "--validation-traces", "1", "--eval-traces", "1", "--margin", "0.02"]
    report = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    # No episode: the candidate is the active model's weights, equal on every trace.
    assert report["status"] == "not-better" and report["evaluation"]["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert publish.DirStore(tmp_path / "store", "default").configmaps() == []


def test_mlsched_retrain_harmony_is_an_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, _, func = project["project"]["entry-points"]["mlsched.retrainers"]["harmony"].partition(":")
    assert getattr(importlib.import_module(module), func) is harmony.main
