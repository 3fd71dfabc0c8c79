"""The sim-to-real comparison (policy_models/retrain/fidelity.py) and what the retraining loop
takes from it (policy_models/retrain/calibration.py): the restart and start costs read from
interval records, and a real run replayed in the calibrated simulator."""

from __future__ import annotations


import pytest

from mlsched.policies.decision_log import IntervalRecord, JobInterval
from mlsched.workloads.speed_models import epochs_per_s, get_speed_model
from policy_models.retrain import calibration, fidelity

LENGTH = 10.0


def job(interval: int, ps: int, workers: int, epochs: float, speed: float | None = None,
        finished: bool = False, uid: str = "u1", model: str = "resnet-50") -> JobInterval:
    return JobInterval(name=uid, uid=uid, model_type=model, architecture="ParameterServer",
                       total_epochs=100, created="2026-11-30T00:00:00Z", ps=ps, workers=workers,
                       placement={"ps": ["n"] * ps, "worker": ["n"] * workers},
                       epochs_at_start=interval, epochs=epochs, reward=epochs / 100,
                       finished=finished, speed=speed)


def record(interval: int, *jobs: JobInterval) -> IntervalRecord:
    return IntervalRecord(namespace="ns", policy="p", policy_uid="pu", interval=interval,
                          start="2026-11-30T00:00:00Z", end="2026-11-30T00:00:10Z",
                          length_s=LENGTH, algorithms={"allocation": "drf"}, nodes=1,
                          reward=0.0, jobs=list(jobs))


def test_restart_cost_is_the_time_a_change_of_counts_lost():
    records = [
        record(0, job(0, 1, 1, 1.0, speed=0.1)),  # a start: not counted
        record(1, job(1, 1, 1, 1.0, speed=0.1)),
        record(2, job(2, 1, 2, 1.2, speed=0.2)),  # 1.2 epochs at 0.2/s: 6 s trained, 4 s lost
        record(3, job(3, 1, 2, 2.0, speed=0.2)),
        record(4, job(4, 1, 1, 0.3)),  # no speed measured here: the next interval's counts
        record(5, job(5, 1, 1, 1.0, speed=0.1)),  # 0.3 epochs at 0.1/s: 7 s lost
    ]
    cost, changes = calibration.restart_cost(records)
    assert changes == 2
    assert cost == pytest.approx(5.5)


def test_a_restart_cut_short_by_another_counts_as_at_least_its_time():
    """A restart that had not trained when the next round changed the counts again took at
    least the interval: kept, not dropped (long restarts are the ones that get cut)."""
    records = [
        record(0, job(0, 1, 1, 1.0, speed=0.1)),
        record(1, job(1, 1, 1, 1.0, speed=0.1)),
        record(2, job(2, 1, 2, 0.0)),  # changed; nothing trained
        record(3, job(3, 1, 1, 0.05, speed=0.1)),  # changed again; a stale-looking report
        record(4, job(4, 1, 1, 1.0, speed=0.1)),  # 0.05 + 1.0 epochs at 0.1/s: 10.5 of 20 s
    ]
    cost, changes = calibration.restart_cost(records)
    assert changes == 2
    assert cost == pytest.approx((10.0 + 9.5) / 2)


def test_no_change_of_counts_gives_no_cost():
    records = [record(i, job(i, 1, 1, 1.0, speed=0.1)) for i in range(4)]
    assert calibration.restart_cost(records) == (None, 0)


def test_a_run_is_replayed_with_the_speed_its_records_show(tmp_path):
    """One job alone, allowed one PS and one worker: DRF gives them at once, the records show
    it training at 3 x the catalog's speed there; the simulator predicts the JCT that speed and the start cost
    give, and the error against the 'real' JCT is signed (simulated / real - 1)."""
    speed = get_speed_model("measured")
    factor, epochs = 3.0, 20
    rate = epochs_per_s(speed, "resnet-50", "ps", 1, 1, 1) * factor
    per_interval = rate * LENGTH
    records = [record(i, job(i, 1, 1, per_interval, speed=rate)) for i in range(6)]
    directory = tmp_path / "records" / "drf"
    directory.mkdir(parents=True)
    for r in records:
        (directory / f"{r.interval:05d}.json.gz").write_bytes(r.to_bytes())
    start_cost = 0.0  # no change of counts in the records: the pods' Ready time, none here
    expected = start_cost + epochs / rate
    doc = {"trace": [{"name": "u1", "architecture": "ParameterServer", "model": "resnet-50",
                      "epochs": epochs, "arrival_s": 0}],
           "interval_s": LENGTH, "max_ps": 1, "max_workers": 1,
           "node_free": {"cpu": 1.5, "nvidia.com/gpu": 4, "memory": 8 * 2 ** 30},
           "runs": [{"allocation": "drf", "jobs": {"u1": {
               "created_s": 1000.0, "started_s": 1002.0, "completed_s": 1000.0 + expected * 1.25,
               "rescales": 0, "rescale_seconds": 0.0}}}]}
    (run,) = fidelity.compare(doc, tmp_path / "records")["runs"]
    assert run["avg_real_s"] == pytest.approx(expected * 1.25, abs=0.1)
    by = {p["calibration"]: p for p in run["predictions"]}
    assert set(by) == {"retrain's", "recorded"}  # from its own records; no other run
    assert by["retrain's"]["speed_factors"]["resnet-50"] == pytest.approx(factor, rel=1e-3)
    assert by["recorded"]["start_cost_s"] == pytest.approx(0.0, abs=1e-6)  # trained from the start
    assert by["recorded"]["sim_s"]["u1"] == pytest.approx(expected, rel=0.02)
    assert by["recorded"]["errors"]["u1"] == pytest.approx(1 / 1.25 - 1, abs=0.02)
    # Retraining reads its costs from 3 readings or more, so with one start it charges the
    # simulator's default (30 s, forgiven at the slot's end as in the shipped simulator).
    assert by["retrain's"]["restart_cost_s"] == 30.0 and by["retrain's"]["start_cost_s"] is None
    assert by["retrain's"]["sim_s"]["u1"] == pytest.approx(expected + LENGTH, rel=0.02)
    for p in by.values():
        assert p["avg_error"] == pytest.approx(p["errors"]["u1"], abs=1e-3)


def one_job_jct(**config) -> float:
    from mlsched.policies import registry
    from mlsched.sim.simulator import SimConfig, Simulator
    from mlsched.workloads.traces import TraceJob
    sim = Simulator([TraceJob("a", 0.0, "resnet-50", 1.0, "ps")],
                    SimConfig(nodes=1, max_ps=1, max_workers=1, interval_s=10.0, **config))
    ctx = registry.PolicyContext(speed_model=sim.speed)
    result = sim.run(registry.make_allocation("drf", ctx), registry.make_placement("load-balance", ctx))
    return result.jct_s["a"]


def test_a_start_cost_longer_than_a_slot_is_paid_in_full_only_when_costs_span_slots():
    speed = get_speed_model("measured")
    train = 1.0 / epochs_per_s(speed, "resnet-50", "ps", 1, 1, 1)
    assert one_job_jct(scaling_cost_s=0.0) == pytest.approx(train, rel=1e-6)
    # As before (the shipped figures): a cost is forgiven where its slot ends.
    assert one_job_jct(scaling_cost_s=0.0, start_cost_s=35.0) == pytest.approx(train + 10.0, rel=1e-6)
    assert one_job_jct(scaling_cost_s=0.0, start_cost_s=35.0, costs_span_slots=True) == \
        pytest.approx(train + 35.0, rel=1e-6)
    # The start cost is the start's: scaling_cost_s stays the restarts'.
    assert one_job_jct(scaling_cost_s=4.0, start_cost_s=7.0, costs_span_slots=True) == \
        pytest.approx(train + 7.0, rel=1e-6)


def test_recorded_speeds_replace_the_table_where_measured_only():
    from mlsched.workloads import speed_models
    inner = get_speed_model("measured")
    recorded = speed_models.RecordedSpeed(inner, {("resnet-50", "ps", 1, 2): 0.5,
                                                  ("inception-bn", "allreduce", 0, 2): 0.25})
    assert epochs_per_s(recorded, "resnet-50", "ps", 1, 2, 1) == pytest.approx(0.5)
    assert epochs_per_s(recorded, "inception-bn", "allreduce", 0, 2, 1) == pytest.approx(0.25)
    assert epochs_per_s(recorded, "resnet-50", "ps", 2, 2, 1) == epochs_per_s(inner, "resnet-50", "ps", 2, 2, 1)
    with pytest.raises(ValueError, match="finite and > 0"):
        speed_models.RecordedSpeed(inner, {("resnet-50", "ps", 1, 1): 0.0})


def test_start_cost_counts_jobs_admitted_on_arrival_only():
    def rec(interval, *jobs):
        r = record(interval, *jobs)
        r.start = f"2026-11-30T00:00:{interval * 10:02d}Z"
        r.end = f"2026-11-30T00:00:{interval * 10 + 10:02d}Z"
        return r
    started = job(0, 1, 1, 0.0, uid="a")  # created at :00, granted in its first interval
    waited = JobInterval(**{**vars(job(0, 0, 0, 0.0, uid="b"))})  # no tasks at first
    records = [rec(0, started, waited),
               rec(1, job(1, 1, 1, 0.5, speed=0.1, uid="a"), job(1, 1, 1, 0.0, uid="b")),
               rec(2, job(2, 1, 1, 1.0, speed=0.1, uid="a"), job(2, 1, 1, 1.0, speed=0.1, uid="b"))]
    cost, jobs = calibration.start_cost(records)
    assert jobs == 1  # b waited for its tasks: when it started is unknown
    assert cost == pytest.approx(20.0 - 0.5 / 0.1)


def test_tasks_a_running_job_gives_up_are_free_only_after_the_handover():
    """Two one-GPU jobs on a one-GPU node; DRF shares it by taking the first job's worker at
    the second's first round: the second job waits the handover as well as its start."""
    from mlsched.policies import registry
    from mlsched.sim.simulator import SimConfig, Simulator
    from mlsched.workloads.traces import TraceJob

    def jct(**config):
        sim = Simulator([TraceJob("a", 0.0, "resnet-50", 50.0, "ps"), TraceJob("b", 5.0, "resnet-50", 1.0, "ps")],
                        SimConfig(nodes=1, node_gpus=1, max_ps=1, max_workers=1, interval_s=10.0,
                                  scaling_cost_s=0.0, start_cost_s=2.0, costs_span_slots=True, **config))
        ctx = registry.PolicyContext(speed_model=sim.speed)
        result = sim.run(registry.make_allocation("srtf", ctx), registry.make_placement("load-balance", ctx))
        return result.jct_s

    at_once, handed = jct(), jct(handover_s=7.0)
    assert handed["b"] == pytest.approx(at_once["b"] + 7.0, rel=1e-6)


def test_the_real_run_benchmark_submits_valid_objects():
    """bench/bench_real_runs.py runs by hand only (the real node): its MLJobs and policies,
    for the fixed trace and a seeded one, pass the API's own validation, so the bench does not
    find a schema change the hard way."""
    import sys
    from pathlib import Path

    from mlsched.api.mljob import MLJobSpec
    from mlsched.api.schedulingpolicy import SchedulingPolicySpec

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        import bench_real_runs as bench
    finally:
        sys.path.pop(0)
    for job in bench.TRACE + bench.seeded_trace(5301):
        body = bench.mljob(job, "real-drf", "claim", "localhost/training:e2e")
        spec = MLJobSpec.model_validate(body["spec"])
        assert spec.replica_specs is not None
    for job, counts in bench.PAIR_JOBS.values():
        fixed = bench.mljob(job, "real-pairs", "claim", "img", counts=counts, sample_cost_s=0.0)
        spec = MLJobSpec.model_validate(fixed["spec"])
        assert spec.replica_specs.worker.min == spec.replica_specs.worker.max == 2
    for allocation in ("drf", "dl2"):
        SchedulingPolicySpec.model_validate(bench.scheduling_policy("p", allocation, 10)["spec"])
    assert [j.epochs for j in bench.seeded_trace(5301)] == [19, 17, 7, 15, 20, 20]  # the docs' trace


def changes_of_counts(lost: list[float]) -> list[IntervalRecord]:
    """Records of one job whose counts change every other interval, losing `lost[i]` s of
    the i-th restart (0.1 epochs/s at both counts)."""
    records = [record(0, job(0, 1, 1, 1.0, speed=0.1))]
    for i, seconds in enumerate(lost):
        workers = 2 if i % 2 == 0 else 1
        records.append(record(2 * i + 1, job(2 * i + 1, 1, workers, (LENGTH - seconds) * 0.1, speed=0.1)))
        records.append(record(2 * i + 2, job(2 * i + 2, 1, workers, 1.0, speed=0.1)))
    return records


def test_the_restart_cost_is_the_mean_loss_so_that_every_second_lost_is_charged():
    """A few long restarts among short ones (what a real node shows): the median would charge
    the short ones' cost for all, the mean charges what was lost in all."""
    cost, changes = calibration.restart_cost(changes_of_counts([1.0, 2.0, 9.0]))
    assert changes == 3
    assert cost == pytest.approx(4.0)


def test_retraining_simulates_with_the_costs_the_records_show(tmp_path):
    """`mlsched retrain` calibrates the restart cost from its records and its simulator charges
    it (Workload.config), a restart paid in full even past a slot as on the cluster; from
    fewer than MIN_COST_SAMPLES changes the simulator's default stands."""
    from policy_models.retrain import workload

    load = workload.Workload(nodes=2, rate=1.0, jobs=[("resnet-50", 10.0, "ps")], interval_s=LENGTH)
    cal = calibration.calibrate(changes_of_counts([1.0, 2.0, 9.0]), min_samples=3)
    assert (cal.restart_cost_s, cal.restart_changes) == (pytest.approx(4.0), 3)
    config = load.config(1, cal)
    assert config.scaling_cost_s == pytest.approx(4.0) and config.costs_span_slots
    assert config.start_cost_s is None  # one job started on arrival in these records: too few
    few = calibration.calibrate(changes_of_counts([1.0, 2.0]), min_samples=3)
    assert few.restart_cost_s is None and few.restart_changes == 2
    default = load.config(1, few)
    assert default.scaling_cost_s == calibration.DEFAULT_SCALING_COST_S == load.config(1).scaling_cost_s
    assert not default.costs_span_slots
    # The run says what it charges, and why the default where it is.
    assert calibration.cost_line(cal) == ("restart cost: 4.0 s, the mean over 3 changes of counts; start cost: as a "
                              "restart (the records hold 1 jobs started on arrival, under 3)")
    assert "the simulator's default, 30 s" in calibration.cost_line(few) and "2 changes" in calibration.cost_line(few)
    # The costs travel with the calibration file; a version-2 file (none) reads as the defaults.
    again = calibration.Calibration.read(_written(tmp_path / "v3.json", cal.to_json()))
    assert again.sim_costs() == cal.sim_costs()
    old = {k: v for k, v in cal.to_json().items() if "cost" not in k and k not in ("restart_changes", "start_jobs")}
    assert calibration.Calibration.read(_written(tmp_path / "v2.json", {**old, "version": 2})).sim_costs() == {}


def _written(path, doc: dict):
    import json

    path.write_text(json.dumps(doc))
    return path


def test_records_without_speeds_give_no_restart_cost():
    """Records that report no speed (the simulator's own, bench_retrain's histories) cannot say
    how long a job that trained was held up: no reading, so retraining on them charges the
    simulator's default instead of the whole interval as lost."""
    records = [record(i, job(i, 1, 1 + i % 2, 5.0)) for i in range(8)]  # a change every interval
    assert calibration.restart_cost(records) == (None, 0)
    # One that trained nothing before the next change still shows a lower bound.
    records[3] = record(3, job(3, 1, 2, 0.0))
    assert calibration.restart_cost(records) == (LENGTH, 1)
