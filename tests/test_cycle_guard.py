"""The cycle guard (policies/cycle_guard.py): a learned round does not send a job back to counts
it just left while nothing else changed, and says so in the decision log; it never holds back a
change when the job set or the cluster changed, a first grow, or a job holding nothing."""

from __future__ import annotations

import dataclasses
import gzip
import json

from conftest import job, make_snapshot
from mlsched.cluster.types import Decision
from mlsched.formats.serving import RoundServing
from mlsched.policies import registry
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.decision_log import DecisionRecorder, IntervalRecord
from mlsched.policies.round import as_decided, run_served_round, settles
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads.traces import TraceJob

import numpy as np


class Flipper:
    """A 'learned' allocation whose decision is a function of each job's current counts, as
    DL²'s state holds them: per job, counts -> the counts it decides (default: the starting
    gang). `learned` makes the operator treat it as such (not settled)."""

    name = "flipper"
    learned = True

    def __init__(self, table: dict[str, dict[tuple[int, int], tuple[int, int]]]):
        self.table = table

    def for_round(self, serving):  # pragma: no cover - only its presence matters
        return self

    def allocate(self, snapshot, ledger):
        for j in snapshot.jobs:
            ps, workers = self.table.get(j.name, {}).get((j.ps, j.workers), j.starting_gang)
            if ps + workers:
                ledger.grant(j, ps, workers)


FLIP = {(1, 1): (2, 1), (2, 1): (1, 1)}  # 1 -> 2 -> 1 PS, every round, for good
LB = registry.make_placement("load-balance")


def _rounds(snap, allocation, guard, n):
    """n rounds, each on what the previous one decided; each job's counts after each round
    and the rounds' decisions."""
    seen, decisions = [], []
    for _ in range(n):
        decision = run_served_round(snap, allocation, LB, None, guard)
        decisions.append(decision)
        snap = as_decided(snap, decision)
        seen.append({j.name: (j.ps, j.workers) for j in snap.jobs})
    return seen, decisions, snap


def test_a_two_cycle_is_kept_at_its_current_counts_and_said_so():
    flipper = Flipper({"a": FLIP})
    assert not settles(flipper, LB, None)
    snap = make_snapshot([job("a"), job("b", model="dssm")])
    unguarded, _, _ = _rounds(snap, flipper, None, 5)
    assert [r["a"] for r in unguarded] == [(1, 1), (2, 1), (1, 1), (2, 1), (1, 1)]

    guard = CycleGuard()
    seen, decisions, _ = _rounds(snap, flipper, guard, 5)
    # Starts at (1, 1), grows once (a first grow), then the return to (1, 1) is kept back.
    assert [r["a"] for r in seen] == [(1, 1), (2, 1), (2, 1), (2, 1), (2, 1)]
    assert [d.kept for d in decisions[:2]] == [{}, {}]
    assert all(d.kept == {"a": ((2, 1), (1, 1))} for d in decisions[2:])
    assert guard.kept_total == 3
    assert all("b" not in d.kept for d in decisions)  # b never changed


def test_what_was_kept_is_in_the_allocation_decision_log_and_survives_a_record():
    recorder = DecisionRecorder(algorithm="dl2", phase="allocation", kind="round",
                                time="2026-11-29T12:00:00Z", model_sha256="0" * 64,
                                model_version=None, encoder="dl2-state", encoder_version="v",
                                encoder_params={}, epsilon=0.0)
    recorder.record(np.zeros(3), np.ones(2, bool), 1, 1.0, 1.0, True)
    serving = RoundServing({}, [recorder])
    serving.keep({"a": ((2, 1), (1, 1))})
    decisions = serving.decisions()
    assert decisions[0].kept == {"a": [[2, 1], [1, 1]]}
    record = IntervalRecord(namespace="ns", policy="p", policy_uid="u", interval=3, start="s",
                            end="e", length_s=1200.0, algorithms={"allocation": "dl2"}, nodes=4,
                            reward=0.5, decisions=decisions)
    back = IntervalRecord.from_bytes(record.to_bytes())
    assert back.decisions[0].kept == {"a": [[2, 1], [1, 1]]}
    # A version-1 record (before the guard) reads as nothing kept.
    doc = json.loads(gzip.decompress(record.to_bytes()))
    doc["version"] = 1
    del doc["decisions"][0]["kept"]
    old = IntervalRecord.from_bytes(gzip.compress(json.dumps(doc).encode()))
    assert old.decisions[0].kept == {} and old.decisions[0].steps == 1
    # A round with nothing kept writes nothing more (and reads back as nothing kept).
    plain = dataclasses.replace(decisions[0], kept={})
    assert "kept" not in plain.to_json()
    assert IntervalRecord.from_bytes(dataclasses.replace(
        record, decisions=[plain]).to_bytes()).decisions[0].kept == {}


def _steady(guard, snap, flipper):
    """Two rounds: a first grow and a return the guard keeps; the snapshot after them."""
    _, decisions, snap = _rounds(snap, flipper, guard, 3)
    assert decisions[-1].kept  # the guard is engaged
    return snap


def test_an_arrival_or_a_departure_lets_the_policy_change_counts_again():
    flipper = Flipper({"a": FLIP})
    guard = CycleGuard()
    snap = _steady(guard, make_snapshot([job("a"), job("b", model="dssm")]), flipper)
    arrived = dataclasses.replace(snap, jobs=[*snap.jobs, job("c", model="dssm", arrival=5)])
    decision = run_served_round(arrived, flipper, LB, None, guard)
    assert decision.counts("a") == (1, 1) and not decision.kept

    guard = CycleGuard()
    snap = _steady(guard, make_snapshot([job("a"), job("b", model="dssm")]), flipper)
    departed = dataclasses.replace(snap, jobs=[j for j in snap.jobs if j.name != "b"])
    decision = run_served_round(departed, flipper, LB, None, guard)
    assert decision.counts("a") == (1, 1) and not decision.kept

    guard = CycleGuard()  # a node more (the cluster changed)
    snap = _steady(guard, make_snapshot([job("a"), job("b", model="dssm")]), flipper)
    grown = dataclasses.replace(snap, node_names=[*snap.node_names, "n9"],
                                capacity=np.vstack([snap.capacity, snap.capacity[:1]]))
    decision = run_served_round(grown, flipper, LB, None, guard)
    assert decision.counts("a") == (1, 1) and not decision.kept


def test_a_first_grow_and_a_job_holding_nothing_are_never_held_back():
    # a grows to counts it never held (1,1) -> (2,1) -> (2,2) -> (3,2): every one a first.
    climb = Flipper({"a": {(1, 1): (2, 1), (2, 1): (2, 2), (2, 2): (3, 2), (3, 2): (3, 2)}})
    seen, decisions, _ = _rounds(make_snapshot([job("a")]), climb, CycleGuard(), 4)
    assert [r["a"] for r in seen] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    assert not any(d.kept for d in decisions)

    # b runs, and the policy stops it, back to nothing, as it was: kept running instead.
    stop_start = Flipper({"b": {(1, 1): (0, 0), (0, 0): (1, 1)}})
    guard = CycleGuard()
    seen, decisions, snap = _rounds(make_snapshot([job("b")]), stop_start, guard, 3)
    assert [r["b"] for r in seen] == [(1, 1), (1, 1), (1, 1)]
    assert decisions[1].kept == {"b": ((1, 1), (0, 0))}
    # Stopped all the same (here by hand: an admission step, a fallback round), it holds
    # nothing: starting it again returns it to counts it held, and is never held back.
    stopped = as_decided(snap, Decision(jobs={}))
    decision = run_served_round(stopped, stop_start, LB, None, guard)
    assert decision.counts("b") == (1, 1) and not decision.kept


def test_a_job_a_round_stops_and_an_admission_step_restarts_is_kept_running():
    """The round/admission loop (the e2e guard test's chic, 1 run in 10): a learned round sends
    a running job to nothing, nobody takes its tasks, the admission step before the next round
    starts it again, and the next round stops it again. Rounds then never see the job holding
    nothing, so before the guard remembered what it let a round decide, it kept nothing and
    the job restarted every round for good."""
    stop_start = Flipper({"b": {(1, 1): (0, 0), (0, 0): (1, 1)}})
    running = as_decided(make_snapshot([job("b")]), run_served_round(
        make_snapshot([job("b")]), stop_start, LB, None, None))
    guard = CycleGuard()  # what it remembered is gone (a change of context), b running
    first = run_served_round(running, stop_start, LB, None, guard)
    assert first.counts("b") == (0, 0) and not first.kept  # nothing to go by yet
    # An admission step restarts b where it was; the next round would stop it again: kept.
    again = run_served_round(running, stop_start, LB, None, guard)
    assert again.counts("b") == (1, 1) and again.kept == {"b": ((1, 1), (0, 0))}
    assert list(again.jobs["b"].worker_nodes) == list([j for j in running.jobs if j.name == "b"][0].worker_nodes)


def test_kept_tasks_never_take_capacity_the_round_gave_another_job():
    """On one 8-CPU node a holds 2 PS + 1 worker; the round shrinks it to 1 PS and starts w on
    the room it left. Keeping a's 2 PS would not fit beside w, so the decision stands."""
    demand = np.array([2.0, 0.0, 4.0])
    a = job("a", ps_demand=demand, worker_demand=np.array([2.0, 1.0, 8.0]))
    w = job("w", model="dssm", arch="allreduce", arrival=1, worker_demand=np.array([4.0, 1.0, 8.0]))
    flipper = Flipper({"a": {(1, 1): (2, 1), (2, 1): (1, 1)},
                       "w": {(0, 0): (0, 0)}})
    guard = CycleGuard()
    snap = make_snapshot([a, w], nodes=1)
    _, decisions, snap = _rounds(snap, flipper, guard, 2)  # a: (1,1), then (2,1)
    assert decisions[-1].counts("a") == (2, 1) and decisions[-1].counts("w") == (0, 0)
    flipper.table["w"] = {(0, 0): (0, 1), (0, 1): (0, 1)}  # w wants in as a shrinks back
    decision = run_served_round(snap, flipper, LB, None, guard)
    assert decision.counts("w") == (0, 1) and decision.counts("a") == (1, 1)
    assert not decision.kept


def test_two_jobs_trading_a_task_are_both_kept():
    """a shrinks where w starts, then a grows back where w stops: the cycle DL² showed after
    a burst (bench_settling seed 2). Kept together: a keeps less and w keeps its start."""
    a = job("a", ps_demand=np.array([2.0, 0.0, 4.0]), worker_demand=np.array([2.0, 1.0, 8.0]))
    w = job("w", model="dssm", arch="allreduce", arrival=1, worker_demand=np.array([4.0, 1.0, 8.0]))
    flipper = Flipper({"a": {(1, 1): (2, 1), (2, 1): (1, 1)},
                       "w": {(0, 0): (0, 1), (0, 1): (0, 0)}})
    guard = CycleGuard()
    snap = make_snapshot([a, w], nodes=1)
    snap = as_decided(snap, run_served_round(snap, Flipper({"a": FLIP, "w": {(0, 0): (0, 0)}}),
                                             LB, None, guard))  # a (1,1), w waits
    snap = as_decided(snap, run_served_round(snap, Flipper({"a": FLIP, "w": {(0, 0): (0, 0)}}),
                                             LB, None, guard))  # a (2,1)
    seen, decisions, _ = _rounds(snap, flipper, guard, 4)
    assert seen[0] == {"a": (1, 1), "w": (0, 1)}  # a shrinks, w starts (no return yet)
    assert seen[1:] == [{"a": (1, 1), "w": (0, 1)}] * 3
    assert decisions[1].kept == {"a": ((1, 1), (2, 1)), "w": ((0, 1), (0, 0))}


def test_the_simulator_runs_learned_rounds_through_the_same_guard():
    trace = [TraceJob(name=f"j{i}", model="resnet-50", arch="ps", arrival_s=0.0, epochs=500.0)
             for i in range(2)]
    flipper = Flipper({"j0": FLIP, "j1": FLIP})
    for guarded in (False, True):
        sim = Simulator(trace, SimConfig(nodes=4, cycle_guard=guarded, max_slots=6,
                                         admission="interval"))
        sim.run(flipper, LB)
        assert (sim.cycle_guard is not None) == guarded
        if guarded:
            assert sim.cycle_guard.kept_total > 0
    # A heuristic's simulated rounds are not guarded (the operator settles those instead).
    sim = Simulator(trace, SimConfig(nodes=4, max_slots=3, admission="interval"))
    sim.run(registry.make_allocation("drf"), LB)
    assert sim.cycle_guard is not None and sim.cycle_guard.kept_total == 0
