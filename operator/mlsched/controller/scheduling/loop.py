"""One SchedulingPolicy's scheduling loop (the daemon body): every `spec.interval` seconds a
round (rounds.py), and in between an admission step (admitting.py) whenever a job arrives or
capacity frees up; both run the step engine (step.py).

The policy body is read afresh every round; an edit of its spec wakes the loop for a full
round at once. Nothing in a round may stop the loop: a failing round is logged and the next
one runs on time. When the loop ends, what the runtime kept of the policy is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mlsched.controller.scheduling import reporting
from mlsched.controller.scheduling.admitting import run_policy_admission
from mlsched.controller.scheduling.rounds import run_policy_round
from mlsched.controller.scheduling.books import Wakeups
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import JobState
from mlsched.controller.scheduling.indexes import Indexes
from mlsched.controller.scheduling.step import one_version
from mlsched.controller.scheduling.step_jobs import children_exist

log = logging.getLogger("mlsched.controller.scheduling.loop")
INVALID_RETRY_SECONDS = 60.0


async def _report_failure(rt: Runtime, body: Mapping[str, Any], key: tuple[str, str],
                          err: BaseException) -> None:
    rt.process.metrics.step_failures.labels(*key, "round").inc()
    body, ref = one_version(body)
    try:
        await reporting.report_round_failure(rt, body, ref, err,
                                             rt.process.config.round_seconds(INVALID_RETRY_SECONDS))
    except Exception as report_err:  # noqa: BLE001 - the API server may be why the round failed
        log.warning("SchedulingPolicy %s/%s: cannot report the failed round: %s", *key,
                    report_err)


#: A burst of arrivals is admitted in one step: the step waits until no arrival has come for
#: ADMISSION_QUIET_S and every arrived job has its StatefulSets (a trailing debounce), but
#: never longer than ADMISSION_MAX_WAIT_S after the first, so a steady stream of arrivals is
#: still admitted every few seconds.
ADMISSION_QUIET_S = 0.25
ADMISSION_MAX_WAIT_S = 5.0


async def run_policy_forever(rt: Runtime, body: Mapping[str, Any], idx: Indexes,
                             sleep: Callable[[float], Awaitable[Any]],
                             stopped: Callable[[], bool]) -> None:
    """The daemon body: `body` is kopf's live view, so each round sees the latest spec.

    Between rounds the loop waits for its interval or a wake-up (books.Wakeups): `policy`
    (the spec was edited) runs a full round at once; `admission` runs an admission step after
    a short debounce, so a burst of arrivals is admitted together."""
    key = (body["metadata"].get("namespace"), body["metadata"]["name"])
    try:
        while not stopped():
            began = time.monotonic()
            try:
                report = await run_policy_round(rt, body, idx)
            except Exception as err:  # noqa: BLE001 - the loop must outlive any one round
                log.exception("SchedulingPolicy %s/%s: round failed", *key)
                report = None
                await _report_failure(rt, body, key, err)
            wait = report.interval_s if report else rt.process.config.round_seconds(INVALID_RETRY_SECONDS)
            while not stopped():
                left = wait - (time.monotonic() - began)
                if left <= 0:
                    break
                reasons = await _wake_or_sleep(rt.scheduling.wakeups, key, left, sleep)
                if not reasons or "policy" in reasons:
                    break
                await _quiet(rt.scheduling.wakeups, key, sleep,
                             pending=lambda: children_pending(rt.jobs, idx, key[0], key[1]))
                if "policy" in rt.scheduling.wakeups.peek(key):
                    break
                rt.scheduling.wakeups.drop(key, "admission")
                try:
                    await run_policy_admission(rt, body, idx)
                except Exception:  # noqa: BLE001
                    log.exception("SchedulingPolicy %s/%s: admission failed", *key)
                    rt.process.metrics.step_failures.labels(*key, "admission").inc()
    finally:
        # One call per owner of what was kept of the policy.
        rt.scheduling.per_policy.forget(key)
        rt.scheduling.reservations.drop_policy(key)
        rt.writers.dataset.forget(key)
        rt.scheduling.wakeups.forget(key)
        rt.models.forget(key)  # its models stay loaded only if another policy uses them
        rt.process.metrics.forget_policy(key[0], key[1])


async def _quiet(wakeups: Wakeups, key, sleep, clock: Callable[[], float] = time.monotonic,
                 pending: Callable[[], bool] = lambda: False) -> None:
    """Wait until the wake-ups stop and nothing is `pending` (a burst has ended and its jobs'
    children exist), at most ADMISSION_MAX_WAIT_S."""
    first = clock()
    seen = wakeups.signals(key)
    while True:
        await sleep(ADMISSION_QUIET_S)
        now = wakeups.signals(key)
        if (now == seen and not pending()) or clock() - first >= ADMISSION_MAX_WAIT_S:
            return
        seen = now


def children_pending(jobs: JobState, idx: Indexes, namespace: str, policy: str) -> bool:
    """A job of the policy has arrived whose StatefulSets are still being created, or whose
    pods are being checked with a dry run (preflight.py)."""
    return any(j.schedulable and (not children_exist(j, idx) or j.key in jobs.preflight.in_flight)
               for j in idx.jobs_of_policy(namespace, policy))


async def _wake_or_sleep(wakeups: Wakeups, key, seconds: float, sleep) -> set[str]:
    """Wait for a wake-up or `seconds`, whichever comes first; `sleep` also returns early when
    the daemon is stopped. The reasons of the wake-up, or an empty set."""
    wake = asyncio.ensure_future(wakeups.wait(key, seconds))
    nap = asyncio.ensure_future(sleep(seconds))
    done, pending = await asyncio.wait({wake, nap}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return wake.result() if wake in done and not wake.cancelled() else set()
