"""A steady cluster costs the API server only the interval records: a round with nothing to
change writes one status patch per job (its history entry), one for the policy, and one
dataset write (the interval's record appended to the policy's dataset segment, a patch, or a
create when a segment starts: controller/dataset/dataset.py), and nothing else: no StatefulSet, pod,
Event or lifecycle write. Counted with the operator's own `mlsched_api_requests_total`."""

from __future__ import annotations

import re

from job_state import placed_as_decided, placement_problems
from mlsched_objects import mljob, phase, scheduling_policy
from waiting import wait_for

JOBS = [f"steady-{i}" for i in range(5)]
SAMPLE = re.compile(r'^mlsched_api_requests_total\{resource="([^"]+)",verb="([^"]+)"\} (\S+)$')


def requests(operator) -> dict[tuple[str, str], float]:
    out = {}
    for line in operator.metrics().splitlines():
        if match := SAMPLE.match(line):
            out[(match.group(2), match.group(1))] = float(match.group(3))
    return out


def test_steady_rounds_write_nothing_but_the_interval_records(mlsched, operator):
    # 600 s intervals, a round every 3 s at the e2e interval scale: what is counted is writes
    # per round, whatever a round's length (at the default 1200 s the five rounds waited took
    # 30 of the test's 34 s).
    mlsched.create(scheduling_policy("default", interval=600))
    for name in JOBS:
        mlsched.create(mljob(name, ps=(1, 1), workers=(1, 1), epochs=1e9))
    wait_for(lambda: all(placed_as_decided(mlsched, n) and phase(mlsched.job(n)) == "Running"
                         for n in JOBS), 120, "every job to run",
             describe=lambda: {n: placement_problems(mlsched, n) for n in JOBS})

    def round_number() -> int:
        rewards = (mlsched.policy("default").get("status") or {}).get("rewards") or []
        return rewards[-1]["interval"] if rewards else -1

    # Settled: two more rounds with nothing to change, then count over the next three.
    start = round_number()
    wait_for(lambda: round_number() >= start + 2, 60, "the cluster to settle")
    first, before = round_number(), requests(operator)
    wait_for(lambda: round_number() >= first + 3, 60, "three steady rounds")
    last, after = round_number(), requests(operator)
    rounds = last - first
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    writes = {key: n for key, n in delta.items() if key[0] not in ("get", "list") and n}
    print(f"{rounds} steady rounds, {len(JOBS)} jobs: writes {writes}")
    assert set(writes) <= {("patch", "mljobs/status"), ("patch", "schedulingpolicies/status"),
                           ("create", "configmaps"), ("patch", "configmaps")}, writes
    # One dataset write per closed interval (a heuristic's record is written once, when it
    # closes, into the policy's segment).
    dataset = writes.get(("create", "configmaps"), 0) + writes.get(("patch", "configmaps"), 0)
    assert dataset <= rounds + 1, writes
    # One record per job per round (a round closing may straddle the reading: one more)...
    assert writes.get(("patch", "mljobs/status"), 0) <= len(JOBS) * (rounds + 1), writes
    # ...and they are counted: the count is not empty for want of a metric.
    assert writes.get(("patch", "mljobs/status"), 0) >= len(JOBS) * (rounds - 1), writes
    assert writes.get(("patch", "schedulingpolicies/status"), 0) <= rounds + 1, writes
