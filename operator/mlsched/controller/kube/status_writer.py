"""Status records written in the background: a round hands them over and goes on.

A scheduling round's status writes (each job's interval record, placement and desired counts;
the policy's reward and round summary) are queued here per object and written by one
background task, at most `concurrency` at a time and `rate` per second (a token bucket), so
deciding and scaling never wait on them and a round of 1,000 jobs does not hit the API server
with 1,000 writes at once (the queue, its slots and its retries: write_queue.py).

Nothing is dropped: a write that fails (409, 429, 5xx, the API server unreachable) is retried
with exponential backoff and jitter; whatever a later round queues for the same object meanwhile
is merged into the pending record, so there is still one patch per object. Only a patch the API
server refuses as invalid (400/422) is given up, since sending it again cannot help, and a
patch of an object that no longer exists (404, or a new object under the same name).

Per-interval lists (`history`, `rewards`) are merge-patched whole, so the list sent is
composed at write time from what the object holds (the index when the writer has one, else what
the round read), what this writer wrote and the watch has not shown yet, and the pending
entries: appended in interval order, one entry per interval number, the newest `limit` kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.kube.write_queue import WriteQueue

log = logging.getLogger("mlsched.controller.kube.status_writer")

ObjectKey = tuple[str, str, str]  # kind, namespace, name


@dataclass(frozen=True)
class Seen:
    """What the watch shows of an object now: its uid and its per-interval lists."""

    uid: str
    lists: Mapping[str, Iterable[Mapping[str, Any]]]


#: (kind, namespace, name) → what the index holds of it, or None when the writer cannot tell.
Lookup = Callable[[str, str, str], Seen | None]


def compose(older: Mapping[str, Any], newer: Mapping[str, Any]) -> dict[str, Any]:
    """One merge patch doing what `older` then `newer` do (RFC 7386 composition): maps merge,
    anything else (lists, null) from `newer` replaces."""
    out = dict(older)
    for key, value in newer.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = compose(out[key], value)
        else:
            out[key] = value
    return out


def by_interval(entries: Iterable[Mapping[str, Any]] | None) -> dict[int, Mapping[str, Any]]:
    return {int(e["interval"]): e for e in entries or () if "interval" in e}


@dataclass
class Pending:
    """What is still to be written to one object's status."""

    uid: str | None = None  # the object the record is for; another uid means it was replaced
    fields: dict[str, Any] = field(default_factory=dict)  # a merge patch of status
    appends: dict[str, dict[int, Mapping[str, Any]]] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    # The lists as the round read them, for when the writer has no index to ask.
    base: dict[str, dict[int, Mapping[str, Any]]] = field(default_factory=dict)
    attempts: int = 0
    not_before: float = 0.0  # monotonic seconds: backing off until then

    def absorb(self, newer: Pending) -> None:
        """Add what a later round queued; this record's backoff stands."""
        self.uid = newer.uid or self.uid
        self.fields = compose(self.fields, newer.fields)
        for name, entries in newer.appends.items():
            self.appends.setdefault(name, {}).update(entries)
        for name, entries in newer.base.items():
            self.base.setdefault(name, {}).update(entries)
        self.limits.update(newer.limits)


class StatusWriter(WriteQueue[Pending]):
    def __init__(self, api: KubeApi, *, concurrency: int = 8, rate: float = 50.0,
                 burst: float = 100.0, lookup: Lookup | None = None,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 on_failure: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(name="status-writer", log=log, concurrency=concurrency, rate=rate,
                         burst=burst, backoff_s=backoff_s, max_backoff_s=max_backoff_s,
                         on_failure=on_failure, clock=clock)
        self.api = api
        self.lookup = lookup or (lambda kind, namespace, name: None)
        # Entries written whose object the index has not shown with them yet (the watch
        # lags): the next write of that list must still carry them.
        self._unseen: dict[ObjectKey, tuple[str | None, dict[str, dict[int, Mapping]]]] = {}

    # ---- what a round calls ---------------------------------------------------------------
    def enqueue(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
                fields: Mapping[str, Any] | None = None,
                append: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
                base: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
                limit: int = 50) -> None:
        """Queue a status patch: `fields` merge into status, each list in `append` gets its
        entries (by interval number) on top of `base`, what the caller last read of it."""
        record = Pending(uid=uid, fields=dict(fields or {}),
                         appends={n: by_interval(e) for n, e in (append or {}).items()},
                         limits={n: limit for n in append or {}},
                         base={n: by_interval(e) for n, e in (base or {}).items()})
        key = (kind, namespace, name)
        # A policy's record goes ahead of the jobs': it is what `kubectl get
        # schedulingpolicy` shows of a round, and behind one record per job at `rate` it
        # came 39 s after a round of 2,000 jobs (bench_e2e, 50 a second).
        if key in self._queued:
            self._queued[key].absorb(record)
            record = self._queued[key]
        self._put(key, record, first=kind == "SchedulingPolicy")

    # ---- the queue's hooks ----------------------------------------------------------------
    async def _perform(self, key: ObjectKey, record: Pending) -> None:
        kind, namespace, name = key
        patch = self._patch(key, record)
        if patch is None:
            return
        await self.bucket.take()
        found = await self.api.patch(kind, namespace, name, {"status": patch}, status=True)
        if not found:
            log.info("%s %s/%s is gone: its status record is not written", kind, namespace,
                     name)
            self._unseen.pop(key, None)
            return
        self._remember(key, record, patch)

    def _requeue(self, key: ObjectKey, record: Pending) -> None:
        """A record not written goes back under whatever was queued for it meanwhile."""
        newer = self._queued.get(key)
        if newer is not None:
            record.absorb(newer)
        self._queued[key] = record

    def _describe(self, key: ObjectKey, record: Pending) -> str:
        kind, namespace, name = key
        return f"{kind} {namespace}/{name}: status record"

    def _patch(self, key: ObjectKey, record: Pending) -> dict[str, Any] | None:
        """The status patch for `record`, None when nothing in it is left to write."""
        seen = self.lookup(*key)
        if seen is not None and record.uid and seen.uid and seen.uid != record.uid:
            log.info("%s %s/%s was replaced: the old object's status record is dropped", *key)
            self._unseen.pop(key, None)
            return None
        unseen_uid, unseen = self._unseen.get(key, (None, {}))
        if unseen_uid and record.uid and unseen_uid != record.uid:
            unseen = {}
        patch = dict(record.fields)
        for name, entries in record.appends.items():
            stored = dict(record.base.get(name, {}))
            if seen is not None:
                stored.update(by_interval(seen.lists.get(name)))
            newest = max(stored, default=-1)
            # What the object already shows needs no help; what it does not yet, does.
            unseen[name] = {n: e for n, e in unseen.get(name, {}).items() if n > newest}
            known = {**stored, **unseen[name]}
            new = {n: e for n, e in entries.items() if n not in known}
            if new:
                merged = {**known, **new}
                patch[name] = [merged[n] for n in sorted(merged)][-max(1, record.limits[name]):]
        self._keep_unseen(key, record.uid, unseen)
        return patch or None

    def _remember(self, key: ObjectKey, record: Pending, patch: Mapping[str, Any]) -> None:
        _, unseen = self._unseen.get(key, (None, {}))
        for name in record.appends:
            if name in patch:
                unseen[name] = by_interval(patch[name])
        self._keep_unseen(key, record.uid, unseen)

    def _keep_unseen(self, key: ObjectKey, uid: str | None,
                     unseen: dict[str, dict[int, Mapping]]) -> None:
        unseen = {name: entries for name, entries in unseen.items() if entries}
        if unseen:
            self._unseen[key] = (uid, unseen)
        else:
            self._unseen.pop(key, None)
