"""Which jobs' headless Services exist, known without an API call per job.

A new job's StatefulSets are created before its Service: a pod's DNS name is needed only once
pods exist, which is after the StatefulSets exist and a policy has scaled them, and in a burst
of new jobs every Service created first had to be served before the next job's StatefulSets
(bench_e2e, 200 jobs at once: the p99 until a job's StatefulSets exist fell from 3.5-3.9 s to
2.0-2.5 s). So a job can have its StatefulSets and not yet its Service: the operator stopped,
or the create failed (a quota on `services`, an earlier job's Service of the same name still
there), between the two. Whether a job whose StatefulSets all exist still needs its Service
is answered here: from what this process created, else from one metadata-only list of the
namespace's Services (once per namespace and process: a resumed operator makes no call per
job, as before).
"""

from __future__ import annotations

import asyncio
import logging

from mlsched.controller.kube.constants import JOB_LABEL
from mlsched.controller.kube.kube import KubeApi, KubeError
from mlsched.controller.objects.records import controller_uid
from mlsched.controller.objects.job_records import JobRecord

log = logging.getLogger("mlsched.controller.objects.services")

JobKey = tuple[str, str]


class ServiceBook:
    def __init__(self) -> None:
        self._owner: dict[JobKey, str | None] = {}  # job -> the uid owning its Service
        self._listed: dict[str, asyncio.Future] = {}  # namespace -> its one list
        self._refused: set[JobKey] = set()  # jobs whose Service could not be created

    def note(self, job: JobRecord) -> None:
        """The job's Service exists (created now, or found its own)."""
        self._owner[job.key] = job.uid
        self._refused.discard(job.key)

    def failed(self, job: JobRecord) -> None:
        """Its create failed (the quota full, an earlier job's Service of the name still
        there): the job gets no capacity until it is created (`refused`)."""
        self._refused.add(job.key)

    def refused(self, job: JobRecord) -> bool:
        """Not to be given capacity: its pods would have no DNS names. (A Service still being
        created is not refused: it exists long before the pods a scaling brings.)"""
        return job.key in self._refused

    def relisted(self) -> None:
        """The watches were listed again (relists.py): a Service deleted while they were down
        sent no DELETED event, so what was known is asked again, one list per namespace, and
        the lifecycle sweep restores what the list lacks (pod_events.restore_service). A job's pods
        used to lose their peers' DNS names for good."""
        self._owner.clear()
        self._listed.clear()

    def forget(self, key: JobKey) -> None:
        self._owner.pop(key, None)
        self._refused.discard(key)

    async def exists(self, api: KubeApi, job: JobRecord) -> bool:
        """Whether this job (this uid) has its Service, as far as is known: a Service deleted
        by hand is forgotten by its deletion event (`pod_events.on_service_deleted`), one deleted
        while the watch was down once the watches are listed again (`relisted`)."""
        if self._owner.get(job.key) == job.uid:
            return True
        listing = self._listed.get(job.namespace)
        if listing is None:
            listing = self._listed[job.namespace] = asyncio.ensure_future(
                self._list(api, job.namespace))
        try:
            listable = await asyncio.shield(listing)
        except Exception:
            if self._listed.get(job.namespace) is listing:
                del self._listed[job.namespace]  # the next job asks again
            raise
        return not listable or self._owner.get(job.key) == job.uid

    async def _list(self, api: KubeApi, namespace: str) -> bool:
        """False when the operator may not list Services (RBAC from before this module):
        every job whose StatefulSets exist is then taken to have its Service, as it was."""
        try:
            items = await api.list("Service", namespace, JOB_LABEL, metadata_only=True)
        except KubeError as err:
            if err.status != 403:
                raise
            log.warning("cannot list Services in %s (%s): jobs whose StatefulSets exist are "
                        "taken to have theirs; apply the current RBAC (list services)",
                        namespace, err.message)
            return False
        for item in items:
            meta = item.get("metadata") or {}
            name = meta.get("name", "")
            # A Service this process noted meanwhile stays as noted.
            self._owner.setdefault((namespace, name), controller_uid(meta))
        return True
