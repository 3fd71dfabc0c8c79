"""Order-based allocation heuristics: fixed, FIFO and SRTF.

FIFO and SRTF (DL² §7) take jobs in their order and give each job worker(+PS) bundles up to
its cap before the next job gets any. When a job cannot grow (its cap, or no node fits) we
move on to the next job rather than ending the round, so a small job can use what a big one
could not. SRTF orders by remaining *time* (remaining epochs over the estimated speed), as in
the scheduling literature, not by the fraction of epochs left as the DL² code does.
"""

from __future__ import annotations

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.policies.speed_estimate import ObservedSpeed, SpeedEstimator


def fill_in_order(jobs: list[JobView], ledger: Ledger) -> None:
    for job in jobs:
        while ledger.grow_bundle(job):
            pass


class Fixed:
    """The counts the user asked for (the trace's workers/ps), all or nothing, in arrival order."""

    name = "fixed"
    learned = False

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        for job in snapshot.jobs:
            workers = job.requested_workers or max(job.min_workers, 1)
            ps = (job.requested_ps if job.requested_ps is not None else max(job.min_ps, 1)) if job.uses_ps else 0
            ledger.grant(job, ps, workers)


class FIFO:
    name = "fifo"
    learned = False

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        fill_in_order(sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.name)), ledger)


class SRTF:
    name = "srtf"
    learned = False

    def __init__(self, estimator_factory=ObservedSpeed):
        self.estimator_factory = estimator_factory

    def remaining_time(self, job: JobView, est: SpeedEstimator) -> float:
        # Time left if the job ran with one bundle: a fixed reference, so the order does not
        # depend on how many tasks the job happens to hold now.
        speed = est.epochs_per_s(job, 1 if job.uses_ps else 0, 1)
        return job.remaining_epochs / speed if speed > 0 else float("inf")

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        est = self.estimator_factory(snapshot)
        order = sorted(snapshot.jobs, key=lambda j: (self.remaining_time(j, est), j.arrival_s, j.name))
        fill_in_order(order, ledger)
