"""Jobs restricted to GPU types in the simulator (TraceJob.gpu_types, a trace's `gpu_types`
column): the node constraint the operator mirrors from an MLJob's
`spec.replicaSpecs.<role>.gpuTypes` (controller/constraints/node_constraints.py), set the same
way in the Snapshot, so a policy meets it in the simulator as in the cluster (issue 50).

The restriction is on a job's workers, the tasks that use GPUs (a parameter server runs on
CPUs, anywhere): `JobView.node_filters["worker"]`, the nodes whose type is allowed, which the
ledger keeps every worker on, and `JobView.gpu_types["worker"]`, which names it. Jobs with the
same restriction share one filter array, as the ledger's fit cache expects. Each decision is
checked against it as against node capacity: a worker on another type fails the run
(ConstraintViolated), it is not scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mlsched.workloads.traces import TraceJob


class ConstraintViolated(RuntimeError):
    pass


class GpuRestrictions:
    def __init__(self, trace: Sequence[TraceJob], node_types: Sequence[str] | None):
        restricted = [j for j in trace if j.gpu_types]
        if restricted and node_types is None:
            raise ValueError(f"job {restricted[0].name} restricts its GPU types "
                             f"({'|'.join(restricted[0].gpu_types)}) but the cluster's nodes have "
                             f"none: give them types (--gpu-types v100:4,p100:4,k80:4)")
        self.types = tuple(node_types) if node_types is not None else ()
        self._filters: dict[tuple[str, ...], np.ndarray] = {}
        for job in restricted:
            if not self.filter(job.gpu_types).any():
                raise ValueError(f"job {job.name} may use GPU types {'|'.join(job.gpu_types)}, "
                                 f"which no node of the cluster has (its types: "
                                 f"{', '.join(sorted(set(self.types)))})")

    def filter(self, allowed: tuple[str, ...]) -> np.ndarray:
        """The nodes whose type is in `allowed` (one shared array per restriction)."""
        found = self._filters.get(allowed)
        if found is None:
            found = self._filters[allowed] = np.array([t in allowed for t in self.types], dtype=bool)
        return found

    def view_fields(self, job: TraceJob) -> dict:
        """JobView keyword arguments for `job`: its workers' node filter and types, or none."""
        if not job.gpu_types:
            return {}
        return {"node_filters": {"worker": self.filter(job.gpu_types)},
                "gpu_types": {"worker": job.gpu_types}}

    def check(self, job: TraceJob, worker_nodes: Sequence[int]) -> None:
        if not job.gpu_types:
            return
        allowed = self.filter(job.gpu_types)
        for node in worker_nodes:
            if not allowed[node]:
                raise ConstraintViolated(f"job {job.name} has a worker on node-{node}, of GPU type "
                                         f"{self.types[node]}, outside its types "
                                         f"{'|'.join(job.gpu_types)}")
