"""The one seam between the operator and the API server.

Everything the operator writes (and the few reads not served by kopf's indexes) goes through a
`KubeApi`. Production uses `ClientKubeApi` (the official `kubernetes` client, run in threads so
the event loop never blocks); tests inject an in-memory fake with the same methods.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol

from mlsched.api import GROUP, VERSION
from mlsched.controller.kube.constants import COMPONENT
from mlsched.controller.kube.priority_slots import PrioritySlots

PatchType = Literal["merge", "strategic", "json"]
CONTENT_TYPES = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}
CUSTOM_PLURALS = {"MLJob": "mljobs", "SchedulingPolicy": "schedulingpolicies"}
#: Resource names for the request metric (plurals as in the API paths).
RESOURCES = {**CUSTOM_PLURALS, "StatefulSet": "statefulsets", "Pod": "pods",
             "Service": "services", "ConfigMap": "configmaps", "Event": "events",
             "Secret": "secrets", "TokenReview": "tokenreviews"}
#: Asking a list for metadata only (the dataset's records can be large: retention needs names).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
LIST_PAGE = 100
#: Collection paths of the built-in kinds the operator creates.
CREATE_PATHS = {"Service": "/api/v1/namespaces/{namespace}/services",
                "StatefulSet": "/apis/apps/v1/namespaces/{namespace}/statefulsets",
                "Pod": "/api/v1/namespaces/{namespace}/pods",
                "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
                "Event": "/api/v1/namespaces/{namespace}/events",
                "Secret": "/api/v1/namespaces/{namespace}/secrets"}
#: Which creates go first when the create slots are all taken (lowest first): what a new job's
#: pods wait on (its StatefulSets; dry runs, below, hold its admission) before its Service,
#: before what nothing waits on (Events, dataset records).
CREATE_PRIORITY = {"StatefulSet": 0, "Service": 1}
LAST = 2

#: The order status patches wait in: a job turning Running or ending, what its user waits for
#: (in a burst, 300 jobs' `New → Pending` patches queued ahead of the first jobs' `Running`,
#: issue 55); any other change of phase or reason; pod counts and the rounds' records.
STATUS_FIRST, STATUS_SOON, STATUS_ROUTINE = 0, 1, 2


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def rejected(self) -> bool:
        """The API server refused the object itself (invalid): retrying cannot help."""
        return self.status in (400, 422)

    @property
    def over_quota(self) -> bool:
        """The namespace's ResourceQuota has no room for the object (an object count such as
        `services` or `count/statefulsets.apps`): it may have once others go."""
        return self.status == 403 and "exceeded quota" in self.message


class NotLeading(KubeError):
    """A write refused before it was sent: this replica does not hold the Lease now
    (leadership.py's fence). Retrying is right: it is sent if the Lease is renewed."""

    def __init__(self) -> None:
        super().__init__(0, "not sent: this replica does not hold the leader Lease (fenced)")


def _message(err) -> str:
    """The API server's own explanation (Status.message), else the HTTP reason."""
    try:
        return json.loads(err.body)["message"]
    except (TypeError, ValueError, KeyError):
        return err.reason or str(err)


class KubeApi(Protocol):
    async def create(self, body: dict[str, Any]) -> bool:
        """Create an object (kind and namespace from the body); False if it already exists."""

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch(self, kind: str, namespace: str, name: str, patch: Any, *,
                    patch_type: PatchType = "merge", status: bool = False,
                    priority: int = STATUS_ROUTINE) -> bool:
        """Patch an object (or its status subresource); False if it does not exist.
        `priority`: where a status patch waits among the others (STATUS_FIRST first)."""

    def hurry_status(self, kind: str, namespace: str, name: str) -> None:
        """The object's status patch still waiting for a slot, if any, waits as STATUS_SOON."""

    async def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete (only the object with this uid, when given); False if it did not exist."""

    async def pod_warnings(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        """The Warning Events of a pod (FailedMount: a volume the kubelet cannot mount), oldest
        first."""

    async def dry_run_create(self, body: dict[str, Any]) -> None:
        """Create a pod with dryRun=All: every admission check runs, nothing is stored. Raises
        KubeError with the API server's refusal (controller/objects/preflight.py)."""

    async def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """A TokenReview's status: {authenticated, user: {username, extra, ...}, error}."""

    async def list(self, kind: str, namespace: str, label_selector: str, *,
                   metadata_only: bool = False) -> list[dict[str, Any]]:
        """The objects of a kind in a namespace matching a label selector (ConfigMaps:
        published model versions, dataset records; Services: services.py). `metadata_only`:
        kind, apiVersion and metadata of each (a PartialObjectMetadataList), not their data."""

    async def failed_creates(self, namespace: str, statefulset: str) -> list[dict[str, Any]]:
        """The `FailedCreate` Events of a StatefulSet (the API server refused its pods: a
        missing ServiceAccount, Pod Security, a LimitRange, a webhook), oldest first."""

    async def uids_at(self, path: str) -> set[str]:
        """The uids of the objects of a collection (`/api/v1/namespaces/team/pods`), listed as
        metadata only (relists.py: which were deleted while the watches were down?)."""


def load_api_client(pool_size: int = 16):
    """In-cluster credentials when running in a pod, else the current kubeconfig.

    The connection pool holds `pool_size` connections: with fewer than the calls in flight,
    urllib3 opens a new TLS connection for each extra call and discards it afterwards
    ("Connection pool is full"), which under load costs more than the calls themselves.
    """
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = max(pool_size, configuration.connection_pool_maxsize)
    return client.ApiClient(configuration)


def _request(fence: Callable[[], bool] | None, fn, args: tuple, kwargs: dict) -> bytes | None:
    """One call, run in a worker thread together with reading its body: the event loop never
    waits on a socket, and the connection is back in the pool when the thread is done (read
    later on the loop, it stayed checked out meanwhile and the next call opened another).
    A write (`fence` given) is sent only if the fence allows it at that moment: a write may
    wait in the slots for seconds, and the Lease may lapse meanwhile."""
    if fence is not None and not fence():
        raise NotLeading()
    response = fn(*args, _preload_content=False, **kwargs)
    try:
        return response.data
    finally:
        release = getattr(response, "release_conn", None)
        if release is not None:
            release()


class ClientKubeApi:
    def __init__(self, api_client=None, concurrency: int = 48, create_concurrency: int = 32,
                 user_agent: str | None = None):
        from kubernetes import client

        in_flight = concurrency + create_concurrency + max(1, concurrency // 3)  # all slots
        self._client = api_client or load_api_client(pool_size=in_flight)
        if user_agent:
            self._client.user_agent = user_agent
        self.api_client = self._client  # for the leader election's Lease requests
        self._core = client.CoreV1Api(self._client)
        self.core = self._core  # for the one watch the operator runs itself (cluster_pods.py)
        self._apps = client.AppsV1Api(self._client)
        self._custom = client.CustomObjectsApi(self._client)
        self._auth = client.AuthenticationV1Api(self._client)
        self._slots = asyncio.Semaphore(concurrency)
        # Creates (3 calls per new job, and Events) have slots of their own: a burst of
        # thousands of new MLJobs must not queue the scaling and pinning that admit the jobs
        # already waiting behind it (seen in bench_e2e: an admission step's patches waited a
        # minute behind 6,000 creates). More of them than of the rest: the API server
        # commits concurrent creates together, and a burst of 200 jobs' StatefulSets took
        # twice as long through 8 slots as through 32 (docs/e2e.md).
        # Served by priority (CREATE_PRIORITY): a burst's StatefulSets before its Services and
        # Events (priority_slots.py).
        self._create_slots = PrioritySlots(max(1, create_concurrency))
        # Status patches too: a job's phase turning Running must not wait behind the pins
        # and scale patches of the admission step that a burst keeps busy (issue 55: the
        # slowest of 300 jobs' phases lagged their pods by seconds behind them).
        # Served by priority (STATUS_FIRST, _SOON, _ROUTINE; jobs.status_priority): a job
        # turning Running or ending, then other phase changes, then the records and pod
        # counts queued with them (in a burst, up to six count patches per job).
        self._status_slots = PrioritySlots(max(1, concurrency // 3))
        # Whether writes may be sent now (leadership.Leadership.leading, set by the operator
        # when it runs as one of several replicas); None: always.
        self.fence: Callable[[], bool] | None = None
        # Called with (verb, resource) for every request sent (the Runtime counts them).
        self.on_request: Callable[[str, str], None] | None = None
        # Its own threads, as many as calls may be in flight: the loop's default executor has
        # min(32, CPUs + 4) threads (6 on 2 cores) and also runs the policies' decisions.
        self._threads = ThreadPoolExecutor(max_workers=in_flight,
                                           thread_name_prefix="mlsched-kube-api")

    def unfenced(self) -> ClientKubeApi:
        """The same client, its writes sent whether or not this replica leads: for what
        every replica needs of its own (the progress endpoint's certificate)."""
        view = copy.copy(self)
        view.fence = None
        return view

    async def _call(self, fn, *args, **kwargs) -> Any:
        """A read in one of the slots for everything but creates."""
        async with self._slots:
            return await self._send_in_thread(None, fn, args, kwargs)

    async def _write_call(self, fn, *args, _status: bool = False,
                          _priority: int = STATUS_ROUTINE, _tag: object = None,
                          **kwargs) -> Any:
        """A patch or delete, fenced: in the same slots as reads, a status patch in its own
        (by its priority)."""
        if _status:
            async with self._status_slots.slot(_priority, _tag):
                return await self._send_in_thread(self.fence, fn, args, kwargs)
        async with self._slots:
            return await self._send_in_thread(self.fence, fn, args, kwargs)

    async def _create_call(self, priority: int, fn, *args, **kwargs) -> Any:
        """A create (or its dry run) in one of the create slots, fenced."""
        async with self._create_slots.slot(priority):
            return await self._send_in_thread(self.fence, fn, args, kwargs)

    async def _send_in_thread(self, fence, fn, args: tuple, kwargs: dict) -> Any:
        from kubernetes.client.exceptions import ApiException

        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(self._threads, _request, fence, fn, args, kwargs)
        except ApiException as err:
            raise KubeError(err.status or 0, _message(err)) from None
        return json.loads(data) if data else None

    def _functions(self, kind: str) -> dict[str, Any]:
        c, a = self._core, self._apps
        table = {
            "Service": (c, "namespaced_service"),
            "StatefulSet": (a, "namespaced_stateful_set"),
            "Pod": (c, "namespaced_pod"),
            "ConfigMap": (c, "namespaced_config_map"),
            "Event": (c, "namespaced_event"),
            "Secret": (c, "namespaced_secret"),  # the endpoint's own TLS (serving_tls.py)
        }
        if kind in CUSTOM_PLURALS:
            return {}
        api, suffix = table[kind]
        return {verb: getattr(api, f"{verb}_{suffix}") for verb in ("create", "read", "patch", "delete")}

    def _post(self, path: str, body: dict[str, Any], query: list[tuple[str, str]], **_: Any):
        """POST a plain JSON body. Not through the typed create_* methods: those validate the
        body against the client's own models first and refuse a user's unknown pod-template
        field with a client-side error, before the API server can name it (and the
        operator's handling of refused objects never sees it)."""
        params = self._client.param_serialize(
            method="POST", resource_path=path, query_params=query, body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"])
        return self._send(params)

    def _get_metadata(self, path: str, query: list[tuple[str, str]], **_: Any):
        """GET a collection's metadata (a PartialObjectMetadataList) by path."""
        params = self._client.param_serialize(
            method="GET", resource_path=path, query_params=query,
            header_params={"Accept": METADATA_ONLY}, auth_settings=["BearerToken"])
        return self._send(params)

    def _send(self, params):
        from kubernetes.client.exceptions import ApiException

        response = self._client.call_api(*params)
        try:
            response.read()
        finally:
            release = getattr(response.response, "release_conn", None)
            if release is not None:
                release()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason,
                               body=(response.data or b"").decode(errors="replace"))
        return response

    async def uids_at(self, path: str) -> set[str]:
        uids: set[str] = set()
        token = None
        while True:  # in pages, as kopf lists
            if self.on_request is not None:
                self.on_request("list", path.rsplit("/", 1)[-1])
            query = [("limit", str(LIST_PAGE * 10))] + ([("continue", token)] if token else [])
            page = await self._call(self._get_metadata, path, query) or {}
            uids.update(((item.get("metadata") or {}).get("uid") or "")
                        for item in page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return uids - {""}

    def _count(self, verb: str, kind: str, status: bool = False) -> None:
        if self.on_request is not None:
            resource = RESOURCES.get(kind, kind.lower() + "s")
            self.on_request(verb, f"{resource}/status" if status else resource)

    async def create(self, body: dict[str, Any]) -> bool:
        kind, ns = body["kind"], body["metadata"]["namespace"]
        self._count("create", kind)
        # Strict: a field the server does not know (a typo in a user's pod template, `comand`)
        # is an error naming it, not a warning while the field is silently dropped.
        query = [("fieldManager", COMPONENT), ("fieldValidation", "Strict")]
        priority = CREATE_PRIORITY.get(kind, LAST)
        try:
            if kind in CUSTOM_PLURALS:
                await self._create_call(priority, self._custom.create_namespaced_custom_object,
                                        GROUP, VERSION, ns, CUSTOM_PLURALS[kind], body,
                                        field_manager=COMPONENT, field_validation="Strict")
            else:
                await self._create_call(priority, self._post,
                                        CREATE_PATHS[kind].format(namespace=ns), body, query)
        except KubeError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def dry_run_create(self, body: dict[str, Any]) -> None:
        kind, ns = body["kind"], body["metadata"]["namespace"]
        self._count("dry-run", kind)
        query = [("dryRun", "All"), ("fieldManager", COMPONENT), ("fieldValidation", "Strict")]
        # First among the creates: the job is held from admission until it is answered.
        await self._create_call(0, self._post, CREATE_PATHS[kind].format(namespace=ns), body, query)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._count("get", kind)
        try:
            if kind in CUSTOM_PLURALS:
                return await self._call(self._custom.get_namespaced_custom_object, GROUP, VERSION,
                                        namespace, CUSTOM_PLURALS[kind], name)
            return await self._call(self._functions(kind)["read"], name, namespace)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def patch(self, kind: str, namespace: str, name: str, patch: Any, *,
                    patch_type: PatchType = "merge", status: bool = False,
                    priority: int = STATUS_ROUTINE) -> bool:
        self._count("patch", kind, status)
        options = {"_content_type": CONTENT_TYPES[patch_type], "field_manager": COMPONENT,
                   "field_validation": "Strict"}
        try:
            if kind in CUSTOM_PLURALS:
                fn = (self._custom.patch_namespaced_custom_object_status if status
                      else self._custom.patch_namespaced_custom_object)
                await self._write_call(fn, GROUP, VERSION, namespace, CUSTOM_PLURALS[kind], name,
                                       patch, _status=status, _priority=priority,
                                       _tag=(kind, namespace, name), **options)
            elif kind == "Node":  # cluster-scoped: the pool labels of --label-nodes (pools.py)
                await self._write_call(self._core.patch_node, name, patch, **options)
            else:
                await self._write_call(self._functions(kind)["patch"], name, namespace, patch,
                                       **options)
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True

    def hurry_status(self, kind: str, namespace: str, name: str) -> None:
        self._status_slots.promote((kind, namespace, name), STATUS_SOON)

    async def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self._count("delete", kind)
        body = {"preconditions": {"uid": uid}} if uid else {}
        try:
            if kind in CUSTOM_PLURALS:
                await self._write_call(self._custom.delete_namespaced_custom_object, GROUP, VERSION,
                                 namespace, CUSTOM_PLURALS[kind], name, body=body)
            else:
                await self._write_call(self._functions(kind)["delete"], name, namespace, body=body)
        except KubeError as err:
            # 409: the uid precondition failed, i.e. the object was already replaced.
            if err.status in (404, 409):
                return False
            raise
        return True

    async def list(self, kind: str, namespace: str, label_selector: str, *,
                   metadata_only: bool = False) -> list[dict[str, Any]]:
        listing = {"ConfigMap": self._core.list_namespaced_config_map,
                   "Service": self._core.list_namespaced_service}.get(kind)
        if listing is None:
            raise ValueError(f"listing {kind} is not supported (the indexes hold it)")
        headers = {"Accept": METADATA_ONLY} if metadata_only else None
        items: list[dict[str, Any]] = []
        token = None
        while True:  # in pages: a policy's records may add up to more than one response should
            self._count("list", kind)
            page = await self._call(listing, namespace,
                                    label_selector=label_selector, limit=LIST_PAGE,
                                    _continue=token, _headers=headers)
            items += (page or {}).get("items") or []
            token = ((page or {}).get("metadata") or {}).get("continue")
            if not token:
                return items

    async def _events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        """One page of a namespace's Events matching `field_selector`, oldest first."""
        self._count("list", "Event")
        page = await self._call(self._core.list_namespaced_event, namespace, limit=LIST_PAGE,
                                field_selector=field_selector)
        events = (page or {}).get("items") or []
        return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    async def failed_creates(self, namespace: str, statefulset: str) -> list[dict[str, Any]]:
        return await self._events(namespace, f"involvedObject.kind=StatefulSet,"
                                             f"involvedObject.name={statefulset},reason=FailedCreate")

    async def pod_warnings(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        return await self._events(namespace, f"involvedObject.kind=Pod,involvedObject.name={pod},"
                                             f"type=Warning")

    async def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        self._count("create", "TokenReview")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": audiences}}
        result = await self._call(self._auth.create_token_review, body)
        return (result or {}).get("status") or {}
