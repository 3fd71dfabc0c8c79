"""Closed interval records into a policy's dataset segments (dataset_store.py has the format):
appending a record, and pruning the records retention drops.

Each is a read of the segment and a merge patch that carries the `resourceVersion` read: the
API server refuses it (409) if the segment changed in between, so the size rule and the
`mlsched.io/intervals` annotation are decided on what the segment really holds, and a write
by another process (a previous leader finishing its queue, fenced only once its Lease lapses)
is never overwritten silently. On a conflict the segment is read again and the write decided
again. A patch rather than an update (PUT): the operator's Role already has patch on
ConfigMaps, and the request carries only the key added or removed.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field

from mlsched.formats import dataset_store as store
from mlsched.controller.kube.kube import KubeApi, KubeError

log = logging.getLogger("mlsched.controller.dataset.dataset")

#: Conflicts in a row before an operation gives up for now (the ObjectWriter retries it later,
#: with backoff): writers that keep colliding should not spin.
TRIES = 8


@dataclass
class Segment:
    name: str
    intervals: set[int] = field(default_factory=set)
    usable: bool = True  # False: the name is taken by a ConfigMap that is not this dataset's


class PolicySegments:
    """One policy's segments as this process knows them: from the listing of its dataset
    (metadata and annotations) and from its own writes since."""

    def __init__(self, namespace: str, policy: str):
        self.namespace, self.policy = namespace, policy
        self.by_number: dict[int, Segment] = {}

    def learn(self, listed: dict[int, tuple[str, set[int]]]) -> None:
        for number, (name, intervals) in listed.items():
            self.by_number.setdefault(number, Segment(name, set(intervals)))

    def holding(self, interval: int) -> int | None:
        return next((n for n, s in self.by_number.items() if s.usable and interval in s.intervals),
                    None)

    def newest(self) -> int | None:
        """The segment appended to: the newest usable one."""
        return max((n for n, s in self.by_number.items() if s.usable), default=None)

    def next_number(self) -> int:
        return max(self.by_number, default=-1) + 1


async def append(api: KubeApi, segs: PolicySegments, interval: int, data: bytes,
                 limit: int | None = None) -> int:
    """Put closed `interval`'s record into a segment; the segment's number. The newest segment
    takes it while it fits, else a new one is created. A record the segment already holds (a
    retried write, or a restarted operator closing an interval a second time) is kept as it is:
    the first close had the whole interval's information. `limit`: store.SEGMENT_BYTES."""
    ns = segs.namespace
    for _ in range(TRIES):
        number = segs.holding(interval)
        if number is None:
            number = segs.newest()
        if number is not None:
            seg = segs.by_number[number]
            body = await api.get("ConfigMap", ns, seg.name)
            if body is None:  # deleted by someone: forget it, decide again
                del segs.by_number[number]
                continue
            if not store.segment_of(body, segs.policy):
                log.warning("ConfigMap %s/%s is not a dataset segment of policy %s: not written; "
                            "the dataset goes on in the next segment", ns, seg.name, segs.policy)
                seg.usable = False
                continue
            seg.intervals = store.segment_intervals(body)
            if interval in seg.intervals:
                return number
            if number != segs.newest():
                continue  # its annotation named the interval, its keys do not
            if store.fits(body, interval, data, limit):
                patch = {"metadata": {"resourceVersion": body["metadata"].get("resourceVersion"),
                                      "annotations": {store.INTERVALS: store.ranges(
                                          seg.intervals | {interval})}},
                         "binaryData": {store.segment_key(interval):
                                        base64.b64encode(data).decode("ascii")}}
                if not await _conditional_patch(api, ns, seg.name, patch):
                    continue
                seg.intervals.add(interval)
                return number
            number = segs.next_number()  # full: the next segment starts
        else:
            number = segs.next_number()  # none known (usable): the first, or past others' names
        body = store.segment_manifest(ns, segs.policy, number, {interval: data})
        name = body["metadata"]["name"]
        if await api.create(body):
            segs.by_number[number] = Segment(name, {interval})
            return number
        # Made first by another writer (or by an attempt of ours whose answer was lost): it is
        # read and appended to at the next try.
        segs.by_number[number] = Segment(name)
    raise RuntimeError(f"dataset of {ns}/{segs.policy}: interval {interval} not stored after "
                       f"{TRIES} conflicting writes to its segments; tried again later")


async def prune(api: KubeApi, segs: PolicySegments, number: int, drop: set[int]) -> None:
    """Take the records of intervals `drop` out of segment `number`; delete the segment when
    nothing else is left in it and it is not the one appended to."""
    ns = segs.namespace
    for _ in range(TRIES):
        seg = segs.by_number.get(number)
        if seg is None or not seg.usable:
            return
        body = await api.get("ConfigMap", ns, seg.name)
        if body is None or not store.segment_of(body, segs.policy):
            segs.by_number.pop(number, None)
            return
        held = store.segment_intervals(body)
        gone, left = held & drop, held - drop
        seg.intervals = left
        if not gone:
            return
        if not left and number != segs.newest():
            # Only older segments are emptied whole, and nothing appends to those; the uid
            # keeps a segment made again under this name since the read.
            await api.delete("ConfigMap", ns, seg.name, uid=body["metadata"].get("uid"))
            del segs.by_number[number]
            return
        patch = {"metadata": {"resourceVersion": body["metadata"].get("resourceVersion"),
                              "annotations": {store.INTERVALS: store.ranges(left)}},
                 "binaryData": {store.segment_key(n): None for n in sorted(gone)}}
        if await _conditional_patch(api, ns, seg.name, patch):
            return
    raise RuntimeError(f"dataset of {ns}/{segs.policy}: segment {number} not pruned after "
                       f"{TRIES} conflicting writes; tried again later")


async def _conditional_patch(api: KubeApi, namespace: str, name: str, patch: dict) -> bool:
    """The patch, refused if the segment changed since it was read: False on a conflict (or
    the segment gone), to read it again."""
    try:
        return await api.patch("ConfigMap", namespace, name, patch)
    except KubeError as err:
        if err.status == 409:
            log.debug("dataset segment %s/%s changed since it was read: reading it again",
                      namespace, name)
            return False
        raise
