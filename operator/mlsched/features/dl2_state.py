"""DL²'s state, action space and masks, for one window of up to J jobs in one round.

State (DL² §3.1, extended where noted), one row of JOB_FEATURES per job slot in arrival order,
zero rows for empty slots, then GLOBAL_FEATURES. The paper describes a job by a one-hot of its
model type; that cannot schedule a model it never saw, so (v2) a job is described by what it
asks for and how it runs, model-agnostic:
  static:  all-reduce flag | slots run | remaining fraction of epochs | remaining time at the
           reference speed (log hours) | age (log hours) | worker and PS demand per resource
           (over a mean node's capacity) | the speed curve's shape: log speed-ups from more
           workers and more PS at six probe configurations (SpeedCurve.signature) | how far observation corrected the prior (log)
  dynamic: dominant share granted so far this round (scaled by the node count) | workers, PS
           granted so far | workers, PS held last interval | the speed-up one more worker, PS
           or bundle would bring (1 - speed now / speed after, the curve's estimate) | speed
           now over the best speed within the job's caps
  then:    arrival rank in the window | valid
  typed:   (only for a model trained on GPU types, encoder parameter gpu_types) the job's pace
           on the GPU types its workers run on (its slowest worker's, over a V100's; before any
           worker of this round: last interval's, else the fastest type present) and its pace
           on the fastest type present, both log10: what the job would gain from another type
           (workloads/gpu_types.py; model-agnostic like the rest: a ratio per job, not a name)
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
from operator import attrgetter
from typing import Any

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.features.base import TensorSpec
from mlsched.features.speed_fit import correction, pace, type_normalised, type_speed

ENCODER_VERSION = "dl2-state-v2"
JOB_FEATURES = 29
GLOBAL_FEATURES = 6
WORKER, PS, BUNDLE = 0, 1, 2
_COUNT_SCALE = 16.0
_MAX_HOURS = math.log1p(48.0)

# Column offsets inside a job row.
_ALLREDUCE = 0
_SLOTS = 1
_REMAIN_FRAC = 2
_REMAIN_TIME = 3
_AGE = 4
_W_DEMAND = 5  # 3 columns: cpu, gpu, mem
_PS_DEMAND = 8  # 3 columns
_SHAPE = 11  # 6 columns
_CORRECTION = 17
_SHARE = 18
_WORKERS = 19
_PS = 20
_PREV_WORKERS = 21
_PREV_PS = 22
_GAIN_WORKER = 23
_GAIN_PS = 24
_GAIN_BUNDLE = 25
_SATURATION = 26
_RANK = 27
_VALID = 28  # networks find occupied rows by it (the last column of an untyped row)
# Typed rows only (encoder parameter gpu_types): two more columns after _VALID.
_PACE = 29
_PACE_BEST = 30
TYPED_JOB_FEATURES = 31


def job_features(typed: bool = False) -> int:
    return TYPED_JOB_FEATURES if typed else JOB_FEATURES


def state_dim(window: int, typed: bool = False) -> int:
    return window * job_features(typed) + GLOBAL_FEATURES


def typed(params: dict[str, Any]) -> bool:
    """Whether a card's encoder parameters ask for the GPU-type columns (absent: untyped, as
    every model before GPU types was)."""
    value = params.get("gpu_types", False)
    if not isinstance(value, bool):
        raise ValueError(f"gpu_types must be true or false, not {value!r}")
    return value


def n_actions(window: int) -> int:
    return 3 * window + 1


class DL2Encoder:
    name = "dl2-state"
    version = ENCODER_VERSION

    def inputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        window = int(params["window"])
        return (TensorSpec("state", (state_dim(window, typed(params)),)),
                TensorSpec("mask", (n_actions(window),)))

    def outputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        return (TensorSpec("probs", (n_actions(int(params["window"])),)),)


ENCODER = DL2Encoder()


def _gain(before: float, after: float) -> float:
    """1 - before/after: the fraction of the remaining time one more task saves (negative when
    it slows the job down), clipped to [-1, 1]."""
    if after <= 0:
        return -1.0
    return max(-1.0, 1.0 - before / after)


_NO_DEMAND = np.zeros(3)


def _remaining_time(job: JobView, curve) -> float:
    """Its remaining epochs at the reference speed, in log hours over _MAX_HOURS (<= 1.5)."""
    ref = curve.reference_epochs_per_s()
    hours = job.remaining_epochs / ref / 3600.0 if ref > 0 else 48.0
    return min(math.log1p(hours) / _MAX_HOURS, 1.5)


def _best_speed(curve, job: JobView) -> float:
    return curve.best_epochs_per_s(job.bounds("ps")[1], job.bounds("worker")[1])


_LOG_PACE = math.log(10.0)


def _log_pace(pace: float) -> float:
    """A pace (relative to a V100) as log10, clipped to [-1.5, 0.5]."""
    return min(max(math.log(max(pace, 1e-3)) / _LOG_PACE, -1.5), 0.5)


class WindowState:
    """The state vector and mask for one window, updated in place as tasks are granted.

    A round asks for a mask and applies a grant a few hundred times, so both are kept
    incremental: a grant changes one job's row and its three actions, and capacity only on the
    nodes it used (it never grows within a round). Which distinct task demands still fit
    somewhere is tracked with a witness node per demand, rechecked only when a grant touched
    that node; only when a demand stops fitting anywhere are all jobs' actions recomputed.
    Per-job bookkeeping is plain Python: a step touches a handful of scalars, for which numpy
    calls cost more than they save.
    """

    def __init__(self, snapshot: Snapshot, ledger: Ledger, jobs: list[JobView], window: int,
                 backlog: int = 0, vector: np.ndarray | None = None, typed: bool = False):
        """`vector`: a float32 buffer of state_dim(window, typed) to build the state in
        (overwritten), so that a round's windows share one (an ONNX Runtime binding to it is
        made once). `typed`: the GPU-type columns (a model trained with them)."""
        if len(jobs) > window:
            raise ValueError(f"{len(jobs)} jobs do not fit a window of {window}")
        self.snapshot, self.ledger, self.jobs, self.window = snapshot, ledger, jobs, window
        self.typed = typed
        f = job_features(typed)
        self.void = 3 * window
        self._nodes = max(len(snapshot.node_names), 1)
        self._failed = np.zeros(n_actions(window), dtype=bool)  # tried this round and did not fit
        self._any_failed = False
        if vector is None:
            vector = np.zeros(state_dim(window, typed), dtype=np.float32)
        else:
            vector.fill(0.0)
        self.vector = vector
        rows = self.vector[: window * f].reshape(window, f)
        self._rows = rows
        self._free_share = self.vector[window * f: window * f + 3]
        self._free = ledger.free_by_resource  # (3, N), a live view
        cap = ledger.total
        self._cap_or_inf = np.where(cap > 0, cap, np.inf)  # x / inf = 0 where a resource is absent
        self._inv_total = np.divide(1.0, cap, out=np.zeros(3), where=cap > 0)
        self._index_demands()
        n = max(len(snapshot.node_names), 1)
        mean_node = np.where(cap > 0, cap / n, np.inf)
        # Typed: speeds seen on a slower type must not read as a slower model. Only the speed
        # correction reads the normalised copies; the ledger, the placement and the type
        # columns get the jobs as they are (their ratios may be corrected by what they showed).
        corrections = [correction(type_normalised(job) if typed else job) for job in jobs]
        self._curves = [job.prior if c == 1.0 else job.prior.scaled(c) for job, c in zip(jobs, corrections)]
        self._speed = [c.speed_function() for c in self._curves]
        self._best = [_best_speed(c, job) for c, job in zip(self._curves, jobs)]
        # The static columns, one column at a time over the window's jobs (numpy per job and
        # column cost a 10,000-job round about 60 ms).
        n, now = len(jobs), snapshot.time_s
        filled = rows[:n]
        filled[:, _ALLREDUCE] = [0.0 if job.uses_ps else 1.0 for job in jobs]
        filled[:, _SLOTS] = [min(job.slots_run, 50) / 50.0 for job in jobs]
        filled[:, _REMAIN_FRAC] = [job.remaining_epochs / job.total_epochs if job.total_epochs > 0
                                   else 0.0 for job in jobs]
        filled[:, _REMAIN_TIME] = [_remaining_time(job, curve) for job, curve in zip(jobs, self._curves)]
        filled[:, _AGE] = [min(math.log1p(max(now - job.arrival_s, 0.0) / 3600.0) / _MAX_HOURS, 1.5)
                           for job in jobs]
        filled[:, _W_DEMAND:_W_DEMAND + 3] = np.minimum(
            np.array([job.worker_demand for job in jobs]) / mean_node, 2.0)
        filled[:, _PS_DEMAND:_PS_DEMAND + 3] = np.minimum(
            np.array([job.ps_demand if job.uses_ps else _NO_DEMAND for job in jobs]) / mean_node, 2.0)
        filled[:, _SHAPE:_SHAPE + 6] = [curve.signature() for curve in self._curves]
        filled[:, _CORRECTION] = [math.log(c) / math.log(8.0) for c in corrections]
        filled[:, _PREV_WORKERS] = [job.workers / _COUNT_SCALE for job in jobs]
        filled[:, _PREV_PS] = [job.ps / _COUNT_SCALE for job in jobs]
        filled[:, _RANK] = np.arange(n) / window
        filled[:, _VALID] = 1.0
        if typed:
            self._index_types()
        held = ledger.jobs
        for i, job in enumerate(jobs):
            if job.name in held:
                self._refresh_job(i)
            else:  # holds nothing yet (most jobs of a round): what _refresh_job would write
                rows[i, _GAIN_BUNDLE] = 1.0  # the rest of the row's dynamic part is 0
                self._w_room[i] = 0 < self._max_w[i]
                self._ps_room[i] = 0 < self._max_ps[i] and self._uses_ps[i]
        g = self.vector[window * f:]
        g[3] = math.log2(max(len(snapshot.node_names), 1)) / 10.0
        g[4] = len(jobs) / window
        g[5] = min(backlog / window, 4.0)
        self._refresh_free()
        self._fits = self._fits_any_node()
        # The mask of job actions, kept in step with the flags it is built from.
        self._mask = np.zeros(n_actions(window), dtype=bool)
        self._allowed = [False] * (3 * len(jobs))
        self._n_allowed = 0
        for i in range(len(jobs)):
            self._refresh_actions(i)

    # ---- state updates --------------------------------------------------------------------
    def _refresh_job(self, i: int) -> None:
        job, r = self.jobs[i], self._rows[i]
        d = self.ledger.jobs.get(job.name)
        w, ps = (d.workers, d.ps) if d is not None else (0, 0)
        # Dominant share in units of 8 nodes' worth (16 GPU bundles): the raw share shrinks
        # with the cluster (one bundle is 4 % of 13 nodes, 0.1 % of 500) and would vanish.
        # (Ledger.dominant_share's arithmetic, on the demands cached for this window.)
        (p0, p1, p2), (q0, q1, q2) = self._ps_demand[i], self._worker_demand[i]  # plain floats
        t0, t1, t2 = self._inv_total_floats
        share = max((ps * p0 + w * q0) * t0, (ps * p1 + w * q1) * t1, (ps * p2 + w * q2) * t2)
        r[_SHARE] = share * self._nodes / 8.0
        r[_WORKERS] = w / _COUNT_SCALE
        r[_PS] = ps / _COUNT_SCALE
        speed = self._speed[i]
        now = speed(ps, w)
        if w + ps == 0:  # nothing yet: its first grant is the starting gang, a bundle
            r[_GAIN_WORKER] = r[_GAIN_PS] = 0.0
            r[_GAIN_BUNDLE] = 1.0
        else:
            r[_GAIN_WORKER] = _gain(now, speed(ps, w + 1))
            r[_GAIN_PS] = _gain(now, speed(ps + 1, w)) if self._uses_ps[i] else 0.0
            r[_GAIN_BUNDLE] = _gain(now, speed(ps + self._uses_ps[i], w + 1))
        best = self._best[i]
        r[_SATURATION] = min(now / best, 1.5) if best > 0 else 0.0
        if self.typed:
            r[_PACE] = self._pace(i)
        if w + ps > 0 and not self._has[i]:
            self._n_has += 1
        self._has[i] = w + ps > 0
        self._w_room[i] = w < self._max_w[i]
        self._ps_room[i] = ps < self._max_ps[i] and self._uses_ps[i]

    # ---- GPU types (typed rows only) -----------------------------------------------------------
    def _index_types(self) -> None:
        """Each job's pace on the fastest type present and, until this round gives it workers,
        on the types it ran on last interval (else the fastest)."""
        types = self.snapshot.gpu_types
        present = set(types) if types is not None else {None}
        self._pace_before = []
        for i, job in enumerate(self.jobs):
            best = max(type_speed(job, t) for t in present)
            before = (pace(job, (types[n] for n in job.worker_nodes if 0 <= n < len(types)))
                      if types is not None and job.worker_nodes else best)
            self._pace_before.append(before)
            self._rows[i, _PACE_BEST] = _log_pace(best)
            self._rows[i, _PACE] = _log_pace(before)

    def _pace(self, i: int) -> float:
        have = self.ledger.worker_types(self.jobs[i])
        return _log_pace(pace(self.jobs[i], have) if have else self._pace_before[i])

    def _refresh_free(self) -> None:
        self._free_share[:] = self.ledger.free_total / self._cap_or_inf

    # ---- masks ------------------------------------------------------------------------------
    def _index_demands(self) -> None:
        """Map each job's worker and PS demand (and the nodes it may use: its pool, its
        template's constraints) to a few distinct keys, so a mask costs one capacity check
        per distinct demand, not per job."""
        keys: dict[tuple, int] = {}
        self._demands: list[tuple[np.ndarray, JobView, str]] = []

        budget = self.ledger.budget is not None

        def key_of(job: JobView, role: str) -> int:
            demand = self.ledger.demand(job, role)
            if job.pool is None and not (job.node_filters or job.exclusive or job.spreads
                                         or job.counted):
                k: tuple = (demand.tobytes(),)  # the usual job: its demand says it all
            else:
                node_filter = job.node_filter(role)
                k = (demand.tobytes(), job.pool, None if node_filter is None else id(node_filter),
                     job.holds(role), tuple(id(s) for s in job.spreads.get(role, ())),
                     job.takes(role))
            if budget:
                # Under a quota two jobs of one demand may charge it differently (another
                # PriorityClass, other limits): one spent quota must not mask the other job.
                # A job whose kept pods charge their own is a key of its own.
                k += (job.name if job.kept_charges.get(role) else job.quota_charge(role).tobytes(),)
            found = keys.get(k)
            if found is None:
                found = keys[k] = len(self._demands)
                self._demands.append((demand, job, role))
            return found

        n = len(self.jobs)
        self._has = [False] * n
        self._n_has = 0
        self._w_room = [False] * n
        self._ps_room = [False] * n
        self._uses_ps = [j.uses_ps for j in self.jobs]
        self._max_w = [j.max_workers for j in self.jobs]  # JobView.bounds(role)[1]
        self._max_ps = [j.max_ps if uses_ps else 0 for j, uses_ps in zip(self.jobs, self._uses_ps)]
        # Each job's demands as plain floats (its dominant share is recomputed per grant).
        self._ps_demand = np.array([self.ledger.demand(j, "ps") for j in self.jobs]).reshape(-1, 3).tolist()
        self._worker_demand = np.array([self.ledger.demand(j, "worker")
                                        for j in self.jobs]).reshape(-1, 3).tolist()
        self._inv_total_floats = tuple(self._inv_total.tolist())
        self._wkey = [key_of(j, "worker") for j in self.jobs]
        self._pskey = [key_of(j, "ps") for j in self.jobs]
        # Some demands may use only some nodes (or, holding host ports, spread over domains
        # or taking pod slots or extended resources, only nodes where those allow one more),
        # or the round has a budget (a namespace's quota): fits are then computed through
        # the ledger.
        self._spreads = any(j.spreads.get(r) for _, j, r in self._demands)
        self._restricted = self.ledger.budget is not None or any(
            self.ledger.allowed_nodes(j, r) is not None or j.holds(r) or j.spreads.get(r)
            or j.takes(r)
            for _, j, r in self._demands)
        # The most any task of the window can charge the quotas: while what is left covers
        # it, a grant cannot have made a demand stop fitting by the budget (_recheck_restricted).
        self._charge_bound = (np.max([self.ledger.charge_bound(j, r, d) for d, j, r in self._demands],
                                     axis=0).tolist() if budget and self._demands else [])
        self._demand_matrix = np.array([d for d, _, _ in self._demands]).reshape(-1, 3)  # (K, 3)
        # What a node's free capacity must reach, per distinct demand: as a (3, 1) column to
        # scan all nodes at once, and as plain floats to check one node.
        self._need = self._demand_matrix[:, :, None] - 1e-9  # (K, 3, 1)
        self._need_floats = [tuple(t) for t in self._need[:, :, 0].tolist()]

    def _fits_any_node(self) -> list[bool]:
        """For each distinct demand: does any (allowed) node have room for it? Also records
        a node with room (the witness) for each demand that fits."""
        if self._restricted:
            rooms = [self.ledger.fits_mask(d, j, r) for d, j, r in self._demands]
            self._witness = [int(r.argmax()) if r.any() else -1 for r in rooms]
        else:
            room = (self._free[None, :, :] >= self._need).all(axis=1)  # (K, N)
            self._witness = np.where(room.any(axis=1), room.argmax(axis=1), -1).tolist()
        return [n >= 0 for n in self._witness]

    def _recheck_fits(self, touched: list[int]) -> bool:
        """After a grant that used `touched` nodes: capacity fell there and nowhere else, so a
        demand can stop fitting only if its witness was one of them. True if one stopped."""
        if self._restricted:
            return self._recheck_restricted(touched)
        free, changed = self._free, False
        for k in [k for k, node in enumerate(self._witness) if node in touched]:
            node = self._witness[k]
            c, g, m = self._need_floats[k]
            if free[0, node] >= c and free[1, node] >= g and free[2, node] >= m:
                continue
            room = (free >= self._need[k]).all(axis=0)
            self._witness[k] = int(room.argmax()) if room.any() else -1
            if self._witness[k] < 0:
                self._fits[k], changed = False, True
        return changed

    def _recheck_restricted(self, touched: list[int]) -> bool:
        """_recheck_fits through the ledger's checks (node filters, pools, a quota budget, host
        ports, counted resources). All of them only shrink as tasks are granted, on the nodes
        used (the budget: everywhere), so a demand whose witness still fits still fits, and
        one that fit nowhere never fits again; only a witness that no longer fits costs a
        scan. Spread caps can grow (a task in the emptiest domain raises the minimum): with
        any, every demand is scanned again. At 10,000 jobs under a quota, scanning every
        demand after each grant cost DL² 0.6 s a round."""
        if self._spreads:
            before, self._fits = self._fits, self._fits_any_node()
            return before != self._fits
        ledger, changed = self.ledger, False
        everywhere = ledger.budget is not None and not ledger.budget_covers(self._charge_bound)
        for k, node in enumerate(self._witness):
            if node < 0 or not (everywhere or node in touched):
                continue
            demand, job, role = self._demands[k]
            if node not in touched:
                # Only the budget fell here: while it has room the witness still fits; once
                # it has none, no node does (fits_mask would scan them all to say so).
                if ledger.budget_allows(job, role, demand):
                    continue
                self._witness[k] = -1
                self._fits[k], changed = False, True
                continue
            if ledger.fits_on(demand, node, job, role):
                continue
            room = ledger.fits_mask(demand, job, role)
            self._witness[k] = int(room.argmax()) if room.any() else -1
            if self._witness[k] < 0:
                self._fits[k], changed = False, True
        return changed

    def _refresh_actions(self, i: int) -> None:
        """Job i's three actions: roles at their cap, PS actions of all-reduce jobs, tasks no
        node can hold and failed grants are masked; a job holding nothing may only start (its
        gang, the bundle action); a bundle needs both roles."""
        worker_ok = self._fits[self._wkey[i]]
        ps_ok = self._fits[self._pskey[i]] or not self._uses_ps[i]
        has, w_room, ps_room = self._has[i], self._w_room[i], self._ps_room[i]
        flags = (has and w_room and worker_ok,
                 has and ps_room and ps_ok,
                 (w_room and ps_room and worker_ok and ps_ok) if has else (worker_ok and ps_ok))
        for a, ok in enumerate(flags, start=3 * i):
            ok = ok and not (self._any_failed and self._failed[a])
            if ok != self._allowed[a]:
                self._allowed[a] = ok
                self._mask[a] = ok
                self._n_allowed += 1 if ok else -1

    def can_grow(self) -> bool:
        """Is any job action (not stopping) unmasked? (mask()[:void].any(), without the mask.)"""
        return self._n_allowed > 0

    def mask(self, copy: bool = True) -> np.ndarray:
        """The mask now; `copy=False` hands over the live array (the next grant changes it),
        for a caller that is done with it before then."""
        # Stopping is masked while no job of the window holds a task and one could start.
        self._mask[self.void] = self._n_has > 0 or self._n_allowed == 0
        return self._mask.copy() if copy else self._mask  # training stores it per step

    # ---- actions ------------------------------------------------------------------------------
    def apply(self, action: int) -> bool:
        """Grant what `action` asks; False (and the action masked from now on) if it did not fit."""
        if action == self.void:
            return False
        i, kind = divmod(action, 3)
        if i >= len(self.jobs):
            raise ValueError(f"action {action} names empty job slot {i}")
        job = self.jobs[i]
        d = self.ledger.jobs.get(job.name)
        held_ps, held_w = (len(d.ps_nodes), len(d.worker_nodes)) if d is not None else (0, 0)
        if kind == BUNDLE:
            ok = self.ledger.grow_bundle(job)
        else:
            ok = self.ledger.grow(job, "worker" if kind == WORKER else "ps")
        if ok:
            d = self.ledger.jobs[job.name]
            self._refresh_job(i)
            self._refresh_free()
            if self._recheck_fits(d.ps_nodes[held_ps:] + d.worker_nodes[held_w:]):
                for j in range(len(self.jobs)):  # a demand fits nowhere any more: every job's actions
                    self._refresh_actions(j)
                return ok
        else:
            self._failed[action] = True
            self._any_failed = True
        self._refresh_actions(i)
        return ok


def windows(jobs: list[JobView], window: int) -> list[list[JobView]]:
    """More jobs than J: schedule them in windows of J in arrival order (DL² §3.1)."""
    ordered = sorted(jobs, key=attrgetter("arrival_s", "name"))
    return [ordered[k:k + window] for k in range(0, len(ordered), window)] or [[]]
