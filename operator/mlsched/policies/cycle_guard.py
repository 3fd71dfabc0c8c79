"""The cycle guard: a learned policy's rounds do not restart a job back and forth for good.

A heuristic round is decided to its fixed point (round.run_settled_round), so a round that
finds nothing new changes nothing. A learned round cannot be: each pass would infer, explore
and record again. And DL²'s state holds each job's counts of the previous interval
(features/dl2_state.py: _PREV_PS, _PREV_WORKERS), so its decision is a function of its last
one, and after some bursts that function has a cycle: a few jobs went 1 → 2 → 1 PS every round,
for good, each change a checkpoint-restart (bench_settling.py, docs/e2e.md).

The guard remembers, per job, the counts it held since anything else last changed: the
context is the nodes and what the round may use of them, the pools, and the set of jobs with
what each asks for (not their progress, which moves every interval). When the policy would
send a running job back to counts it held in that context (A → B → A), the job keeps its
current counts and nodes instead, and the Decision says so (`Decision.kept`), which the
operator writes into the allocation's decision log (decision_log.RoundDecisions.kept) for the
user and the retraining loop to see.

A job a round stops (sends to nothing) counts as holding nothing from then on, even if an
admission step starts it again before the next round sees it (`_note_stopped`): otherwise a
round that stops it and an admission step that restarts it would loop unseen.

It only suppresses oscillation, so it cannot starve a job:
- any change of context forgets everything: an arrival, a departure, a node, a new spec;
- a job holding nothing is never kept so (it starts whenever the policy starts it);
- a first grow is never held back: only a return to counts the job held in this context,
  which the policy itself took it away from (a job kept at its minimum so still runs, and
  grows at the next arrival or departure);
- the kept tasks must fit beside what the round decided for every other job, booked task by
  task as round.checked books a placement: it never takes capacity the policy gave another
  job (the job then changes as the policy decided);
- it never moves a task or changes a job's pool: it keeps what the job holds, where it is.

The operator's served round (round.run_served_round) and the simulator apply the same guard
to the same rounds: those of a learned phase, which are not settled.
"""

from __future__ import annotations

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, JobDecision, JobView, Role, Snapshot
from mlsched.policies.round import with_pools

Counts = tuple[int, int]  # (ps, workers)

#: How many earlier counts per job the guard remembers within one context: a cycle through
#: up to this many other counts (A → B → A is one) is kept from repeating.
MEMORY = 3


class CycleGuard:
    """One per decision maker (a SchedulingPolicy in the operator, a run in the simulator),
    asked once per round with what the round decided (`apply`)."""

    def __init__(self) -> None:
        self._context: tuple | None = None
        self._held: dict[str, Counts] = {}  # each job's counts when last seen
        self._earlier: dict[str, tuple[Counts, ...]] = {}  # counts it held before, oldest first
        self.kept_total = 0  # jobs kept, over all rounds (the benchmarks report it)

    def apply(self, snapshot: Snapshot, decision: Decision) -> Decision:
        """`decision` (the round's, on `snapshot`), with every job it would send back to
        counts it held in this context keeping its current ones where they fit. The same
        Decision when nobody is kept; else a new one (`decision` is not changed)."""
        self._observe(snapshot)
        cycling = [j for j in snapshot.jobs if self._returns(j, decision)]
        if cycling:
            decision = self._keep(snapshot, decision, cycling)
        self._note_stopped(snapshot, decision)
        return decision

    def remembered(self) -> dict[str, tuple[Counts, ...]]:
        """Per job, the counts it held in this context as far as remembered, oldest first,
        those of the latest snapshot seen last: what the regret guard's replay of a window
        that starts after that snapshot primes its own guard with (`primed`)."""
        return {name: (*self._earlier.get(name, ()), now) for name, now in self._held.items()}

    def primed(self, snapshot: Snapshot, earlier: dict[str, tuple[Counts, ...]]) -> "CycleGuard":
        """This guard, having seen `snapshot` (its context and every job's counts), with
        `earlier` as the counts each job held before (`remembered` of another guard, under
        the names of `snapshot`): a replay of a window goes on from where the served
        round's guard stood, not from a guard that knows nothing (sim/regret_replay.py)."""
        self._observe(snapshot)
        for name, counts in earlier.items():
            if name in self._held:
                self._earlier[name] = tuple(c for c in counts if c != self._held[name])[-MEMORY:]
        return self

    def _observe(self, snapshot: Snapshot) -> None:
        context = _context(snapshot)
        if context != self._context:  # something else changed: the policy may change anything
            self._context, self._held, self._earlier = context, {}, {}
        for j in snapshot.jobs:
            self._see(j.name, (j.ps, j.workers))

    def _see(self, name: str, now: Counts) -> None:
        last = self._held.get(name)
        if last is not None and last != now:
            earlier = [c for c in self._earlier.get(name, ()) if c not in (last, now)]
            self._earlier[name] = (*earlier, last)[-MEMORY:]
        self._held[name] = now

    def _note_stopped(self, snapshot: Snapshot, decision: Decision) -> None:
        """A running job the round stops is remembered as holding nothing, as if the next
        round had seen it so: an admission step between rounds may start it again on the
        tasks nobody took, and the next round, seeing it running as before, would stop it
        again without knowing it was a return (the round/admission loop: three chic jobs
        restarted every round for good, e2e/test_operator_guard.py). Only a stop: a grow
        or shrink the cluster failed to carry out must not read as counts held, or a
        policy's second try at a first grow would be kept back."""
        for j in snapshot.jobs:
            decided = decision.counts(j.name)
            if decided[1] == 0 and j.workers > 0:
                self._see(j.name, decided)

    def _returns(self, job: JobView, decision: Decision) -> bool:
        """Whether the decision sends this running job back to counts it held before."""
        now, decided = (job.ps, job.workers), decision.counts(job.name)
        if decided == now or decided not in self._earlier.get(job.name, ()):
            return False
        if not _running(job):
            return False  # holding nothing (or half of it): never kept so
        # Moving it to another pool is a change of its own, not a count cycle.
        return decision.pools.job_pools.get(job.name) == job.pool

    def _keep(self, snapshot: Snapshot, decision: Decision, cycling: list[JobView]) -> Decision:
        # The views as the round saw them (a time-shared pool's tasks ask a share: round.py).
        view = with_pools(snapshot, decision.pools)
        jobs = {j.name: j for j in view.jobs}
        ledger = Ledger(view, _NoPlacer(), decision.pools)
        ledger.book_held([(jobs[name], d) for name, d in decision.jobs.items() if name in jobs])
        out = dict(decision.jobs)
        unplaced = dict(decision.unplaced)
        kept: dict[str, tuple[Counts, Counts]] = {}
        # Those that keep less than they were given first: what they leave makes room for
        # those that keep more (two jobs trading a task back and forth are both kept).
        cycling.sort(key=lambda j: not _within(j, decision.counts(j.name)))
        for j in cycling:
            job = jobs[j.name]
            decided = out.get(j.name) or JobDecision()
            ledger.release(job, _tasks(decided))  # its decided tasks out, its held ones in
            held = JobDecision(list(job.ps_nodes), list(job.worker_nodes))
            booked: list[tuple[Role, int]] = []
            for role, node in _tasks(held):
                if not ledger.fits_on(ledger.demand(job, role), node, job, role):
                    break
                ledger.book(job, role, node)
                booked.append((role, node))
            else:
                out[j.name] = held
                unplaced.pop(j.name, None)
                kept[j.name] = ((job.ps, job.workers), (decided.ps, decided.workers))
                continue
            ledger.release(job, booked)  # it does not fit beside the others: as decided
            ledger.book_held([(job, decided)])
        if not kept:
            return decision
        self.kept_total += len(kept)
        return Decision(jobs=out, inferences=decision.inferences, pools=decision.pools,
                        unplaced=unplaced, kept=kept)


def _tasks(d: JobDecision) -> list[tuple[Role, int]]:
    """The (role, node) of each task, PS first, in ordinal order (how the ledger books them)."""
    return [("ps", n) for n in d.ps_nodes] + [("worker", n) for n in d.worker_nodes]


def _within(job: JobView, counts: Counts) -> bool:
    return job.ps <= counts[0] and job.workers <= counts[1]


def _running(j: JobView) -> bool:
    return j.workers > 0 and len(j.worker_nodes) == j.workers and len(j.ps_nodes) == j.ps


def _context(snapshot: Snapshot) -> tuple:
    """What, changed, lets a job's counts change freely: the nodes and what the round may
    use of them, the pools, the jobs and what each asks for. Not time, progress, speed
    observations or the counts the policy itself decided (those are what a cycle feeds on)."""
    jobs = tuple((j.name, j.model, j.arch, j.total_epochs, j.min_ps, j.max_ps, j.min_workers,
                  j.max_workers, j.requested_ps, j.requested_workers, j.pool,
                  _bytes(j.ps_demand), _bytes(j.worker_demand)) for j in snapshot.jobs)
    return (tuple(snapshot.node_names), snapshot.capacity.tobytes(),
            tuple(snapshot.node_pools or ()), tuple(sorted((snapshot.pool_shares or {}).items())),
            _bytes(snapshot.budget), jobs)


def _bytes(array) -> bytes | None:
    return None if array is None else array.tobytes()


class _NoPlacer:
    def choose_node(self, ledger, job, role, demand):  # pragma: no cover - never asked
        return None
