"""An in-memory stand-in for the API server, for the fast tests only (a test double).

`MemoryKube` implements the KubeApi seam over a dict of objects with the patch semantics the
operator relies on (JSON merge patch, the strategic-merge subset used for pods, JSON patch),
uid preconditions on delete, status-only writes to /status, and TokenReviews answered from a
table. Two helpers play the controllers the operator leans on: `run_statefulsets()` (pods
follow replicas and templates, like the StatefulSet controller) and `run_scheduler()` (an
ungated pod binds to the node its nodeSelector names, like kube-scheduler). `indexes()`
rebuilds what kopf's indexes would hold, using the very index functions of handlers.py.

Every stored object has a `resourceVersion`, new at each write; a merge patch that carries
`metadata.resourceVersion` is refused (409) unless it is the stored one, as the API server's
optimistic concurrency does.

What it does not do: admission, schema validation, set-based label selectors.
The e2e tier runs the operator against a real API server for those.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mlsched.controller.kube.constants import POD_INDEX_LABEL, TEMPLATE_HASH_ANNOTATION
from mlsched.controller.kube.kube import CUSTOM_PLURALS, KubeError, PatchType
from mlsched.controller.scheduling.indexes import Indexes

Key = tuple[str, str, str]  # kind, namespace, name


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_patch(target: Any, patch: Any) -> Any:
    """The subset of strategic merge the operator uses: lists of named items merge by name,
    and an item with `$patch: delete` removes the item of that name."""
    if isinstance(patch, list) and all(isinstance(i, dict) and "name" in i for i in patch):
        items = [dict(i) for i in target or []]
        for item in patch:
            match = next((i for i in items if i.get("name") == item["name"]), None)
            if item.get("$patch") == "delete":
                items = [i for i in items if i.get("name") != item["name"]]
            elif match is not None:
                match.update(strategic_patch(match, item))
            else:
                items.append(copy.deepcopy(item))
        return items
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = strategic_patch(out.get(key), value)
    return out


def json_patch(target: dict, ops: list[dict]) -> dict:
    """RFC 6902 add / replace / remove / test (what the operator sends)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                if op["op"] == "replace" and last not in parent:
                    raise KubeError(422, f"replace of missing {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "test":
            try:
                found = parent[int(last)] if isinstance(parent, list) else parent[last]
            except (IndexError, KeyError):
                found = None
            if found != op["value"]:
                raise KubeError(422, f"test of {op['path']} failed")
    return doc


def selects(selector: str, obj: dict) -> bool:
    """Equality-based label selectors (`a=b,c`, `a!=b`), what the operator sends."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


class MemoryKube:
    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.calls: list[tuple[str, str, str, str]] = []  # verb, kind, namespace, name
        self.tokens: dict[str, dict] = {}  # token → TokenReview status
        # (verb, name) → HTTP status to fail with: 500 plays an outage, 422 a refused object.
        self.failing: dict[tuple[str, str], int] = {}
        self._clock = itertools.count()
        self._versions = itertools.count(1)
        # Admission of pods (a stand-in for Pod Security, a webhook): the pod's body -> the API
        # server's 403 message, or None to admit. Dry runs and the StatefulSet controller ask it.
        self.pod_admission: Callable[[dict], str | None] | None = None
        # Object counts a namespace's ResourceQuota allows, by kind ("Service": 1). As the API
        # server's quota admission does, a create over it is refused (403) before the name is
        # looked up, so the create of an object that exists is refused too.
        self.object_quota: dict[str, int] = {}

    # ---- the KubeApi seam -------------------------------------------------------------------
    def _check(self, verb: str, name: str) -> None:
        status = self.failing.get((verb, name))
        if status:
            raise KubeError(status, f"injected failure: {verb} {name}")

    async def create(self, body: dict) -> bool:
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace", ""), meta["name"])
        self.calls.append(("create", *key))
        self._check("create", meta["name"])
        limit = self.object_quota.get(body["kind"])
        used = sum(1 for k in self.objects if k[0] == body["kind"] and k[1] == key[1])
        if limit is not None and used >= limit:
            resource = body["kind"].lower() + "s"
            raise KubeError(403, f'{resource} "{meta["name"]}" is forbidden: exceeded quota: '
                                 f'objects, requested: {resource}=1, used: {resource}={used}, '
                                 f'limited: {resource}={limit}')
        if key in self.objects:
            return False
        self.put(body)
        return True

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        self.calls.append(("get", kind, namespace, name))
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def hurry_status(self, kind: str, namespace: str, name: str) -> None:
        pass  # patches here are answered at once: none waits

    async def patch(self, kind: str, namespace: str, name: str, patch: Any, *,
                    patch_type: PatchType = "merge", status: bool = False,
                    priority: int = 2) -> bool:
        self.calls.append(("patch-status" if status else "patch", kind, namespace, name))
        self._check("patch", name)
        key = (kind, namespace, name)
        if key not in self.objects:
            return False
        obj = self.objects[key]
        if patch_type == "json":
            new = json_patch(obj, patch)
        elif patch_type == "strategic":
            if kind in CUSTOM_PLURALS:
                raise KubeError(415, "strategic merge patch is not supported for custom resources")
            new = strategic_patch(obj, patch)
        else:
            expected = ((patch or {}).get("metadata") or {}).get("resourceVersion") \
                if isinstance(patch, dict) else None
            if expected is not None and expected != obj["metadata"].get("resourceVersion"):
                raise KubeError(409, f'Operation cannot be fulfilled on {kind.lower()}s "{name}": '
                                     f'the object has been modified; please apply your changes '
                                     f'to the latest version and try again')
            new = merge_patch(obj, patch)
        if kind in CUSTOM_PLURALS:  # the status subresource: each endpoint writes its half only
            if status:
                new = {**obj, "status": new.get("status")}
            else:
                new = {**new, "status": obj.get("status")}
                if new.get("spec") != obj.get("spec"):
                    new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        elif kind == "StatefulSet" and new.get("spec") != obj.get("spec"):
            new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        elif kind == "Pod" and not (obj["spec"].get("schedulingGates")) and \
                new["spec"].get("nodeSelector") != obj["spec"].get("nodeSelector"):
            # As the API server: a pod's nodeSelector may change only while it is gated.
            raise KubeError(422, f'Pod "{name}" is invalid: spec: Forbidden: pod updates may '
                                 f'not change fields other than `spec.containers[*].image`, ...')
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key] = new
        return True

    async def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", kind, namespace, name))
        self._check("delete", name)
        obj = self.objects.get((kind, namespace, name))
        if obj is None or (uid and obj["metadata"].get("uid") != uid):
            return False
        del self.objects[(kind, namespace, name)]
        self._collect_garbage()
        return True

    async def pod_warnings(self, namespace: str, pod: str) -> list[dict]:
        self.calls.append(("list", "Event", namespace, pod))
        return [copy.deepcopy(e) for e in self.of_kind("Event")
                if e["metadata"].get("namespace") == namespace and e.get("type") == "Warning"
                and (e.get("involvedObject") or {}).get("kind") == "Pod"
                and e["involvedObject"].get("name") == pod]

    async def dry_run_create(self, body: dict) -> None:
        meta = body["metadata"]
        self.calls.append(("dry-run", body["kind"], meta.get("namespace", ""), meta["name"]))
        self._check("dry-run", meta["name"])
        refusal = self.pod_admission(body) if self.pod_admission else None
        if refusal:
            raise KubeError(403, refusal)

    async def failed_creates(self, namespace: str, statefulset: str) -> list[dict]:
        self.calls.append(("list", "Event", namespace, statefulset))
        return [copy.deepcopy(e) for e in self.of_kind("Event")
                if e["metadata"].get("namespace") == namespace and e.get("reason") == "FailedCreate"
                and (e.get("involvedObject") or {}).get("kind") == "StatefulSet"
                and e["involvedObject"].get("name") == statefulset]

    async def review_token(self, token: str, audiences: list[str]) -> dict:
        self.calls.append(("create", "TokenReview", "", ""))
        review = self.tokens.get(token)
        if review is None or not set(audiences) & set(review.get("audiences", audiences)):
            return {"authenticated": False, "error": "invalid bearer token"}
        return copy.deepcopy(review)

    async def list(self, kind: str, namespace: str, label_selector: str, *,
                   metadata_only: bool = False) -> list[dict]:
        self.calls.append(("list", kind, namespace, label_selector))
        self._check("list", kind)
        found = [o for (k, ns, _), o in sorted(self.objects.items())
                 if k == kind and ns == namespace and selects(label_selector, o)]
        if metadata_only:
            return [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                     "metadata": copy.deepcopy(o["metadata"])} for o in found]
        return copy.deepcopy(found)

    # ---- helpers for tests ----------------------------------------------------------------------
    def put(self, body: dict) -> dict:
        """Store an object as the API server would after a create (uid, generation, ...)."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._versions))
        meta.setdefault("creationTimestamp",
                        datetime.fromtimestamp(1_700_000_000 + next(self._clock), UTC)
                        .strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def of_kind(self, kind: str) -> list[dict]:
        return [o for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    def obj(self, kind: str, namespace: str, name: str) -> dict:
        return self.objects[(kind, namespace, name)]

    def writes(self) -> list[tuple[str, str, str, str]]:
        return [c for c in self.calls if c[0] != "get" and c[1] != "Event"]

    def events(self, name: str | None = None) -> list[dict]:
        return [e for e in self.of_kind("Event")
                if name is None or e["involvedObject"]["name"] == name]

    def _collect_garbage(self) -> None:
        """Owner references: delete objects whose owner is gone (what the GC controller does)."""
        while True:
            uids = {o["metadata"].get("uid") for o in self.objects.values()}
            orphans = [k for k, o in self.objects.items()
                       if any(r.get("uid") not in uids for r in o["metadata"].get("ownerReferences") or ())]
            if not orphans:
                return
            for k in orphans:
                del self.objects[k]

    def run_statefulsets(self) -> None:
        """Pods follow each StatefulSet: ordinals 0..replicas-1 exist with the current template
        (a pod of an older template is replaced), surplus ordinals are removed."""
        for sts in self.of_kind("StatefulSet"):
            meta, spec = sts["metadata"], sts["spec"]
            ns, name = meta["namespace"], meta["name"]
            revision = meta.get("annotations", {}).get(TEMPLATE_HASH_ANNOTATION, "")
            replicas = spec.get("replicas", 0)
            for pod in [p for p in self.of_kind("Pod") if p["metadata"]["namespace"] == ns
                        and p["metadata"]["name"].startswith(name + "-")
                        and p["metadata"]["name"][len(name) + 1:].isdigit()]:
                k = int(pod["metadata"]["name"][len(name) + 1:])
                outdated = pod["metadata"]["labels"].get("controller-revision-hash") != revision
                if k >= replicas or outdated:
                    del self.objects[("Pod", ns, pod["metadata"]["name"])]
            for k in range(replicas):
                pod_name = f"{name}-{k}"
                if ("Pod", ns, pod_name) in self.objects:
                    continue
                tpl = copy.deepcopy(spec["template"])
                labels = {**tpl["metadata"].get("labels", {}), POD_INDEX_LABEL: str(k),
                          "controller-revision-hash": revision}
                pod = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                    "ownerReferences": [{"kind": "StatefulSet", "name": name,
                                                         "uid": meta["uid"]}]},
                       "spec": tpl["spec"], "status": {"phase": "Pending"}}
                refusal = self.pod_admission(pod) if self.pod_admission else None
                if refusal:  # as the StatefulSet controller reports it
                    self._failed_create(ns, name, f"create Pod {pod_name} in StatefulSet {name} "
                                                  f"failed error: {refusal}")
                    continue
                self.put(pod)
            ready = sum(1 for p in self.of_kind("Pod") if p["metadata"]["namespace"] == ns
                        and p["metadata"]["name"].rsplit("-", 1)[0] == name
                        and p["status"].get("phase") == "Running")
            mine = [p for p in self.of_kind("Pod") if p["metadata"]["namespace"] == ns
                    and p["metadata"]["name"].rsplit("-", 1)[0] == name]
            updated = sum(1 for p in mine
                          if p["metadata"]["labels"].get("controller-revision-hash") == revision)
            sts["status"] = {"replicas": len(mine), "readyReplicas": ready,
                             "updatedReplicas": updated,
                             "observedGeneration": meta.get("generation", 1)}

    def _failed_create(self, namespace: str, statefulset: str, message: str) -> None:
        name = f"{statefulset}.failed-create"
        if ("Event", namespace, name) not in self.objects:
            self.put({"apiVersion": "v1", "kind": "Event", "reason": "FailedCreate",
                      "type": "Warning", "message": message,
                      "metadata": {"name": name, "namespace": namespace},
                      "involvedObject": {"kind": "StatefulSet", "name": statefulset}})

    def run_scheduler(self) -> None:
        """Bind every ungated, unbound pod to the node its nodeSelector names; it runs."""
        for pod in self.of_kind("Pod"):
            spec = pod["spec"]
            node = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
            if not spec.get("schedulingGates") and not spec.get("nodeName") and node:
                spec["nodeName"] = node
                pod["status"] = {"phase": "Running",
                                 "conditions": [{"type": "Ready", "status": "True"}]}

    def settle(self, rounds: int = 2) -> None:
        for _ in range(rounds):
            self.run_statefulsets()
            self.run_scheduler()
            self.run_statefulsets()

    def indexes(self) -> Indexes:
        """What kopf's indexes would hold for the objects stored now."""
        from mlsched.controller.app import watched

        found: dict[str, defaultdict] = {i.id: defaultdict(list)
                                         for w in watched.WATCHED for i in w.indexes}
        by_kind = {w.kind: w for w in watched.WATCHED}
        for (kind, ns, name), obj in self.objects.items():
            if kind not in by_kind:
                continue
            labels = obj["metadata"].get("labels") or {}
            common = dict(name=name, namespace=ns, body=obj, labels=labels, spec=obj.get("spec") or {})
            for index in by_kind[kind].indexes:
                if index.selects(labels):
                    for k, v in (index.build(**common) or {}).items():
                        found[index.id][k].append(v)
        return watched.indexes_from({k: dict(v) for k, v in found.items()})
