"""The ledger books one task in plain floats (DemandFacts.amounts) and DRF's dominant share is
taken in plain floats (issue 52: the simulator's hottest loop): both must give the doubles
the array arithmetic gave before, to the last bit, or a decision could change. And the
per-node version counts, kept as a log until read, count every book and release."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import job
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot


class _Nowhere:
    def choose_node(self, ledger, job, role, demand):
        return None


def _cluster(rng: np.random.Generator, nodes: int) -> Snapshot:
    # capacities and demands that binary floats do not hold exactly: order shows in the bits
    cap = np.column_stack([rng.choice([7.3, 8.0, 12.1], nodes), rng.choice([2.0, 3.0], nodes),
                           rng.choice([48.0, 47.7], nodes)])
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(nodes)], cap, [])


def _jobs(rng: np.random.Generator, count: int) -> list:
    out = []
    for k in range(count):
        ps_d, w_d = np.round(rng.uniform(0.01, 1.9, 3), 3), np.round(rng.uniform(0.01, 1.9, 3), 3)
        out.append(job(f"j{k}", arch="allreduce" if k % 4 == 0 else "ps", ps_demand=ps_d,
                       worker_demand=w_d, max_ps=50, max_workers=50))
    return out


def _task(rng: np.random.Generator, jobs: list):
    """A random job of `jobs` and a role it has."""
    view = jobs[rng.integers(len(jobs))]
    return view, "worker" if not view.uses_ps or rng.random() < 0.6 else "ps"


@pytest.mark.parametrize("seed", range(5))
def test_booking_and_releasing_in_floats_leaves_the_doubles_array_arithmetic_leaves(seed):
    rng = np.random.default_rng(seed)
    snap, jobs = _cluster(rng, 17), _jobs(rng, 6)
    ledger = Ledger(snap, _Nowhere())
    free = np.array(snap.capacity.T, order="C", copy=True)  # the reference, as the ledger had it
    total = free.sum(axis=1)
    versions = np.zeros(17, dtype=np.int64)
    booked = []
    for step in range(400):
        if booked and rng.random() < 0.3:  # release the newest task (its job's and role's newest)
            view, role, node = booked.pop()
            ledger.release(view, [(role, node)])
            free[:, node] += view.demand(role)
            total += view.demand(role)
        else:
            (view, role), node = _task(rng, jobs), int(rng.integers(17))
            ledger.book(view, role, node)
            free[:, node] -= view.demand(role)
            total -= view.demand(role)
            booked.append((view, role, node))
        versions[node] += 1
        if step % 37 == 0:  # read now and then: the counts are folded in when read
            assert ledger.node_version.tolist() == versions.tolist()
        assert ledger.free.T.tobytes() == free.tobytes()
        assert ledger.free_total.tobytes() == total.tobytes()
    assert ledger.node_version.tolist() == versions.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_the_dominant_share_in_floats_is_the_array_one_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    jobs = _jobs(rng, 12)
    ledger = Ledger(_cluster(rng, 40), _Nowhere())
    for _ in range(300):
        ledger.book(*_task(rng, jobs), int(rng.integers(40)))
        for other in jobs:
            assert ledger.dominant_share(other) == float(ledger.used_share(other).max())
