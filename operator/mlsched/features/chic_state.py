"""Chic's state, actions, masks and forced void, for the first I jobs of one round.

State (Chic §2.1): one row per job slot, the first I jobs in arrival order, zero rows for
empty slots, then the backlog N (jobs beyond the first I, which get nothing this round).
The paper describes a job by {model type, remaining iterations, workers, PS}; a model-type id
cannot describe a model never seen, so a job is described model-agnostically as DL²'s v2 does:
  valid | all-reduce flag | remaining time at the reference speed (log hours) | remaining
  fraction | age (log hours) | worker and PS demand per resource (share of the cluster, x10) |
  the speed curve's shape (SpeedCurve.signature, 6) | workers, PS granted so far this round |
  what one more worker, PS or pair leads to (the largest relative speed-up per added task
  among the allocations reachable through it within the free capacity, by the job's curve
  corrected by what it showed; "Lookahead" below) | speed now over the best within its caps
then: free share per resource | backlog / I | jobs present / I.

Actions: Chic 2I+1 (2i: one more worker for job i, 2i+1: one more PS, 2I: stop); Chic-Pair
I+1 (i: a worker and a PS for job i, I: stop). Every round starts from nothing. A job's
first grant is its starting gang (1 PS + 1 worker; the ledger's rule), whichever of its
actions asked. Masked: empty slots, roles at their cap, PS actions of all-reduce jobs,
tasks that do not fit (and grants that failed), and tasks that lead to no speed-up of their
job of at least 1 % per task (Cond. 2 per action, with lookahead; starting a job always
counts); stop, while a job of the window holds nothing and could start (DL²'s rule that no
round leaves the cluster idle, per job: a job inside the window is never starved by the stop
action).
Forced void (§2.4, the set S'): the round ends without asking the network when every task is
masked: nothing fits (Cond. 1) or nothing speeds any job up (Cond. 2).
Lookahead (chic-state-v2): measured speeds are not monotone in the task counts (VGG-16 runs
1.96x its 1 PS + 1 worker speed at 4 PS, 1.86x at 5, 2.98x at 14), so "the next task does not
speed the job up" stops a job at the first dip, and v1 (one step ahead) left VGG-16 and
ResNet-50 at two thirds of their best speed. A task now counts as a speed-up when some
allocation reachable by adding tasks, this one included, that fits the free capacity (summed
over nodes: an estimate where there are several) is faster than the job is now by at least
MIN_GAIN_PER_TASK per added task. A round that stops, or runs out of room, half way through a
dip leaves the job there until the next.
Reward (§2.6): r1 = -(job-seconds in the system during the step) / 20 min, summed over an
episode -(sum of JCTs) / 20 min (episode_return). The paper's r2 (an action on an empty slot)
and r3 (a job left with workers but no PS) are 0 by construction here: empty slots are masked
and the ledger's gang rule gives every job both roles.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.features.base import TensorSpec
from mlsched.features.speed_fit import correction

ENCODER_VERSION = "chic-state-v2"
JOB_FEATURES = 23
GLOBAL_FEATURES = 5
REWARD_UNIT_S = 1200.0  # the paper's 20 minutes
_COUNT_SCALE = 16.0
_MAX_HOURS = math.log1p(48.0)
#: Cond. 2: a task is worth granting when it leads to at least this relative speed-up per
#: added task (_Lookahead). Without a floor, lookahead took jobs a dozen tasks through a dip
#: for a few per cent (Inception-BN: 16 PS + 5 workers instead of 5 + 3 for 4 % more speed),
#: which on the CPU-bound DL² clusters starved every other job (docs/chic.md, "Lookahead").
MIN_GAIN_PER_TASK = 0.01
_GRID = 32
GAIN_WORKER, GAIN_PS, GAIN_PAIR = 19, 20, 21  # columns: what one more worker, PS, pair brings


def state_dim(jobs: int) -> int:
    return jobs * JOB_FEATURES + GLOBAL_FEATURES


def n_actions(jobs: int, pair: bool) -> int:
    return (jobs if pair else 2 * jobs) + 1


class ChicEncoder:
    """params: {"jobs": I, "pair": bool}."""

    name = "chic-state"
    version = ENCODER_VERSION

    def inputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        jobs, pair = int(params["jobs"]), bool(params["pair"])
        return (TensorSpec("state", (state_dim(jobs),)), TensorSpec("mask", (n_actions(jobs, pair),)))

    def outputs(self, params: dict[str, Any]) -> tuple[TensorSpec, ...]:
        return (TensorSpec("probs", (n_actions(int(params["jobs"]), bool(params["pair"])),)),)


ENCODER = ChicEncoder()


def episode_return(jct_s: list[float] | np.ndarray) -> float:
    """Σ_t r_t over an episode: -(Σ JCT) in units of 20 minutes (r2 = r3 = 0, module doc)."""
    return -float(np.sum(jct_s)) / REWARD_UNIT_S


def first_jobs(jobs: list[JobView], window: int) -> tuple[list[JobView], int]:
    """The first I jobs in arrival order, and the backlog N beyond them."""
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    return ordered[:window], max(len(ordered) - window, 0)


def _speed_grid(curve, job: JobView) -> np.ndarray:
    """The job's speed by [ps, workers] within its caps (at most _GRID per role)."""
    max_ps = min(job.bounds("ps")[1], _GRID) if job.uses_ps else 0
    return curve.grid(max(max_ps, 0), max(min(job.bounds("worker")[1], _GRID), 0))


class _Lookahead:
    """What adding tasks can bring a job, looking past the next one: for one more worker, one
    more PS and one more pair (workers and PS added alike), the largest relative speed-up per
    added task, 1 - speed now / speed there over the tasks added, among the allocations
    reachable through that action (more tasks of either role, this one among them) that fit
    `free`. -1 when none fits. Per task, so that a long way through a dip to a few per cent
    more speed is worth less than one step to a large gain."""

    def __init__(self, job: JobView, grid: np.ndarray):
        self.grid = grid
        ps_demand = np.asarray(job.ps_demand, dtype=float) if job.uses_ps else np.zeros(3)
        worker_demand = np.asarray(job.worker_demand, dtype=float)
        self.uses_ps = job.uses_ps
        # By the PS and workers added (a cell of the grid from the counts now): their demand,
        # how many, and which actions lead through it (one more worker, PS, pair).
        more_p, more_w = np.indices(grid.shape)
        self._need = more_p[..., None] * ps_demand + more_w[..., None] * worker_demand
        self._added = more_p + more_w
        self._actions = (more_w >= 1, more_p >= 1, (more_p == more_w) & (more_w >= 1))
        self._at: dict[tuple[int, int, float], tuple] = {}  # _cells' by counts and speed now

    def _cells(self, ps: int, workers: int, now: float) -> tuple:
        """What `gains` needs at these counts, whatever is free: the grid's cells from here on
        (tasks added, none removed), the speed-up per added task of each, and where each
        action leads through them to a speed. A round asks at the same counts again at every
        grant to another job (which changes only what is free)."""
        key = (ps, workers, now)
        cells = self._at.get(key)
        if cells is None:
            there = self.grid[ps:, workers:]
            p, w = there.shape
            # Per action (worker, PS, pair), the cells it leads through where the job runs.
            through = np.stack([a[:p, :w] for a in self._actions]) & (there > 0)
            gain = None
            if not now <= 0:
                with np.errstate(divide="ignore", invalid="ignore"):  # cells no action leads to
                    gain = np.where(through, (1.0 - now / there) / self._added[:p, :w], -math.inf)
            cells = self._at[key] = (p, w, through, gain)
        return cells

    def gains(self, ps: int, workers: int, now: float, free: np.ndarray) -> tuple[float, float, float]:
        p, w, through, gain = self._cells(ps, workers, now)
        fits = np.logical_and.reduce(self._need[:p, :w] <= free + 1e-9, axis=-1)
        if gain is None:  # nothing runs now: any reachable speed is a gain
            best = [1.0 if x else -1.0 for x in np.logical_or.reduce(through & fits, axis=(1, 2)).tolist()]
        else:  # -inf (no cell) and any gain under -1 are -1
            best = [max(-1.0, x) for x in np.maximum.reduce(np.where(fits, gain, -math.inf), axis=(1, 2),
                                                            initial=-math.inf).tolist()]
        if not self.uses_ps:
            return best[0], -1.0, best[0]
        return best[0], best[1], best[2]


class ChicState:
    """State vector and mask for one round's first I jobs; `apply` grants through the ledger."""

    def __init__(self, snapshot: Snapshot, ledger: Ledger, jobs: list[JobView], window: int,
                 pair: bool, backlog: int = 0):
        if len(jobs) > window:
            raise ValueError(f"{len(jobs)} jobs do not fit a window of {window}")
        self.snapshot, self.ledger, self.jobs, self.window, self.pair = snapshot, ledger, jobs, window, pair
        self.per_job = 1 if pair else 2
        self.void = self.per_job * window
        self._failed = np.zeros(self.void + 1, dtype=bool)
        self.rng: np.random.Generator | None = None  # the round's generator, for sampling actors
        total = snapshot.total_capacity
        self._share = np.divide(10.0, total, out=np.zeros(3), where=total > 0)
        self._curves = []
        self._lookahead: list[_Lookahead] = []
        self.vector = np.zeros(state_dim(window), dtype=np.float32)
        self._rows = self.vector[: window * JOB_FEATURES].reshape(window, JOB_FEATURES)
        for i, job in enumerate(jobs):
            c = correction(job)
            curve = job.prior if c == 1.0 else job.prior.scaled(c)
            grid = _speed_grid(curve, job)
            self._curves.append((curve, float(grid.max())))
            self._lookahead.append(_Lookahead(job, grid))
            r = self._rows[i]
            ref = curve.reference_epochs_per_s()
            hours = job.remaining_epochs / ref / 3600.0 if ref > 0 else 48.0
            age_h = max(snapshot.time_s - job.arrival_s, 0.0) / 3600.0
            r[0] = 1.0
            r[1] = 0.0 if job.uses_ps else 1.0
            r[2] = min(math.log1p(hours) / _MAX_HOURS, 1.5)
            r[3] = job.remaining_epochs / job.total_epochs if job.total_epochs > 0 else 0.0
            r[4] = min(math.log1p(age_h) / _MAX_HOURS, 1.5)
            r[5:8] = np.minimum(job.worker_demand * self._share, 2.0)
            r[8:11] = np.minimum(job.ps_demand * self._share, 2.0) if job.uses_ps else 0.0
            r[11:17] = curve.signature()
        g = self.vector[window * JOB_FEATURES:]
        g[3] = min(backlog / window, 4.0)
        g[4] = len(jobs) / window
        self.refresh()

    # ---- state --------------------------------------------------------------------------
    def counts(self, i: int) -> tuple[int, int]:
        d = self.ledger.jobs.get(self.jobs[i].name)
        return (d.ps, d.workers) if d is not None else (0, 0)

    def refresh(self) -> None:
        """Recompute the dynamic columns, the free share, the mask and the improving actions."""
        total = self.snapshot.total_capacity
        free = self.ledger.free.sum(axis=0)
        self.vector[self.window * JOB_FEATURES: self.window * JOB_FEATURES + 3] = np.divide(
            free, total, out=np.zeros(3), where=total > 0)
        self._mask = np.zeros(self.void + 1, dtype=bool)
        startable = False
        for i, job in enumerate(self.jobs):
            ps, w = self.counts(i)
            curve, best = self._curves[i]
            now = curve.epochs_per_s(ps, w)
            holds = ps + w > 0
            # A job holding nothing: any action starts it (its gains are not asked).
            gains = self._lookahead[i].gains(ps, w, now, free) if holds else (1.0, 1.0, 1.0)
            r = self._rows[i]
            r[17], r[18] = w / _COUNT_SCALE, ps / _COUNT_SCALE
            r[GAIN_WORKER:GAIN_PAIR + 1] = gains
            r[22] = min(now / best, 1.5) if best > 0 else 0.0
            w_fits = self.ledger.fits_mask(job.worker_demand, job, "worker").any()
            ps_fits = not job.uses_ps or self.ledger.fits_mask(job.ps_demand, job, "ps").any()
            w_room = w < job.bounds("worker")[1]
            ps_room = job.uses_ps and ps < job.bounds("ps")[1]
            if not holds:  # any action starts the gang: both roles must fit
                ok = [w_fits and ps_fits] * self.per_job
                up = [True] * self.per_job
            elif self.pair:
                ok = [w_room and w_fits and (ps_fits and ps_room or not job.uses_ps)]
                up = [gains[2] > MIN_GAIN_PER_TASK]
            else:
                ok = [w_room and w_fits, ps_room and ps_fits]
                up = [gains[0] > MIN_GAIN_PER_TASK, gains[1] > MIN_GAIN_PER_TASK]
            for k in range(self.per_job):
                a = self.per_job * i + k
                self._mask[a] = ok[k] and up[k] and not self._failed[a]
                startable |= ok[k] and not holds and not self._failed[a]
        # Stop is masked while a job of the window holds nothing and could start.
        self._mask[self.void] = not startable

    def mask(self) -> np.ndarray:
        return self._mask.copy()

    def forced_void(self) -> bool:
        """In S': no task fits (Cond. 1) or none speeds its job up (Cond. 2): all are masked."""
        return not self._mask[:self.void].any()

    # ---- actions --------------------------------------------------------------------------
    def apply(self, action: int) -> bool:
        """Grant what `action` asks; False (and the action masked from now on) if it did not fit."""
        if action == self.void:
            return False
        i, kind = divmod(action, self.per_job)
        if i >= len(self.jobs):
            raise ValueError(f"action {action} names empty job slot {i}")
        job = self.jobs[i]
        if self.pair:
            ok = self.ledger.grow_bundle(job)
        else:
            ok = self.ledger.grow(job, "worker" if kind == 0 else "ps")
        if not ok:
            self._failed[action] = True
        self.refresh()
        return ok
