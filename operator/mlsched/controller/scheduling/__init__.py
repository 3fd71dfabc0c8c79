"""The scheduling step: one SchedulingPolicy's rounds and admission steps, and the operator-wide
state (`Runtime`) they run on. Imports any subpackage below it (not `progress/` or `app/`).
A new policy goes in `mlsched.policies` (docs/architecture.md, "Adding a
policy"); a new status field a round writes goes in reporting.py (pool_steps.py for groups),
written through `kube/status_writer.py`, with its model in `mlsched.api`.

    cluster_state.py the cluster as the indexes show it, and what others hold in it    pure
    snapshot.py      index records → cluster.Snapshot: what one policy's round sees  pure
    cluster_fit.py   the nodes the operator places on: why a job can never fit        pure
    displacement.py  tasks whose decided node no longer takes them, placed again
    fair_share.py    GPUs shared between policies that draw on the same nodes
    indexes.py       the kopf indexes as the operator reads them (Indexes), values/flatten
    books.py         small in-memory books: placements, reservations, wake-ups, restarts
    state.py         the in-memory state by owner (PodBooks, JobState, ClusterView,
                     Scheduling), each with its forget_job
    runtime.py       operator-wide state (Runtime): the process (config, metrics,
                     leadership), the API, models, pod settings, the background writers
                     (ApiWriters) and the owners of state.py
    pools.py         grouping in the cluster: pool names, labels, affinity, status  pure
    pool_steps.py    a round's grouping work: labels, job pools, status.groups, Events
    waiting.py       why a job the policy did not admit still waits
    domain.py        ModelInDomain: the round against the served models' domains   pure
    guard.py         the regret guard: closed intervals judged over a rolling window
    grouping_guard.py harmony against isolated and none by rollouts, the co-location error
    conservation.py  work conservation over rounds: status, Ready reason, Events   pure
    reporting.py     what a round tells the world: Events and status writes
    step_jobs.py     the jobs a step decides: reservations, edited specs, displaced tasks,
                     children ready, the policy's job counts
    policy_view.py   what one policy's step sees: its snapshot, its jobs held as decided
    step.py          the step engine: snapshot → decide (one fallback path) → book → plan →
                     apply → Events, and the jobs' status after a step
    rounds.py        a round: intervals closed and opened, dataset, guard, policy status
    admitting.py     an admission step: waiting, re-decided and displaced jobs
    loop.py          the loop around them: rounds on time, admission steps on wake-ups
"""
