"""Harmony placement's tokens: one per job in the cluster, one per node, for one task to place.

The paper (Bao et al., ToN 2022, §V-A; digest shared/research/seed-harmony-placement.md §2.1)
gives each concurrent job (new and running) one token and flattens the servers' free
resources into it, which fixes the number of servers a model serves. Here the servers are
tokens of their own, so one trained model places on any number of nodes (issue 15):

job token (JOB_FEATURES), every job of the snapshot, in arrival order:
  model one-hot over the catalog's models, then "other" (a model the catalog lacks) |
  all-reduce flag | workers and PS requested (÷8, ÷4) | worker and PS demand (cpu ÷ 8,
  gpu ÷ 2, mem ÷ 48: the reference node) | workers and PS placed so far (this round's ledger,
  ÷8, ÷4) | new (held nothing last interval) | current (the job whose task is being placed)
node token (NODE_FEATURES), every node:
  free share of cpu, gpu, mem | cpu cores ÷ 8 | tasks of other jobs on it by model (÷4, the
  job one-hot's order) | the current job's workers and PS on it (÷4) | all tasks on it (÷8)
role: 1 for a PS, 0 for a worker
mask: the nodes the task fits on (and its pool allows)

The network (policy_models/harmony/networks.py) reads these and returns one probability per
node. The role of the task and the order of tasks come from the allocation phase's grants
(the ledger's gang rule places a job's starting PS and workers together): where the paper's
2M actions choose the task type and the server, with fixed counts the type is already known,
so the output is one score per node. Feature scales are fixed (not fitted), so the version
changes only when a feature changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.features.base import TensorSpec
from mlsched.workloads import catalog

ENCODER_VERSION = "harmony-state-v1"
MODELS = catalog.MODEL_NAMES
N_MODELS = len(MODELS) + 1  # the catalog's, then "other"
JOB_FEATURES = N_MODELS + 13
NODE_FEATURES = N_MODELS + 7
#: Dimensions that vary per call: jobs and nodes (the card's -1).
DYNAMIC = -1
_REF = np.array([8.0, 2.0, 48.0])  # the reference node (cpu, gpu, mem_gib): demand scale
_INDEX = {m: i for i, m in enumerate(MODELS)}


def model_slot(model: str) -> int:
    """The model's column in the one-hot: its catalog index, or the last ("other")."""
    if not catalog.is_known(model):
        return N_MODELS - 1
    return _INDEX.get(catalog.canonical_name(model), N_MODELS - 1)


def job_tokens(ledger: Ledger, current: str) -> tuple[np.ndarray, np.ndarray]:
    """(jobs (J, JOB_FEATURES), current one-hot (J,)) for the snapshot's jobs."""
    static, index = _static_rows(ledger.snapshot)
    if current not in index:
        raise KeyError(f"job {current!r} is not in the round's snapshot")
    out = static.copy()
    k = N_MODELS
    out[:, k + 9:k + 11] = _placed(ledger, index)
    cur = np.zeros(len(out), dtype=np.float32)
    cur[index[current]] = 1.0
    out[:, k + 12] = cur
    return out, cur


# Workers ÷ 8 and PS ÷ 4 placed so far per job, for the last ledger seen, with how many of
# its job changes they include: a round asks once per task and books one task between asks,
# so only the jobs changed since are read again. One tuple, read and replaced whole.
_placed_cache: tuple = (None, 0, None)


def _placed(ledger: Ledger, index: dict[str, int]) -> np.ndarray:
    global _placed_cache
    cached_ledger, seen, placed = _placed_cache
    if cached_ledger is ledger and placed is not None and len(placed) == len(index):
        names = set(ledger.job_changes[seen:])
        placed = placed.copy()
    else:
        names = ledger.jobs.keys()
        placed = np.zeros((len(index), 2), dtype=np.float32)
    for name in names:
        i = index.get(name)
        if i is not None:
            held = ledger.jobs.get(name)
            placed[i] = (held.workers / 8.0, held.ps / 4.0) if held is not None else (0.0, 0.0)
    _placed_cache = (ledger, len(ledger.job_changes), placed)
    return placed


# The rows that do not change within a round, for the last snapshot seen: a round asks for
# tokens once per task, and the snapshot is the same object throughout it. One tuple, read
# and replaced whole, so rounds of two policies in two threads never mix theirs.
_static_cache: tuple = (None, None, None)


def _static_rows(snapshot) -> tuple[np.ndarray, dict[str, int]]:
    global _static_cache
    cached = _static_cache
    if cached[0] is snapshot:
        return cached[1], cached[2]
    rows = np.zeros((len(snapshot.jobs), JOB_FEATURES), dtype=np.float32)
    for i, job in enumerate(snapshot.jobs):
        _fill_job(rows[i], job)
    index = {j.name: i for i, j in enumerate(snapshot.jobs)}
    _static_cache = (snapshot, rows, index)
    return rows, index


def _fill_job(row: np.ndarray, job: JobView) -> None:
    row[model_slot(job.model)] = 1.0
    k = N_MODELS
    row[k] = 1.0 if job.arch == "allreduce" else 0.0
    row[k + 1] = (job.requested_workers or job.workers or 1) / 8.0
    row[k + 2] = (job.requested_ps or job.ps or (1 if job.uses_ps else 0)) / 4.0
    row[k + 3:k + 6] = job.worker_demand / _REF
    row[k + 6:k + 9] = job.ps_demand / _REF
    # k + 9, k + 10: placed so far this round (job_tokens, from the ledger)
    row[k + 11] = 1.0 if job.workers == 0 else 0.0
    # k + 12: current (job_tokens)


def node_tokens(ledger: Ledger, current: str) -> np.ndarray:
    """(N, NODE_FEATURES) for every node of the ledger."""
    cap = ledger.capacity
    out = np.zeros((len(cap), NODE_FEATURES), dtype=np.float32)
    out[:, 0:3] = np.divide(ledger.free, cap, out=np.zeros_like(cap), where=cap > 0)
    out[:, 3] = cap[:, 0] / 8.0
    by_model, totals = _task_counts(ledger)
    out[:, 4:4 + N_MODELS] = by_model
    k = 4 + N_MODELS
    out[:, k + 2] = totals / 8.0
    held = ledger.jobs.get(current)
    if held is not None:  # the current job's own tasks are not co-tenants: move them over
        _, index = _static_rows(ledger.snapshot)
        slot = 4 + model_slot(ledger.snapshot.jobs[index[current]].model)
        for column, nodes in ((k, held.worker_nodes), (k + 1, held.ps_nodes)):
            for node in nodes:
                out[node, slot] -= 0.25
                out[node, column] += 0.25
    return out


# Tasks per node by model (÷4) and in all, for the last ledger seen, with the ledger's
# per-node versions they were counted at: a round asks once per task and books one task
# between asks, so only the nodes whose version moved are counted again. One tuple, read and
# replaced whole (rounds of two policies in two threads never mix theirs).
_count_cache: tuple = (None, None, None, None)


def _task_counts(ledger: Ledger) -> tuple[np.ndarray, np.ndarray]:
    global _count_cache
    cached_ledger, versions, by_model, totals = _count_cache
    if cached_ledger is ledger:
        nodes = np.flatnonzero(ledger.node_version != versions)
        by_model, totals = by_model.copy(), totals.copy()
    else:
        nodes = range(len(ledger.tasks_on))
        by_model = np.zeros((len(ledger.tasks_on), N_MODELS), dtype=np.float32)
        totals = np.zeros(len(ledger.tasks_on), dtype=np.float32)
    for node in nodes:
        tasks = ledger.tasks_on[node]
        row = by_model[node]
        row[:] = 0.0
        for _, model, _ in tasks:
            row[model_slot(model)] += 0.25
        totals[node] = len(tasks)
    _count_cache = (ledger, ledger.node_version.copy(), by_model, totals)
    return by_model, totals


def encode(ledger: Ledger, job: JobView, role: Role, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's feeds (batch of one) for placing one `role` task of `job`."""
    jobs, cur = job_tokens(ledger, job.name)
    return {
        "jobs": jobs[None],
        "current": cur[None],
        "role": np.array([[1.0 if role == "ps" else 0.0]], dtype=np.float32),
        "nodes": node_tokens(ledger, job.name)[None],
        "mask": mask.astype(np.float32)[None],
    }


def flat_state(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """One decision's feeds as one vector for the decision log (policies/decision_log.py):
    role | current (J) | jobs (J x JOB_FEATURES) | nodes (N x NODE_FEATURES). Within a round
    every decision has the same J and N, so a round's states stack; `unflatten` takes them
    apart again with N from the mask's width."""
    return np.concatenate([feeds["role"][0], feeds["current"][0], feeds["jobs"][0].ravel(),
                           feeds["nodes"][0].ravel()]).astype(np.float32)


def unflatten(state: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's feeds (batch of one) back from `flat_state` and the decision's node mask."""
    nodes = len(mask)
    jobs, rest = divmod(len(state) - 1 - nodes * NODE_FEATURES, JOB_FEATURES + 1)
    if rest or jobs < 1:
        raise ValueError(f"a state of {len(state)} values is not a harmony-state-v1 decision on {nodes} nodes")
    cut = 1 + jobs + jobs * JOB_FEATURES
    return {"jobs": state[1 + jobs:cut].reshape(1, jobs, JOB_FEATURES),
            "current": state[1:1 + jobs][None], "role": state[:1][None],
            "nodes": state[cut:].reshape(1, nodes, NODE_FEATURES),
            "mask": np.asarray(mask, dtype=np.float32)[None]}


class HarmonyStateEncoder:
    name = "harmony-state"
    version = ENCODER_VERSION

    def inputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        return (TensorSpec("jobs", (DYNAMIC, JOB_FEATURES)), TensorSpec("current", (DYNAMIC,)),
                TensorSpec("role", (1,)), TensorSpec("nodes", (DYNAMIC, NODE_FEATURES)),
                TensorSpec("mask", (DYNAMIC,)))

    def outputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        return (TensorSpec("probs", (DYNAMIC,)),)


ENCODER = HarmonyStateEncoder()
