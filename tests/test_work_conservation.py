"""Work conservation (policies/work_conservation.py, issue 51): a round that leaves idle what a
waiting job's minimum would fit is reported with the amounts, one whose free capacity no
waiting minimum fits (too little, or in pieces too small per node) is not; in the simulator
the shipped Chic model is caught leaving most of a large cluster idle, and DRF never is."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import job, make_snapshot
from mlsched.cluster.types import Decision, JobDecision, PoolPlan
from mlsched.policies.work_conservation import idle_capacity
from mlsched.sim import compare
from mlsched.sim.simulator import SimConfig
from mlsched.workloads import generators

# resnet-50: a PS takes (2 CPU, 0 GPU, 8 GiB), a worker (2 CPU, 1 GPU, 8 GiB).


def test_a_waiting_job_whose_minimum_fits_is_reported_with_what_it_would_use():
    running, waiting = job("a"), job("b", arrival=10.0)
    snap = make_snapshot([running, waiting], nodes=2)
    decision = Decision({"a": JobDecision([0], [0, 1])})
    idle = idle_capacity(snap, decision)
    assert not idle.conserving
    assert idle.jobs == ("b",) and idle.waiting == 1
    assert (idle.gpus, idle.cpus, idle.tasks) == (1.0, 4.0, 2)  # its 1 PS + 1 worker
    assert (idle.free_gpus, idle.free_cpus) == (2.0, 10.0)
    assert "1 GPUs, 4 CPUs (2 tasks) idle that 1 of 1 waiting jobs' minimums would fit (b)" \
        in idle.describe()


def test_a_round_that_leaves_no_room_for_any_waiting_minimum_is_conserving():
    snap = make_snapshot([job("a"), job("b", arrival=10.0)], nodes=2)
    # a holds every GPU: b's worker fits nowhere, though CPU and memory are free.
    decision = Decision({"a": JobDecision([0], [0, 0, 1, 1])})
    idle = idle_capacity(snap, decision)
    assert idle.conserving and idle.jobs == () and idle.waiting == 1
    assert (idle.gpus, idle.cpus, idle.tasks) == (0.0, 0.0, 0)
    assert idle.free_gpus == 0.0 and idle.free_cpus == 6.0


def test_free_capacity_in_pieces_smaller_than_a_task_is_not_idle_capacity():
    """Two free GPUs in all, one per node: a worker asking for two fits on neither."""
    big = np.array([2.0, 2.0, 8.0])
    a = job("a", worker_demand=np.array([2.0, 1.0, 8.0]))
    b = job("b", arrival=10.0, worker_demand=big)
    snap = make_snapshot([a, b], nodes=2)
    idle = idle_capacity(snap, Decision({"a": JobDecision([0], [0, 1])}))
    assert idle.free_gpus == 2.0
    assert idle.conserving and idle.jobs == ()


def test_with_partial_room_only_the_minimums_that_fit_one_after_another_count():
    """Room for one more gang: the earliest waiting job takes it, the next no longer fits, and
    the amounts count each idle GPU once."""
    jobs = [job("a"), job("b", arrival=10.0), job("c", arrival=20.0)]
    snap = make_snapshot(jobs, nodes=2)
    idle = idle_capacity(snap, Decision({"a": JobDecision([0], [0, 1, 1])}))
    assert idle.jobs == ("b",) and idle.waiting == 2
    assert (idle.gpus, idle.tasks) == (1.0, 2)


def test_a_minimum_of_several_workers_counts_whole_and_only_when_all_fit():
    jobs = [job("a"), job("b", arrival=10.0, min_workers=3)]
    snap = make_snapshot(jobs, nodes=2)
    # Two GPUs free: b's three workers do not fit, so nothing is idle for it.
    assert idle_capacity(snap, Decision({"a": JobDecision([0], [0, 1])})).conserving
    # Three free: its whole minimum (1 PS + 3 workers) counts.
    idle = idle_capacity(snap, Decision({"a": JobDecision([0], [0])}))
    assert idle.jobs == ("b",) and (idle.gpus, idle.cpus, idle.tasks) == (3.0, 8.0, 4)


def test_nodes_a_waiting_job_may_not_use_are_not_idle_for_it():
    allowed = np.array([True, False])
    b = job("b", arrival=10.0, node_filters={"ps": allowed, "worker": allowed})
    snap = make_snapshot([job("a"), b], nodes=2)
    # a fills node 0's GPUs; node 1 is free but outside b's node filter.
    assert idle_capacity(snap, Decision({"a": JobDecision([0], [0, 0])})).conserving


def test_a_job_a_grouping_holds_back_is_not_counted_as_fitting():
    from mlsched.cluster.types import WAITING_POOL

    snap = make_snapshot([job("a"), job("b", arrival=10.0)], nodes=2)
    plan = PoolPlan({"a": "p0", "b": WAITING_POOL}, ("p0", "p0"))
    idle = idle_capacity(snap, Decision({"a": JobDecision([0], [0])}, pools=plan))
    assert idle.conserving and idle.waiting == 1


def test_with_no_node_to_use_nothing_is_idle():
    snap = make_snapshot([job("a")], nodes=0)
    idle = idle_capacity(snap, Decision({}))
    assert idle.conserving and idle.waiting == 1 and idle.free_gpus == 0.0


def test_the_check_changes_neither_the_snapshot_nor_the_decision():
    snap = make_snapshot([job("a"), job("b", arrival=10.0)], nodes=2)
    decision = Decision({"a": JobDecision([0], [0, 1])})
    capacity = snap.capacity.copy()
    idle_capacity(snap, decision)
    assert np.array_equal(snap.capacity, capacity)
    assert set(decision.jobs) == {"a"} and decision.jobs["a"].worker_nodes == [0, 1]


@pytest.fixture(scope="module")
def chic_and_drf_runs():
    """A held-out 30-node cluster (Chic was trained on one 10-GPU pool) and a generated trace
    of 80 jobs: the case issue 51 reports."""
    trace = generators.generate(jobs=80, rate=3.0, seed=0)
    return compare.run_pairs(trace, SimConfig(nodes=30), ["chic", "drf"], ["load-balance"])


def test_the_simulator_reports_chic_leaving_capacity_idle_and_drf_never(chic_and_drf_runs):
    chic, drf = (r.result for r in chic_and_drf_runs)
    assert chic.rounds > 0 and drf.rounds > 0
    # Chic's 3-job window leaves waiting jobs unstarted in most rounds, many GPUs idle.
    assert chic.nonconserving_rounds > chic.rounds / 2
    assert chic.idle_gpus >= 5 and chic.idle_tasks >= 10
    assert drf.nonconserving_rounds == 0 and drf.idle_gpus == 0.0


def test_simulate_prints_the_work_conservation_of_each_run(chic_and_drf_runs):
    table = compare.format_table(chic_and_drf_runs)
    chic, drf = (r.result for r in chic_and_drf_runs)
    assert (f"chic / load-balance: {chic.nonconserving_rounds} of {chic.rounds} rounds not work "
            f"conserving; idle then (mean): {chic.idle_gpus:.1f} GPUs") in table
    assert f"drf / load-balance: every round work conserving ({drf.rounds})" in table
    row = chic_and_drf_runs[0].row()
    assert row["nonconserving_rounds"] == chic.nonconserving_rounds and row["rounds"] == chic.rounds
