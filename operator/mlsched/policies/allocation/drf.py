"""Dominant Resource Fairness by progressive filling (Ghodsi et al., NSDI'11; DL²'s teacher).

Repeatedly give a worker(+PS) bundle to the job with the smallest dominant share (ties: the
earlier arrival). A job that cannot grow (cap reached, or no node fits its bundle) leaves the
queue and the others go on: the DL² code ends the whole round at the first failure, which
leaves room unused that smaller bundles could take.
"""

from __future__ import annotations

import heapq

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot


class DRF:
    name = "drf"
    learned = False

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        heap = [(0.0, job.arrival_s, i) for i, job in enumerate(snapshot.jobs)]
        heapq.heapify(heap)
        while heap:
            _, arrival, i = heapq.heappop(heap)
            job = snapshot.jobs[i]
            if ledger.grow_bundle(job):
                heapq.heappush(heap, (ledger.dominant_share(job), arrival, i))
