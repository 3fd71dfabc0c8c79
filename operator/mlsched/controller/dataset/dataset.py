"""The operator's side of the retraining dataset: each policy's interval records, written as the
intervals open and close (dataset_store.py says where and how).

- A round that opens interval N with a learned phase writes its record at once, `open`, with
  the decisions made: an operator killed mid-interval loses none. Admission steps in the
  interval add theirs and write it again.
- The round that closes N writes it `closed`, with every job's grant and what it trained, and
  the reward: one record per interval per policy, heuristic policies included (jobs and
  rewards, no decisions), so retraining can use any cluster's history. An interval with no
  job and no decision (an idle policy) is not written. A closed record goes into the policy's
  newest segment (dataset_segments.py), many intervals to a ConfigMap, and the open record's
  own ConfigMap is deleted; one too large for a segment stays in its own (parts).
- After a restart the next operator closes the interval the last one left open
  (rewards.restore). That interval's record is then completed, not replaced: its first write
  merges in the decisions the earlier process stored.
- Retention keeps the newest `spec.retraining.datasetLimit` closed intervals per policy; the
  rest are deleted: their keys pruned from their segment, a segment left empty deleted whole,
  a record of its own deleted (the policy's stored intervals are listed, metadata only, once
  per process).

Every write goes through an ObjectWriter: in the background, retried until done.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mlsched.controller.dataset import dataset_segments as segments
from mlsched.formats import dataset_store as store
from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.kube.object_writer import ObjectWriter
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.dataset.rewards import ClosedInterval, OpenInterval
from mlsched.policies.decision_log import IntervalRecord, JobInterval, RoundDecisions

log = logging.getLogger("mlsched.controller.dataset.dataset")

PolicyKey = tuple[str, str]
ARCHITECTURES = {"ps": "ParameterServer", "allreduce": "AllReduce"}


def rfc3339(value: datetime | float) -> str:
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Opening:
    """What a policy's round knows of the interval it opens."""

    policy_uid: str
    algorithms: dict[str, str]
    nodes: int


@dataclass
class _Record:
    record: IntervalRecord
    merged: bool  # decisions an earlier process stored are in `record` (or there are none)
    closed: bool = False
    parts: int = 0  # ConfigMaps of its own written (a rewrite with fewer deletes the rest)
    written: str | None = None  # sha256 of the bytes last written: an unchanged record is not
    existing: set[str] = field(default_factory=set)  # names known to exist: patched, not created
    segment: int | None = None  # the segment holding it, once closed into one


@dataclass
class _Held:
    """A closed interval stored by an earlier process: its ConfigMaps of its own (a record
    too large for a segment, one from before segments, an open one left by a crash between
    the move into its segment and the delete), and the segment holding it."""

    names: list[str] = field(default_factory=list)
    segment: int | None = None


def job_intervals(interval: OpenInterval, closed: ClosedInterval,
                  jobs: Mapping[str, JobRecord]) -> list[JobInterval]:
    """Every job of a closed interval, as the dataset keeps it (jobs deleted meanwhile have no
    history entry and are left out, as from the reward)."""
    out = []
    for name, entry in closed.history.items():
        grant, job = interval.grants.get(name), jobs.get(name)
        if grant is None or job is None:
            continue
        epochs = float(entry.get("epochs") or 0.0)
        (min_ps, max_ps), (min_workers, max_workers) = job.bounds("ps"), job.bounds("worker")
        out.append(JobInterval(
            name=name, uid=job.uid, model_type=job.model, architecture=ARCHITECTURES.get(job.arch, job.arch),
            total_epochs=grant.total_epochs, created=rfc3339(job.created_s), ps=grant.ps,
            workers=grant.workers, placement={r: list(n) for r, n in (grant.placement or {}).items()},
            epochs_at_start=grant.epochs_at_start, epochs=epochs,
            reward=float(entry.get("reward") or 0.0),
            finished=grant.epochs_at_start + epochs >= grant.total_epochs * (1 - 1e-9),
            speed=entry.get("speed"), samples_per_second=entry.get("samplesPerSecond"),
            min_ps=min_ps, max_ps=max_ps, min_workers=min_workers, max_workers=max_workers))
    return out


class Dataset:
    def __init__(self, api: KubeApi, writer: ObjectWriter, interval_scale: float = 1.0):
        self.api, self.writer = api, writer
        # A record's length_s is in the policy's time, as its interval is: under
        # --interval-scale (tests, emulated clusters) wall seconds / the scale.
        self.interval_scale = interval_scale or 1.0
        self._records: dict[tuple[str, str, int], _Record] = {}
        # Per policy, its closed intervals stored: the record written by this process, or
        # where an earlier one left it (listed once per process, `_swept`).
        self._stored: dict[PolicyKey, dict[int, _Record | _Held]] = {}
        self._segments: dict[PolicyKey, segments.PolicySegments] = {}
        self._pruning: dict[tuple[PolicyKey, int], set[int]] = {}  # (policy, segment) → intervals
        self._swept: set[PolicyKey] = set()
        self._limits: dict[PolicyKey, int] = {}

    # ---- what rounds call -------------------------------------------------------------------
    def opened(self, key: PolicyKey, number: int, start: datetime, opening: Opening,
               decisions: list[RoundDecisions], limit: int, continued: bool = False) -> None:
        """A round opened interval `number` (`continued`: a previous process opened it, this
        one carries it on after a restart)."""
        if limit <= 0:
            return
        rec = self._record(key, number, start, opening, merged=not continued)
        self._add(key, number, rec, decisions)

    def admitted(self, key: PolicyKey, number: int, start: datetime, opening: Opening,
                 decisions: list[RoundDecisions], limit: int) -> None:
        """An admission step in interval `number` made `decisions`."""
        if limit <= 0 or not decisions:
            return
        rec = self._record(key, number, start, opening, merged=(key[0], key[1], number) in self._records)
        self._add(key, number, rec, decisions)

    def closed(self, key: PolicyKey, interval: OpenInterval, closed: ClosedInterval,
               jobs: Mapping[str, JobRecord], opening: Opening, end: float, limit: int) -> None:
        """A round closed `interval`: write its complete record, then apply retention."""
        if limit <= 0:
            return
        ident = (key[0], key[1], interval.number)
        rec = self._records.pop(ident, None)
        if rec is None:  # opened by an earlier process: its stored decisions are merged first
            rec = _Record(self._new(key, interval.number, interval.start, opening), merged=False)
        r = rec.record
        r.end = rfc3339(end)
        r.length_s = interval.length_s(end, self.interval_scale)
        r.jobs = job_intervals(interval, closed, jobs)
        r.reward = float(closed.reward.get("reward") or 0.0)
        if not r.jobs and not r.decisions and rec.merged:
            return  # an idle interval: nothing to learn from, and no ConfigMap every interval
        rec.closed = True
        self._submit(key, interval.number, rec)
        self._retain(key, interval.number, rec, limit)

    async def first_free(self, key: PolicyKey) -> int:
        """The first interval number no stored record of the policy uses, read once per process
        (a metadata-only list, which retention uses too). A policy deleted and created again
        starts its numbering at 0: its records must not overwrite the history kept of the
        earlier one. 0 when the list fails (logged; retention lists again later)."""
        try:
            await self._listed(key)
        except Exception as err:  # noqa: BLE001 - the round goes on; numbering from status
            log.warning("SchedulingPolicy %s/%s: cannot list its dataset records: %s", *key, err)
            return 0
        return max(self._stored.get(key, {}), default=-1) + 1

    async def _listed(self, key: PolicyKey) -> None:
        """Learn, once per process, what the policy's dataset holds (names, labels and
        annotations only). Raises if the list fails."""
        if key in self._swept:
            return
        items = self._mine(await self.api.list("ConfigMap", key[0], store.selector(key[1]),
                                               metadata_only=True), key[1])
        stored = self._stored.setdefault(key, {})
        for interval, names in store.stored_intervals(items).items():
            held = stored.setdefault(interval, _Held())
            if isinstance(held, _Held):
                held.names = names
        listed = store.stored_segments(items)
        self._segs(key).learn(listed)
        for number, (_, intervals) in listed.items():
            for interval in intervals:
                held = stored.setdefault(interval, _Held())
                if isinstance(held, _Held):
                    held.segment = number
        self._swept.add(key)
        # A record of its own beside its segment's copy is what a crash between the move and
        # the delete leaves: the segment's copy is the one read, this one only costs quota.
        for interval, held in stored.items():
            if isinstance(held, _Held) and held.segment is not None and held.names:
                names, held.names = held.names, []
                self._delete_later(key, interval, names, "leftover of a record moved into its segment")

    @staticmethod
    def _mine(items: list[dict], policy: str) -> list[dict]:
        """A long name's label is shortened: the annotation says whose a record is."""
        return [cm for cm in items
                if ((cm.get("metadata") or {}).get("annotations") or {}).get(store.POLICY) == policy]

    def forget(self, key: PolicyKey) -> None:
        """The policy's loop stopped: nothing in memory is needed to write what is queued."""
        for ident in [i for i in self._records if i[:2] == key]:
            del self._records[ident]
        self._stored.pop(key, None)
        self._segments.pop(key, None)
        self._swept.discard(key)

    # ---- records ----------------------------------------------------------------------------
    def _new(self, key: PolicyKey, number: int, start: datetime, opening: Opening) -> IntervalRecord:
        return IntervalRecord(namespace=key[0], policy=key[1], policy_uid=opening.policy_uid,
                              interval=number, start=rfc3339(start), end="", length_s=0.0,
                              algorithms=dict(opening.algorithms), nodes=opening.nodes, reward=0.0)

    def _record(self, key: PolicyKey, number: int, start: datetime, opening: Opening,
                merged: bool) -> _Record:
        ident = (key[0], key[1], number)
        if ident not in self._records:
            self._records[ident] = _Record(self._new(key, number, start, opening), merged=merged)
        return self._records[ident]

    def _add(self, key: PolicyKey, number: int, rec: _Record, decisions: list[RoundDecisions]) -> None:
        rec.record.decisions.extend(decisions)
        if decisions:  # a heuristic interval is written once, when it closes
            self._submit(key, number, rec)

    def _submit(self, key: PolicyKey, number: int, rec: _Record) -> None:
        async def write() -> None:
            await self._write(rec)

        self.writer.submit(("record", key[0], key[1], number), write,
                           f"interval record {key[0]}/{key[1]} #{number}")

    async def _write(self, rec: _Record) -> None:
        r = rec.record
        if not rec.merged:
            stored = await self._stored_record(r.namespace, r.policy, r.interval)
            if stored is not None:
                earlier, parts = stored
                r.decisions[:0] = earlier.decisions
                r.algorithms = earlier.algorithms or r.algorithms
                r.nodes = earlier.nodes or r.nodes
                r.start = earlier.start or r.start
                rec.parts = max(rec.parts, parts)
            rec.merged = True
        if rec.closed and await self._write_to_segment(rec):
            return
        # Encoding a large round's states takes a while: not on the event loop.
        bodies = await asyncio.to_thread(store.manifests, r, store.CLOSED if rec.closed else store.OPEN)
        digest = bodies[0]["metadata"]["annotations"][store.SHA256] + str(rec.closed)
        if digest == rec.written:
            return
        for body in bodies:
            await self._put(rec, body)
        for part in range(len(bodies), rec.parts):
            await self.api.delete("ConfigMap", r.namespace, store.configmap_name(r.policy, r.interval, part))
        rec.parts, rec.written = len(bodies), digest

    async def _write_to_segment(self, rec: _Record) -> bool:
        """A closed record into the policy's segments, then its open ConfigMaps deleted; False
        for a record too large for a segment (it is written in parts of its own)."""
        r = rec.record
        data = await asyncio.to_thread(r.to_bytes)
        if not store.fits({}, r.interval, data):
            return False
        digest = hashlib.sha256(data).hexdigest() + "/segment"
        if digest == rec.written:
            return True
        key = (r.namespace, r.policy)
        await self._listed(key)  # which segment is the newest: from the listing
        rec.segment = await segments.append(self.api, self._segs(key), r.interval, data)
        for part in range(rec.parts):  # the open record, now in the segment
            await self.api.delete("ConfigMap", r.namespace, store.configmap_name(r.policy, r.interval, part))
        rec.parts, rec.written = 0, digest
        return True

    def _segs(self, key: PolicyKey) -> segments.PolicySegments:
        if key not in self._segments:
            self._segments[key] = segments.PolicySegments(*key)
        return self._segments[key]

    async def _put(self, rec: _Record, body: dict) -> None:
        """Create, or (it exists) merge-patch labels, annotations and data: idempotent."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        patch = {"metadata": {"labels": body["metadata"]["labels"],
                              "annotations": body["metadata"]["annotations"]},
                 "binaryData": body["binaryData"]}
        if name in rec.existing and await self.api.patch("ConfigMap", ns, name, patch):
            return
        if not await self.api.create(body):  # 409: written by an earlier process or attempt
            if not await self.api.patch("ConfigMap", ns, name, patch):
                raise RuntimeError(f"ConfigMap {ns}/{name} vanished while being written")
        rec.existing.add(name)

    async def _stored_record(self, namespace: str, policy: str,
                             interval: int) -> tuple[IntervalRecord, int] | None:
        items = await self.api.list("ConfigMap", namespace, store.selector(policy, interval))
        mine = self._mine(items, policy)
        records = store.read_records(mine, include_open=True)
        if not records:
            return None
        return records[-1], len(mine)

    # ---- retention --------------------------------------------------------------------------
    def _retain(self, key: PolicyKey, number: int, rec: _Record, limit: int) -> None:
        self._limits[key] = limit
        stored = self._stored.setdefault(key, {})
        stored[number] = rec
        if key in self._swept:
            self._expire(key)
            return

        async def sweep() -> None:  # the first round's listing failed: list them now
            await self._listed(key)
            self._expire(key)

        self.writer.submit(("sweep", *key), sweep, f"dataset retention {key[0]}/{key[1]}")

    def _expire(self, key: PolicyKey) -> None:
        stored = self._stored.get(key, {})
        still_open = {i[2] for i in self._records if i[:2] == key}
        for interval in store.expired([n for n in stored if n not in still_open], self._limits[key]):
            held = stored.pop(interval)
            if isinstance(held, _Record) and held.written is None:
                # Its write is still queued: it is expired once written.
                self._expire_after_write(key, interval, held)
                continue
            if isinstance(held, _Record):
                names = [store.configmap_name(key[1], interval, k) for k in range(held.parts)]
            else:
                names = held.names
            if names:
                self._delete_later(key, interval, names, "expired interval record")
            if held.segment is not None:
                self._prune_later(key, held.segment, interval)

    def _expire_after_write(self, key: PolicyKey, interval: int, rec: _Record) -> None:
        async def expire() -> None:
            if rec.written is None:
                raise RuntimeError(f"interval {interval} is not written yet")
            names = [store.configmap_name(key[1], interval, k) for k in range(rec.parts)]
            for name in names:
                await self.api.delete("ConfigMap", key[0], name)
            if rec.segment is not None:
                await segments.prune(self.api, self._segs(key), rec.segment, {interval})

        self.writer.submit(("expire", key[0], key[1], interval), expire,
                           f"expired interval record {key[0]}/{key[1]} #{interval}")

    def _delete_later(self, key: PolicyKey, interval: int, names: list[str], what: str) -> None:
        async def delete() -> None:
            for name in names:
                await self.api.delete("ConfigMap", key[0], name)

        self.writer.submit(("delete", key[0], key[1], interval), delete,
                           f"{what} {key[0]}/{key[1]} #{interval}")

    def _prune_later(self, key: PolicyKey, number: int, interval: int) -> None:
        """Take `interval` out of segment `number`, with whatever else of that segment expires
        before the write runs (one read and one write of the segment for all of them)."""
        self._pruning.setdefault((key, number), set()).add(interval)
        segs = self._segs(key)

        async def prune() -> None:
            drop = set(self._pruning.get((key, number), ()))
            if drop:
                await segments.prune(self.api, segs, number, drop)
            left = self._pruning.get((key, number), set()) - drop
            if left:
                self._pruning[(key, number)] = left
            else:
                self._pruning.pop((key, number), None)

        self.writer.submit(("prune", key[0], key[1], number), prune,
                           f"expired interval records {key[0]}/{key[1]} in segment {number}")
