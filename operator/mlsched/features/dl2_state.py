"""DL²'s state, action space and masks, for one window of up to J jobs in one round.

State (DL² §3.1, extended where noted), one row of JOB_FEATURES per job slot in arrival order,
zero rows for empty slots, then GLOBAL_FEATURES:
  job type one-hot over the catalog | all-reduce flag | slots run | remaining fraction of
  epochs | remaining time at the reference speed (log hours) | dominant share granted so far
  this round (scaled by the node count) | workers, PS granted so far this round | workers, PS held last interval |
  arrival rank in the window | valid
  The paper leaves cluster capacity out of the state; we add the free share of each resource,
  the cluster size and the backlog beyond the window, so one model can serve 13 to 500 nodes.
Actions: 3J+1. Action 3i+k grows job i: k=0 one worker, k=1 one PS, k=2 one worker and one
PS (a bundle); action 3J stops the round. Masked: empty slots, roles at their cap, PS actions
for all-reduce jobs, tasks no node can hold, and for a job holding nothing yet everything but
the bundle (its first grant is its starting gang). Stopping is masked while no job of the
window holds a task and one could: a round never leaves a window idle when it need not, so
no policy can starve the whole cluster.
"""

from __future__ import annotations

import math

import numpy as np

from mlsched.cluster.packing import Packer
from mlsched.cluster.types import JobView, Snapshot
from mlsched.workloads import catalog, speed_table

ENCODER_VERSION = "dl2-state-v1"
N_TYPES = len(catalog.MODEL_NAMES)
JOB_FEATURES = N_TYPES + 11
GLOBAL_FEATURES = 6
WORKER, PS, BUNDLE = 0, 1, 2
_COUNT_SCALE = 16.0
_MAX_HOURS = math.log1p(48.0)

# Column offsets inside a job row.
_ALLREDUCE = N_TYPES
_SLOTS = N_TYPES + 1
_REMAIN_FRAC = N_TYPES + 2
_REMAIN_TIME = N_TYPES + 3
_SHARE = N_TYPES + 4
_WORKERS = N_TYPES + 5
_PS = N_TYPES + 6
_PREV_WORKERS = N_TYPES + 7
_PREV_PS = N_TYPES + 8
_RANK = N_TYPES + 9
_VALID = N_TYPES + 10  # always the last column: networks find occupied rows by it


def state_dim(window: int) -> int:
    return window * JOB_FEATURES + GLOBAL_FEATURES


def n_actions(window: int) -> int:
    return 3 * window + 1


def _reference_hours(job: JobView) -> float:
    rate = speed_table.table_speed(job.model, 1, 1) / catalog.MODELS[job.model].steps_per_epoch
    return job.remaining_epochs / rate / 3600.0 if rate > 0 else 48.0


class WindowState:
    """The state vector and mask for one window, updated in place as tasks are granted.

    A round asks for a mask and applies a grant a few hundred times, so both are kept
    incremental: a grant changes one job's row, and capacity only on the nodes it used (it
    never grows within a round). Which distinct task demands still fit somewhere is tracked
    with a witness node per demand, rechecked only when a grant touched that node.
    """

    def __init__(self, snapshot: Snapshot, packer: Packer, jobs: list[JobView], window: int,
                 backlog: int = 0):
        if len(jobs) > window:
            raise ValueError(f"{len(jobs)} jobs do not fit a window of {window}")
        self.snapshot, self.packer, self.jobs, self.window = snapshot, packer, jobs, window
        self.void = 3 * window
        self._nodes = max(len(snapshot.node_names), 1)
        self._failed = np.zeros(n_actions(window), dtype=bool)  # tried this round and did not fit
        self._any_failed = False
        self.vector = np.zeros(state_dim(window), dtype=np.float32)
        rows = self.vector[: window * JOB_FEATURES].reshape(window, JOB_FEATURES)
        self._rows = rows
        cap = snapshot.total_capacity
        self._cap_or_inf = np.where(cap > 0, cap, np.inf)  # x / inf = 0 where a resource is absent
        total = snapshot.total_capacity
        self._inv_total = np.divide(1.0, total, out=np.zeros(3), where=total > 0)
        self._index_demands()
        for i, job in enumerate(jobs):
            r = rows[i]
            r[catalog.model_index(job.model)] = 1.0
            r[_ALLREDUCE] = 0.0 if job.uses_ps else 1.0
            r[_SLOTS] = min(job.slots_run, 50) / 50.0
            r[_REMAIN_FRAC] = job.remaining_epochs / job.total_epochs if job.total_epochs > 0 else 0.0
            r[_REMAIN_TIME] = min(math.log1p(_reference_hours(job)) / _MAX_HOURS, 1.5)
            r[_PREV_WORKERS] = job.workers / _COUNT_SCALE
            r[_PREV_PS] = job.ps / _COUNT_SCALE
            r[_RANK] = i / window
            r[_VALID] = 1.0
            self._refresh_job(i)
        g = self.vector[window * JOB_FEATURES:]
        g[3] = math.log2(max(len(snapshot.node_names), 1)) / 10.0
        g[4] = len(jobs) / window
        g[5] = min(backlog / window, 4.0)
        self._refresh_free()
        self._fits = self._fits_any_node()

    # ---- state updates --------------------------------------------------------------------
    def _refresh_job(self, i: int) -> None:
        job, r = self.jobs[i], self._rows[i]
        d = self.packer.jobs.get(job.name)
        w, ps = (d.workers, d.ps) if d is not None else (0, 0)
        # Dominant share in units of 8 nodes' worth (16 GPU bundles): the raw share shrinks
        # with the cluster (one bundle is 4 % of 13 nodes, 0.1 % of 500) and would vanish.
        # (Packer.dominant_share's arithmetic, on the demands cached for this window.)
        share = max((ps * p + w * q) * t for p, q, t in self._share_terms[i])  # plain floats: 3 values
        r[_SHARE] = share * self._nodes / 8.0
        r[_WORKERS] = w / _COUNT_SCALE
        r[_PS] = ps / _COUNT_SCALE
        self._w[i], self._ps[i] = w, ps
        self._has[i] = w + ps > 0
        self._w_room[i] = w < self._max_w[i]
        self._ps_room[i] = ps < self._max_ps[i] and self._uses_ps[i]

    def _refresh_free(self) -> None:
        g = self.vector[self.window * JOB_FEATURES:]
        g[:3] = self.packer.free.sum(axis=0) / self._cap_or_inf

    # ---- masks ------------------------------------------------------------------------------
    def _index_demands(self) -> None:
        """Map each job's worker and PS demand (and pool) to a few distinct keys, so a mask
        costs one capacity check per distinct demand, not per job."""
        keys: dict[tuple, int] = {}
        self._demands: list[tuple[np.ndarray, JobView]] = []

        def key_of(job: JobView, role: str) -> int:
            demand = self.packer.demand(job, role)
            k = (demand.tobytes(), job.pool)
            if k not in keys:
                keys[k] = len(self._demands)
                self._demands.append((demand, job))
            return keys[k]

        n = len(self.jobs)
        self._w = np.zeros(n, dtype=np.int64)
        self._ps = np.zeros(n, dtype=np.int64)
        self._has = np.zeros(n, dtype=bool)
        self._w_room = np.zeros(n, dtype=bool)
        self._ps_room = np.zeros(n, dtype=bool)
        self._max_w = np.array([j.bounds("worker")[1] for j in self.jobs], dtype=np.int64)
        self._max_ps = np.array([j.bounds("ps")[1] for j in self.jobs], dtype=np.int64)
        self._uses_ps = np.array([j.uses_ps for j in self.jobs], dtype=bool)
        self._no_ps = ~self._uses_ps
        inv_total = self._inv_total.tolist()
        self._share_terms = [list(zip(self.packer.demand(j, "ps").tolist(),
                                      self.packer.demand(j, "worker").tolist(), inv_total))
                             for j in self.jobs]
        self._wkey = np.array([key_of(j, "worker") for j in self.jobs], dtype=np.int64)
        self._pskey = np.array([key_of(j, "ps") for j in self.jobs], dtype=np.int64)
        self._pooled = any(j.pool is not None for _, j in self._demands)
        self._demand_matrix = np.array([d for d, _ in self._demands]).reshape(-1, 3)  # (K, 3)

    def _fits_any_node(self) -> np.ndarray:
        """For each distinct demand: does any (allowed) node have room for it? Also records
        a node with room (the witness) for each demand that fits."""
        if self._pooled:
            rooms = [self.packer.fits_mask(d, j) for d, j in self._demands]
            self._witness = np.array([int(r.argmax()) if r.any() else -1 for r in rooms], dtype=np.int64)
            return self._witness >= 0
        demands = self._demand_matrix.T  # (3, K)
        room = (self.packer.free.T[:, :, None] >= demands[:, None, :] - 1e-9).all(axis=0)  # (N, K)
        fits = room.any(axis=0)
        self._witness = np.where(fits, room.argmax(axis=0), -1)
        return fits

    def _recheck_fits(self, touched: list[int]) -> None:
        """After a grant that used `touched` nodes: capacity fell there and nowhere else, so a
        demand can stop fitting only if its witness was one of them."""
        if self._pooled:
            self._fits = self._fits_any_node()
            return
        free = self.packer.free
        hit = self._witness == touched[0]  # a grant uses one or two nodes: cheaper than np.isin
        for node in touched[1:]:
            hit |= self._witness == node
        for k in np.flatnonzero(hit):
            n = self._witness[k]
            demand = self._demand_matrix[k]
            if (free[n] >= demand - 1e-9).all():
                continue
            room = (free >= demand - 1e-9).all(axis=1)
            self._witness[k] = int(room.argmax()) if room.any() else -1
            self._fits[k] = self._witness[k] >= 0

    def mask(self) -> np.ndarray:
        n = len(self.jobs)
        worker_ok = self._fits[self._wkey]
        ps_ok = self._fits[self._pskey] | self._no_ps
        has, w_room, ps_room = self._has, self._w_room, self._ps_room
        m = np.zeros(n_actions(self.window), dtype=bool)
        per_job = m[: 3 * n].reshape(n, 3)
        per_job[:, WORKER] = has & w_room & worker_ok
        per_job[:, PS] = has & ps_room & ps_ok
        # A job holding nothing may only start (its gang); a bundle needs both roles.
        both = worker_ok & ps_ok
        per_job[:, BUNDLE] = np.where(has, w_room & ps_room & both, both)
        m[self.void] = True
        if self._any_failed:
            m &= ~self._failed
        if not has.any() and m[: self.void].any():
            m[self.void] = False
        return m

    # ---- actions ------------------------------------------------------------------------------
    def apply(self, action: int) -> bool:
        """Grant what `action` asks; False (and the action masked from now on) if it did not fit."""
        if action == self.void:
            return False
        i, kind = divmod(action, 3)
        if i >= len(self.jobs):
            raise ValueError(f"action {action} names empty job slot {i}")
        job = self.jobs[i]
        d = self.packer.jobs.get(job.name)
        held_ps, held_w = (len(d.ps_nodes), len(d.worker_nodes)) if d is not None else (0, 0)
        if kind == BUNDLE:
            ok = self.packer.grow_bundle(job)
        else:
            ok = self.packer.grow(job, "worker" if kind == WORKER else "ps")
        if ok:
            d = self.packer.jobs[job.name]
            self._refresh_job(i)
            self._refresh_free()
            self._recheck_fits(d.ps_nodes[held_ps:] + d.worker_nodes[held_w:])
        else:
            self._failed[action] = True
            self._any_failed = True
        return ok


def windows(jobs: list[JobView], window: int) -> list[list[JobView]]:
    """More jobs than J: schedule them in windows of J in arrival order (DL² §3.1)."""
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    return [ordered[k:k + window] for k in range(0, len(ordered), window)] or [[]]
