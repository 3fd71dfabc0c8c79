"""What this operator last wrote into each job's status, laid over MLJob bodies the watch
delivers before the write shows in them.

In a burst the MLJob watch runs seconds behind the operator's own status patches. The body of
a watch event from before a patch used to replace the kept body (`rt.jobs.books.job_bodies`), so the
job's lifecycle compared its pods against a status that was no longer true and decided the
same change again: a second `Running` Event and status patch for most of the 300 jobs of
bench_e2e's burst (1,609 status patches and 1,023 Events), and more load on the loop that
the jobs' phases wait for (issue 55).

A written status is kept until a watch body shows all of it (the echo of the last patch;
the watch delivers in order, so every body before it is older), or for TTL_S at most (a
watch restarted from a fresh listing may never deliver that exact body). Pure: no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from mlsched.controller.kube.status_writer import compose

JobKey = tuple[str, str]


def merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` applied to `base` as a JSON merge patch (RFC 7386): maps merge, None deletes,
    anything else (lists too) replaces."""
    out = dict(base)
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        elif isinstance(value, Mapping):
            inner = out.get(name)
            out[name] = merged(inner if isinstance(inner, Mapping) else {}, value)
        else:
            out[name] = value
    return out


def shows(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether `status` already holds everything `patch` writes."""
    for name, value in patch.items():
        if value is None:
            if status.get(name) is not None:
                return False
        elif isinstance(value, Mapping):
            inner = status.get(name)
            if not isinstance(inner, Mapping) or not shows(inner, value):
                return False
        elif status.get(name) != value:
            return False
    return True


class WrittenStatus:
    """Per job: the status written since its watch last showed all of it."""

    TTL_S = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._written: dict[JobKey, tuple[float, dict[str, Any]]] = {}

    def wrote(self, key: JobKey, status: Mapping[str, Any]) -> None:
        """A status patch of the job was accepted by the API server."""
        _, before = self._written.get(key, (0.0, {}))
        self._written[key] = (self._clock(), compose(before, status))

    def over(self, key: JobKey, body: dict[str, Any]) -> dict[str, Any]:
        """The watch's body of the job, with what was written since laid over its status
        when the body does not show it yet; the same body when it does (or nothing is kept)."""
        kept = self._written.get(key)
        if kept is None:
            return body
        at, status = kept
        current = body.get("status") or {}
        if shows(current, status) or self._clock() - at > self.TTL_S:
            del self._written[key]
            return body
        return {**body, "status": merged(current, status)}

    def forget(self, key: JobKey) -> None:
        self._written.pop(key, None)

    def __len__(self) -> int:
        return len(self._written)
