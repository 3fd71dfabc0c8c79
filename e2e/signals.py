"""Positive signals that the operator has acted, to wait for before asserting an absence.

A test that asserts something did not happen (a job not started, no second Event, no label
left behind) passes trivially if it asserts before the operator has even looked: a fixed
sleep is no proof that it has, on a loaded machine least of all. These helpers wait for a
signal that the operator has processed the state in question (issue 50):

- `wait_for_rounds`: rounds of a SchedulingPolicy that started after a given moment, read
  from its `status.lastRoundTime` (written by rounds only, not by admission steps);
- `wait_for_metric_growth`: a counter of the operator's /metrics grown by at least so much
  (for instance the create calls it retried);
- `model_loaded`, `round_of_generation`: a policy once a round has loaded its model, or has
  run with a given spec generation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from mlsched_objects import condition
from waiting import wait_for


def utc_now() -> str:
    """Now, as the operator writes `lastRoundTime`: RFC 3339 in UTC, to the second (such
    strings compare in time order)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def last_round(mlsched, policy: str) -> str | None:
    """The policy's `status.lastRoundTime`: the start of its latest round, or None."""
    return ((mlsched.policy(policy) or {}).get("status") or {}).get("lastRoundTime")


def wait_for_rounds(mlsched, policy: str, rounds: int = 2, *, since: str | None = None,
                    timeout: float = 60.0, interval: float = 0.25,
                    sample: Callable[[], object] | None = None) -> str:
    """Waits until `rounds` rounds of `policy` have started after `since` (a `utc_now()` taken
    before the change whose effect, or absence of one, is to be asserted; default: now), and
    returns the latest one's `lastRoundTime`. `sample`, if given, is called at every poll
    (every `interval` s): what must hold all along is sampled over those rounds.

    `lastRoundTime` is to the second, so a round counts only if it started in a later second
    than `since`: strictly after it. The first such round may have listed the cluster just
    before a watch event of the change reached the operator; the second has seen it, hence
    two by default. Rounds are counted by the distinct values polled: rounds closer together
    than the polling may be counted as one, which only makes the wait longer."""
    since = since or utc_now()
    seen: set[str] = set()

    def enough() -> str | None:
        if sample is not None:
            sample()
        stamp = last_round(mlsched, policy)
        if stamp and stamp > since:
            seen.add(stamp)
        return max(seen) if len(seen) >= rounds else None

    return wait_for(enough, timeout, f"{rounds} rounds of SchedulingPolicy {policy} started "
                    f"after {since}", interval=interval,
                    describe=lambda: {"rounds seen": sorted(seen),
                                      "lastRoundTime": last_round(mlsched, policy)})


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str, labels: str, default: float | None = 0.0) -> float | None:
    """The sample of `name{labels}` in a /metrics text; `default` when there is none. The
    labels are compared as a set (the client writes them sorted by name, whatever order they
    were declared in): 'verb="create",resource="services"' finds
    `name{resource="services",verb="create"}`."""
    wanted = dict(_LABEL.findall(labels))
    for found in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if dict(_LABEL.findall(found.group(1))) == wanted:
            return float(found.group(2))
    return default


def wait_for_metric_growth(operator, name: str, labels: str, by: float, *,
                           timeout: float = 30.0) -> float:
    """Waits until the operator's counter `name{labels}` has grown by at least `by` from what
    it is now, and returns its value then."""
    start = metric(operator.metrics(), name, labels)
    return wait_for(lambda: (v := metric(operator.metrics(), name, labels)) >= start + by and v,
                    timeout, f"{name}{{{labels}}} to grow by {by:g} from {start:g}",
                    describe=lambda: metric(operator.metrics(), name, labels))


ROUND_TIMEOUT = 60  # a round every 6 s; generous for a loaded 2-core machine


def model_loaded(mlsched, policy: str) -> dict:
    """The policy once its first round has set ModelLoaded."""
    return wait_for(lambda: condition(p := mlsched.policy(policy), "ModelLoaded") and p,
                    ROUND_TIMEOUT, f"ModelLoaded on {policy}",
                    describe=lambda: mlsched.policy(policy).get("status"))


def round_of_generation(mlsched, policy: str, generation: int) -> dict:
    """The policy once a round has run with spec `generation` (rounds record it)."""
    return wait_for(lambda: ((p := mlsched.policy(policy))["status"].get("observedGeneration")
                             == generation) and p, ROUND_TIMEOUT,
                    f"a round of {policy} with generation {generation}",
                    describe=lambda: mlsched.policy(policy)["status"])
