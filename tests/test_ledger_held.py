"""Booking held tasks in bulk (Ledger.book_held) leaves exactly the state that booking them
one by one (Ledger.book) leaves, to the last bit: an admission step's free capacity, load and
totals decide where its new tasks go, so a float that differs could change a decision."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import job
from mlsched.cluster import demand_facts
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobDecision, Snapshot


class _Nowhere:
    def choose_node(self, ledger, job, role, demand):
        return None


def _snapshot(nodes: int, rng: np.random.Generator, budget: bool) -> Snapshot:
    # capacities and demands that binary floats do not hold exactly: order shows in the bits
    cap = np.column_stack([rng.choice([7.3, 8.0, 12.1], nodes), rng.choice([2.0, 3.0], nodes),
                           rng.choice([48.0, 47.7], nodes)])
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(nodes)], cap, [],
                    budget=np.array([1e6, 1e6, 1e6, np.inf, np.inf, 1e6]) if budget else None,
                    counted_free={"pods": np.full(nodes, 1e6)})


def _held(rng: np.random.Generator, nodes: int, jobs: int, odd_every: int) -> list:
    """Random running jobs: a few demands shared by many jobs (as in a round), some jobs
    with a per-task rule (counted resources, exclusive tokens) between them."""
    demands = [np.array([0.1, 0.0, 1.7]), np.array([1.3, 1.0, 3.3]), np.array([0.7, 0.5, 2.9])]
    held = []
    for k in range(jobs):
        kw = {}
        if odd_every and k % odd_every == 1:
            kw = ({"counted": {"worker": (("pods", 1.0),), "ps": (("pods", 1.0),)}} if k % 2
                  else {"exclusive": {"worker": frozenset({"port-80"})}})
        ps_d, w_d = demands[rng.integers(3)], demands[rng.integers(3)]
        if rng.random() < 0.2:  # a demand of its own
            w_d = np.round(rng.uniform(0.1, 1.9, 3), 3)
        arch = "allreduce" if rng.random() < 0.2 else "ps"
        view = job(f"j{k}", arch=arch, ps_demand=ps_d, worker_demand=w_d, **kw)
        ps_nodes = [] if arch == "allreduce" else rng.integers(nodes, size=rng.integers(1, 5)).tolist()
        held.append((view, JobDecision(ps_nodes, rng.integers(nodes, size=rng.integers(0, 9)).tolist())))
    return held


def _state(ledger: Ledger) -> tuple:
    return (ledger._free_t.tobytes(), ledger.free_total.tobytes(), ledger.load.tobytes(),
            ledger.node_version.tolist(), ledger.tasks_on, ledger.job_changes,
            {n: (d.ps_nodes, d.worker_nodes) for n, d in ledger.jobs.items()},
            None if ledger.budget is None else ledger.budget.tobytes(),
            {k: v.tobytes() for k, v in ledger.counted_free.items()},
            {k: v.tolist() for k, v in ledger._holders_of.items()})


def _book_one_by_one(ledger, held):
    for view, d in held:
        for role, nodes in (("ps", d.ps_nodes), ("worker", d.worker_nodes)):
            for node in nodes:
                ledger.book(view, role, node)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [False, True])
@pytest.mark.parametrize("odd_every", [0, 5])
def test_held_tasks_booked_in_bulk_leave_the_state_booking_them_one_by_one_leaves(seed, budget, odd_every):
    rng = np.random.default_rng(seed)
    snap = _snapshot(23, rng, budget)
    held = _held(rng, 23, 40, odd_every)
    one_by_one, bulk = Ledger(snap, _Nowhere()), Ledger(snap, _Nowhere())
    one_by_one.book(held[0][0], "worker", 3)  # something booked before, as _restore does
    bulk.book(held[0][0], "worker", 3)
    _book_one_by_one(one_by_one, held)
    bulk.book_held(held)
    assert _state(bulk) == _state(one_by_one)
    assert np.array_equal(snap.capacity, _snapshot(23, np.random.default_rng(seed), budget).capacity)


def test_bulk_booking_matches_past_the_demands_given_a_load_vector(monkeypatch):
    # beyond LOAD_VECTORS distinct demands the load steps are kept node by node (a dict)
    monkeypatch.setattr(demand_facts, "LOAD_VECTORS", 1)
    rng = np.random.default_rng(9)
    snap = _snapshot(11, rng, budget=False)
    held = _held(rng, 11, 30, odd_every=0)
    one_by_one, bulk = Ledger(snap, _Nowhere()), Ledger(snap, _Nowhere())
    _book_one_by_one(one_by_one, held)
    bulk.book_held(held)
    assert _state(bulk) == _state(one_by_one)
