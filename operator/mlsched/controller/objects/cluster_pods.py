"""Pods outside the served namespaces, for the capacity view of an operator run with
`--namespace`.

kopf watches only the served namespaces then, so without this the pods of every other
namespace were invisible and the nodes they use looked free: a round could pin a task to a
node whose GPUs another team's pods already hold. Nodes are shared by all namespaces; what
runs on them must be counted whoever owns it. This needs only read access to pods cluster-wide
(list, watch); every write stays in the served namespaces.

A thread runs the `kubernetes` client's list+watch (the client is synchronous; one thread for
the whole cluster is cheaper than kopf watching every namespace with handlers on each pod) and
keeps {pod uid: (node, requests, host ports, extended resources)} for bound, non-terminal pods.
The scheduling loop reads it as one more source of foreign requests (`requests_by_node`, one
entry per pod: its pod slots too), of host ports held (`ports_by_node`, host_ports.py) and of
extended resources held (`extended_by_node`, counted_resources.py). The devices other
namespaces' pods hold through Dynamic Resource Allocation are in their ResourceClaims, not the
pods: a second watch of the same kind keeps the allocated claims (`OtherNamespaceClaims`,
dra.py; read access to resourceclaims cluster-wide).
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from mlsched.controller.constraints.dra import ClaimRecord, resource_claim_record
from mlsched.controller.constraints.host_ports import HostPort, host_ports
from mlsched.controller.objects.quantities import Resources, extended_requests, pod_requests

log = logging.getLogger("mlsched.controller.objects.cluster_pods")

TERMINAL = ("Succeeded", "Failed")
Extended = tuple[tuple[str, float], ...]  # quantities.extended_requests


def served(namespace: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(namespace, p) for p in patterns)


class _OtherNamespaceWatch:
    """A list+watch of one kind across the cluster in a thread, keeping what `apply` keeps of
    the objects outside the served namespaces."""

    #: The thread's name, what a warning calls the objects, and the list's field selector.
    what = "objects"
    field_selector: str | None = None

    def __init__(self, patterns: Iterable[str], on_freed: Callable[[], None] | None = None):
        self.patterns = tuple(patterns)
        # Called (from the watch thread) when something counted ends or goes: its node has
        # room again, which waiting jobs may use now (startup.wake_all_admissions).
        self.on_freed = on_freed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # the first list has been read

    def apply(self, event_type: str, obj: dict[str, Any]) -> bool:
        """Keep or forget one object; True when something counted no longer is."""
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def replace(self, objects: Iterable[dict[str, Any]]) -> None:
        """A fresh list: forget what the watch said before."""
        with self._lock:
            self.clear()
        for obj in objects:
            self.apply("ADDED", obj)

    # -- the watch thread
    def start(self, list_fn: Callable[..., Any], watch_factory: Callable[[], Any]) -> None:
        self._thread = threading.Thread(target=self._run, args=(list_fn, watch_factory),
                                        name=f"mlsched-other-namespace-{self.what}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, list_fn, watch_factory) -> None:
        selector = {"field_selector": self.field_selector} if self.field_selector else {}
        version = None  # None: list first
        while not self._stop.is_set():
            try:
                if version is None:
                    body = _json(list_fn(_preload_content=False, **selector))
                    self.replace(body.get("items") or ())
                    self.synced.set()
                    version = (body.get("metadata") or {}).get("resourceVersion")
                watch = watch_factory()
                for event in watch.stream(list_fn, resource_version=version, timeout_seconds=300,
                                          deserialize=False, **selector):
                    if self._stop.is_set():
                        watch.stop()
                        return
                    # deserialize=False: the plain dict is under "object" (the client's models
                    # would cost a pydantic validation per event, for fields never read).
                    obj = event.get("raw_object") or event.get("object") or {}
                    if event.get("type") == "ERROR":  # 410 Gone: too old to resume, list again
                        version = None
                        break
                    if self.apply(event.get("type"), obj) and self.on_freed is not None:
                        self.on_freed()
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
            except Exception as err:  # noqa: BLE001 - a lost watch is re-listed, never fatal
                if getattr(err, "status", None) == 404:  # the API is not served (DRA before 1.34)
                    log.info("%s are not served by this cluster; not watching them", self.what)
                    self.synced.set()
                    return
                log.warning("watching %s in other namespaces failed (%s); listing again",
                            self.what, err)
                version = None
                self._stop.wait(2.0)


class OtherNamespacePods(_OtherNamespaceWatch):
    """Requests of bound, non-terminal pods in namespaces the operator does not serve."""

    what = "pods"
    field_selector = "spec.nodeName!="

    def __init__(self, patterns: Iterable[str], on_freed: Callable[[], None] | None = None):
        super().__init__(patterns, on_freed)
        self._pods: dict[str, tuple[str, Resources, frozenset[HostPort], Extended]] = {}

    # -- what the watch feeds
    def apply(self, event_type: str, pod: dict[str, Any]) -> bool:
        """True when a pod that was counted no longer is (its requests are free again)."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = meta.get("uid", ""), spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        with self._lock:
            if event_type == "DELETED" or not node or phase in TERMINAL \
                    or served(meta.get("namespace", ""), self.patterns):
                return self._pods.pop(uid, None) is not None
            self._pods[uid] = (node, pod_requests(spec), host_ports(spec), extended_requests(spec))
            return False

    def clear(self) -> None:
        self._pods.clear()

    # -- what the scheduling loop reads
    def requests_by_node(self) -> dict[str, list[Resources]]:
        with self._lock:
            pods = list(self._pods.values())
        out: dict[str, list[Resources]] = defaultdict(list)
        for node, requests, _, _ in pods:
            out[node].append(requests)
        return dict(out)

    def ports_by_node(self) -> dict[str, list[frozenset[HostPort]]]:
        with self._lock:
            pods = list(self._pods.values())
        out: dict[str, list[frozenset[HostPort]]] = defaultdict(list)
        for node, _, ports, _ in pods:
            if ports:
                out[node].append(ports)
        return dict(out)

    def extended_by_node(self) -> dict[str, list[Extended]]:
        with self._lock:
            pods = list(self._pods.values())
        out: dict[str, list[Extended]] = defaultdict(list)
        for node, _, _, extended in pods:
            if extended:
                out[node].append(extended)
        return dict(out)


class OtherNamespaceClaims(_OtherNamespaceWatch):
    """Allocated ResourceClaims in namespaces the operator does not serve: the DRA devices other
    teams' pods hold (dra.py), as the pods above are their CPU, GPU and memory."""

    what = "resourceclaims"

    def __init__(self, patterns: Iterable[str], on_freed: Callable[[], None] | None = None):
        super().__init__(patterns, on_freed)
        self._claims: dict[str, ClaimRecord] = {}

    def apply(self, event_type: str, claim: dict[str, Any]) -> bool:
        """True when a claim that held devices no longer does."""
        meta = claim.get("metadata") or {}
        uid = meta.get("uid", "")
        record = None if event_type == "DELETED" else resource_claim_record(claim)
        with self._lock:
            if record is None or served(meta.get("namespace", ""), self.patterns):
                return self._claims.pop(uid, None) is not None
            self._claims[uid] = record
            return False

    def clear(self) -> None:
        self._claims.clear()

    def claims(self) -> list[ClaimRecord]:
        with self._lock:
            return list(self._claims.values())


def _json(response: Any) -> dict[str, Any]:
    import json

    data = response.data if hasattr(response, "data") else response
    return json.loads(data) if isinstance(data, bytes | str) else data
