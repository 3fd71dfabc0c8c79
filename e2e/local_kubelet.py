"""The kubelet's part for one MLJob's pods, played on this machine: kwok binds the pods but runs
no container, so this runs each bound pod's command as a local process (e2e/pod_runner.py: the
environment resolved from the Pod object the StatefulSet controller created, the pod's hostname
and DNS names on loopback, its volumes and its progress token), and stops it as a kubelet stops a
deleted pod: SIGTERM, the pod's grace period, SIGKILL.

Two things a real node does differently, and why they do not change what is tested:

- A pod's /etc/hosts here is written when it starts and lists the pods of the job that exist
  then; cluster DNS would also resolve peers created later. So the pods of a new StatefulSet
  revision are started together, once every one of them exists (a rescale creates them all at
  once anyway: `maxUnavailable: 100%`).
- kwok deletes a pod at once where a kubelet keeps it Terminating until its container exits,
  and the StatefulSet controller only then creates its successor of the same name. So a pod's
  successor is started only once the old process has exited (a new rank 0 must not read the
  checkpoint its predecessor is still writing).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from pod_runner import PodProcess, PodRunner
from pod_tokens import TokenFiles

JOB_LABEL = "mlsched.io/job-name"
REVISION_LABEL = "controller-revision-hash"


class LocalKubelet:
    def __init__(self, api: client.ApiClient, namespace: str, job: str, runner: PodRunner,
                 volumes: dict[str, Path], token_dir: Path, poll_s: float = 0.2):
        self.api, self.namespace, self.job = api, namespace, job
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.runner, self.volumes, self.poll_s = runner, volumes, poll_s
        self.tokens = TokenFiles(self.core, token_dir)
        self.processes: dict[str, PodProcess] = {}  # pod uid -> its process
        self.generations: list[list[PodProcess]] = []  # the pods started together, in order
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{job}", daemon=True)

    def start(self) -> LocalKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # noqa: BLE001 - reported by the test, never swallowed
                self.errors.append(repr(err))
            self._stop.wait(self.poll_s)

    def running(self) -> list[PodProcess]:
        return [p for p in self.processes.values() if p.running()]

    def sync(self) -> None:
        selector = f"{JOB_LABEL}={self.job}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        live = {p.metadata.uid: p for p in pods
                if p.spec.node_name and not p.metadata.deletion_timestamp}
        now = time.monotonic()
        for uid, process in self.processes.items():
            if uid not in live and process.terminated_at is None and process.running():
                process.signal_term()  # the pod was deleted: the kubelet stops its container
            elif process.terminated_at is not None and process.running() \
                    and now - process.terminated_at > process.grace_s:
                process.process.kill()
        fresh = [p for uid, p in live.items() if uid not in self.processes]
        if not fresh or not self._complete(list(live.values())):
            return
        busy = {p.name for p in self.running()}
        if any(p.metadata.name in busy for p in fresh):
            return  # its predecessor is still saving: the API would still show it Terminating
        peers = [self.api.sanitize_for_serialization(p) for p in live.values()]
        new = [self.api.sanitize_for_serialization(p) for p in fresh]
        tokens = {p.metadata.name: self.tokens.path_for(p).read_text() for p in fresh}
        started = self.runner.start(new, peers=peers, volumes=self.volumes, tokens=tokens)
        for pod, process in zip(fresh, started):
            self.processes[pod.metadata.uid] = process
        self.generations.append(started)

    def _complete(self, live: list[Any]) -> bool:
        """Every StatefulSet of the job has its replicas, all of its latest revision."""
        sets = self.apps.list_namespaced_stateful_set(
            self.namespace, label_selector=f"{JOB_LABEL}={self.job}").items
        for sts in sets:
            mine = [p for p in live if p.metadata.name.rsplit("-", 1)[0] == sts.metadata.name]
            revision = sts.status.update_revision if sts.status else None
            if len(mine) != sts.spec.replicas or not revision or any(
                    (p.metadata.labels or {}).get(REVISION_LABEL) != revision for p in mine):
                return False
        return bool(sets)
