"""Kubernetes Events about MLJobs and SchedulingPolicies (`kubectl describe` shows them).

Posted through the KubeApi seam rather than kopf.info(): the scheduling loop and the progress
endpoint run outside kopf's handler context, and tests read the Events from the fake API.
Events are best-effort: a failed post is logged, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime

from mlsched.api import API_VERSION
from mlsched.controller.kube.constants import COMPONENT
from mlsched.controller.kube.kube import KubeApi

log = logging.getLogger("mlsched.controller.kube.events")
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = API_VERSION

    @classmethod
    def of(cls, body) -> ObjectRef:
        meta = body.get("metadata", {})
        return cls(body.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""),
                   meta.get("uid", ""), body.get("apiVersion", API_VERSION))


def event_body(ref: ObjectRef, type_: str, reason: str, message: str,
               now: datetime | None = None) -> dict:
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": ref.namespace},
        "involvedObject": {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name,
                           "namespace": ref.namespace, "uid": ref.uid},
        "type": type_, "reason": reason, "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class Recorder:
    def __init__(self, api: KubeApi):
        self.api = api
        self._pending: set[asyncio.Future] = set()

    def in_background(self, posting: Awaitable) -> None:
        """Post Events without the caller waiting: a round's Scaled and Placed Events, one
        or two per changed job, took 9.8 s of a 2,000-job round that changed 1,400 jobs
        (bench_e2e (b), 28 Nov), and the policy's next admission step waited behind them.
        They go out through the create slots, after StatefulSets and Services (kube.py)."""
        task = asyncio.ensure_future(posting)
        self._pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("posting Events failed: %s", task.exception())

    async def settled(self, timeout: float | None = None) -> None:
        """Wait for the Events posted in the background (at shutdown: up to `timeout`)."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=timeout)

    async def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        log.log(level, "%s %s/%s: %s: %s", ref.kind, ref.namespace, ref.name, reason, message)
        try:
            await self.api.create(event_body(ref, type_, reason, message))
        except Exception as err:  # noqa: BLE001 - an Event must never fail the caller
            log.warning("could not post Event %s on %s/%s: %s", reason, ref.namespace, ref.name, err)
