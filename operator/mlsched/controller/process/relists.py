"""Objects deleted while a watch was down: found after kopf lists them again, and forgotten.

When a watch cannot resume where it stopped (the API server answers 410 Gone: the place in the
event history was lost, as across an API server restart), kopf lists the resource again and
replays every object it finds. It never compares: an object deleted in the gap gets no DELETED
event, and its entries stay in every index fed by that resource until the operator restarts.
Seen on the control plane: GPU pods of another workload deleted while the API server was down
went on holding their nodes, and a job waiting for those GPUs waited for good. client-go's
informers replace their store on a re-list; this does the same for kopf's indexes.

- Every watch event of an indexed resource is noted: uid → (namespace, name, when).
- A listing event (kopf gives those type None) of an object already noted, or one long after
  the resource's first listing, means the watches are being listed again. One outage breaks
  every watch at once, and a resource whose objects were all deleted lists nothing (no event
  at all), so every resource is then looked at, not only the one seen listing.
- SETTLE_S later, for each resource, the objects noted before that listing began and not seen
  since are looked for in a listing of our own (metadata only, per namespace): the ones the
  API server does not have are dropped from the resource's indexes (kopf's own per-object
  discard, what a DELETED event does) and returned, so that the operator forgets them as if
  deleted and wakes the policies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: How long a listing may take before what it has not replayed is asked for: a list of 10,000
#: pods arrives in a few seconds; an object replayed later than this is only asked for in vain.
SETTLE_S = 15.0
#: A listing event this long after a resource's first one is a listing again, even of objects
#: never seen before (every object of the first list was deleted in the gap).
FIRST_LIST_S = 120.0


@dataclass(frozen=True)
class Gone:
    """An object the API server no longer has, that no DELETED event reported."""
    plural: str
    namespace: str | None
    name: str
    uid: str


#: (plural, namespace or None for a cluster-scoped resource) → the uids the API server has.
Present = Callable[[str, str | None], Awaitable[set[str]]]


@dataclass
class _Resource:
    seen: dict[str, tuple[str | None, str, float]] = field(default_factory=dict)
    indexes: list[Any] = field(default_factory=list)  # the kopf indexes it feeds
    first_list: float | None = None


class Relists:
    def __init__(self, present: Present, on_gone: Callable[[list[Gone]], Awaitable[None]],
                 settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic,
                 on_relisted: Callable[[], None] | None = None):
        """`on_relisted`: called once each listing again has been settled, whatever was gone,
        for what the operator knows of resources it does not index (services.py)."""
        self._present, self._on_gone, self._on_relisted = present, on_gone, on_relisted
        self._settle_s, self._clock = settle_s, clock
        self._resources: dict[str, _Resource] = {}
        self._relisted: float | None = None  # when the listing being settled began
        self._sweeps: set[asyncio.Task] = set()

    def note(self, plural: str, event_type: str | None, body: dict[str, Any],
             indexes: Iterable[Any]) -> None:
        """One watch event of `plural`; `indexes`: the kopf indexes the resource feeds."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        r = self._resources.get(plural)
        if r is None:
            r = self._resources[plural] = _Resource(indexes=list(indexes))
        now = self._clock()
        if event_type == "DELETED":
            r.seen.pop(uid, None)
            return
        if event_type is None:  # a listing
            if r.first_list is None:
                r.first_list = now
            elif self._relisted is None and (uid in r.seen or now - r.first_list > FIRST_LIST_S):
                self._relisted = now
                log.warning("the watch of %s was listed again (the API server lost its place): "
                            "objects deleted meanwhile are looked for in %.0f s", plural,
                            self._settle_s)
                task = asyncio.get_running_loop().create_task(self._settle())
                self._sweeps.add(task)
                task.add_done_callback(self._sweeps.discard)
        r.seen[uid] = (meta.get("namespace"), meta.get("name", ""), now)

    async def _settle(self) -> None:
        await asyncio.sleep(self._settle_s)
        try:
            gone = await self.sweep()
            if self._on_relisted is not None:
                self._on_relisted()
            if gone:
                await self._on_gone(gone)
        except Exception:  # noqa: BLE001 - bookkeeping must never stop the operator
            log.exception("looking for objects deleted while the watches were down failed")

    async def sweep(self) -> list[Gone]:
        """Of every resource, the objects noted before the listing began and not replayed since
        that the API server no longer has, dropped from their indexes and from the notes."""
        began, self._relisted = self._relisted, None
        if began is None:
            return []
        gone: list[Gone] = []
        for plural, r in list(self._resources.items()):
            missing = [(uid, ns, name) for uid, (ns, name, at) in r.seen.items() if at < began]
            present: dict[str | None, set[str]] = {}
            try:
                for ns in {ns for _, ns, _ in missing}:
                    present[ns] = await self._present(plural, ns)
            except Exception as err:  # noqa: BLE001 - one resource unreadable: the others still
                log.warning("could not list %s to find what was deleted while the watches were "
                            "down: %s", plural, err)
                continue
            for uid, ns, name in missing:
                if uid in present[ns]:
                    continue
                r.seen.pop(uid, None)
                for index in r.indexes:
                    forget(index, ns, name, uid)
                gone.append(Gone(plural, ns, name, uid))
        if gone:
            log.warning("%d objects deleted while the watches were down forgotten: %s",
                        len(gone), ", ".join(f"{g.plural} {g.namespace}/{g.name}" if g.namespace
                                             else f"{g.plural} {g.name}" for g in gone[:10]))
        return gone


def forget(index: Any, namespace: str | None, name: str, uid: str) -> None:
    """Drop one object's entries from a kopf index, as kopf does for a DELETED event (its
    per-object key is (namespace, name, uid): OperatorIndexers.make_key)."""
    index._discard((namespace, name, uid))
