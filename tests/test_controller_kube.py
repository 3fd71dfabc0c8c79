"""The production KubeApi against a recorded REST layer (no network): the URLs, verbs, patch
content types and error mapping the operator relies on, plus the kopf wiring."""

from __future__ import annotations

import importlib
import json

import kopf
import pytest
from kubernetes import client
from kubernetes.client.rest import RESTResponse

from mlsched.controller.app import startup, watched
from mlsched.controller.kube.kube import STATUS_FIRST, STATUS_ROUTINE, STATUS_SOON, ClientKubeApi
from builders import NS, run


class Raw:
    def __init__(self, status: int, payload: dict | None):
        self.status, self.reason = status, {200: "OK", 201: "Created", 404: "Not Found",
                                            409: "Conflict", 500: "Boom"}.get(status, "")
        self.data = json.dumps(payload or {}).encode()
        self.headers = {"content-type": "application/json"}

    def getheaders(self):
        return self.headers


@pytest.fixture
def recorded():
    api_client = client.ApiClient(client.Configuration(host="https://apiserver.invalid"))
    requests, replies = [], []

    def request(method, url, headers=None, body=None, post_params=None, _request_timeout=None):
        requests.append({"method": method, "url": url, "headers": headers or {}, "body": body})
        status, payload = replies.pop(0) if replies else (200, {})
        return RESTResponse(Raw(status, payload))

    api_client.rest_client.request = request
    return ClientKubeApi(api_client), requests, replies


def test_patch_content_types_and_urls(recorded):
    api, requests, _ = recorded
    run(api.patch("Pod", NS, "p", {"spec": {}}, patch_type="strategic"))
    run(api.patch("StatefulSet", NS, "s", [{"op": "replace", "path": "/spec/replicas", "value": 1}],
                  patch_type="json"))
    run(api.patch("MLJob", NS, "j", {"status": {"phase": "Running"}}, status=True))
    pod, sts, job = requests
    assert pod["method"] == "PATCH" and pod["url"].startswith(f"https://apiserver.invalid/api/v1/namespaces/{NS}/pods/p")
    assert pod["headers"]["Content-Type"] == "application/strategic-merge-patch+json"
    assert "fieldManager=mlsched-operator" in pod["url"]
    assert sts["headers"]["Content-Type"] == "application/json-patch+json" and "/apis/apps/v1/" in sts["url"]
    assert job["url"].split("?")[0].endswith(f"/apis/mlsched.io/v1alpha1/namespaces/{NS}/mljobs/j/status")
    assert job["headers"]["Content-Type"] == "application/merge-patch+json"


def test_errors_map_to_booleans_or_raise(recorded):
    api, requests, replies = recorded
    replies += [(409, {}), (404, {}), (404, {}), (409, {}), (500, {})]
    assert run(api.create({"kind": "Service", "metadata": {"namespace": NS, "name": "s"}})) is False
    assert run(api.get("ConfigMap", NS, "missing")) is None
    assert run(api.patch("Pod", NS, "gone", {})) is False
    assert run(api.delete("Pod", NS, "replaced", uid="u1")) is False  # uid precondition failed
    with pytest.raises(Exception, match="500"):
        run(api.patch("Pod", NS, "p", {}))
    delete = requests[3]
    assert delete["method"] == "DELETE" and delete["body"] == {"preconditions": {"uid": "u1"}}


def test_token_review(recorded):
    api, requests, replies = recorded
    replies.append((201, {"status": {"authenticated": True, "user": {"username": "system:serviceaccount:a:b"}}}))
    status = run(api.review_token("tok", ["mlsched.io/progress"]))
    assert status["authenticated"] is True
    sent = requests[0]
    assert sent["url"].endswith("/apis/authentication.k8s.io/v1/tokenreviews")
    assert sent["body"]["spec"] == {"token": "tok", "audiences": ["mlsched.io/progress"]}


def test_handlers_are_registered_for_the_right_resources():
    importlib.import_module("mlsched.controller.app.handlers")  # registers the event handlers
    registry = kopf.get_default_registry()
    ids = {h.id for h in registry._indexing.get_all_handlers()}
    assert ids >= {"node_index", "pod_index", "foreign_pod_index", "statefulset_index",
                   "mljob_index", "policy_index", "quota_index", "limit_range_index",
                   "runtime_class_index", "priority_class_index"}
    # No daemon, timer or change handler: kopf would put a finalizer (and the whole spec, as an
    # annotation) on every MLJob and SchedulingPolicy (supervision.py says why).
    assert not list(registry._spawning.get_all_handlers())
    assert not list(registry._changing.get_all_handlers())
    watching = {h.id for h in registry._watching.get_all_handlers()}
    assert watching >= {"policy_event", "mljob_event", "statefulset_event", "pod_event",
                        "node_event", "foreign_pod_event", "quota_event"}
    # Index kwargs are named after the index functions: indexes_from must find every one.
    watched.indexes_from({i: {} for i in ids})


def test_startup_settings_keep_kopf_state_in_our_annotations():
    settings = kopf.OperatorSettings()
    startup.configure(settings)
    assert settings.persistence.finalizer == "mlsched.io/finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "mlsched.io"
    diffbase = settings.persistence.diffbase_storage
    keys = list(diffbase.make_keys(diffbase.key, body=kopf.Body({"metadata": {"name": "x"}})))
    assert keys == ["mlsched.io/last-handled-configuration"]


def test_no_diff_base_is_built_for_watch_events():
    """Only change handlers read kopf's diff base and we have none: building it (a deep copy of
    every watched body) would be wasted on every pod, StatefulSet and MLJob event."""
    settings = kopf.OperatorSettings()
    startup.configure(settings)
    diffbase = settings.persistence.diffbase_storage
    history = [{"interval": k, "epochs": 0.5} for k in range(50)]
    body = kopf.Body({"metadata": {"name": "x", "annotations": {
        "mlsched.io/last-handled-configuration": '{"spec": {}}'}},
        "spec": {"epochs": 3}, "status": {"history": history}})
    assert diffbase.build(body=body) == {}
    assert diffbase.fetch(body=body) is None


def test_create_sends_the_body_as_written_with_strict_field_validation(recorded):
    # The typed client would refuse an unknown field itself (a pydantic error, before any
    # request); the API server must see it, name it, and the job fail with its message.
    api, requests, replies = recorded
    body = {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "s", "namespace": NS},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "comand": ["x"]}]}}}}
    replies.append((422, {"message": 'StatefulSet.apps "s" is invalid: unknown field '
                                     '"spec.template.spec.containers[0].comand"'}))
    with pytest.raises(Exception) as refused:
        run(api.create(body))
    assert refused.value.rejected and "comand" in refused.value.message
    (sent,) = requests
    assert sent["method"] == "POST"
    assert sent["url"].split("?")[0].endswith(f"/apis/apps/v1/namespaces/{NS}/statefulsets")
    assert "fieldValidation=Strict" in sent["url"] and "fieldManager=mlsched-operator" in sent["url"]
    assert sent["body"]["spec"]["template"]["spec"]["containers"][0]["comand"] == ["x"]
    replies.append((201, body))
    assert run(api.create({**body, "kind": "Service", "apiVersion": "v1"})) is True
    assert requests[-1]["url"].split("?")[0].endswith(f"/api/v1/namespaces/{NS}/services")


def test_every_request_is_counted_by_verb_and_resource(recorded):
    from mlsched.controller.scheduling.runtime import Process, Runtime
    from mlsched.controller.process.config import OperatorConfig
    from mlsched.controller.serving.models import ModelResolver

    api, requests, replies = recorded
    rt = Runtime(process=Process(OperatorConfig()), api=api, models=ModelResolver(None))
    run(api.patch("StatefulSet", NS, "s", [], patch_type="json"))
    run(api.patch("MLJob", NS, "j", {"status": {}}, status=True))
    run(api.get("Pod", NS, "p"))
    text = rt.process.metrics.render().decode()
    assert 'mlsched_api_requests_total{resource="statefulsets",verb="patch"} 1.0' in text
    assert 'mlsched_api_requests_total{resource="mljobs/status",verb="patch"} 1.0' in text
    assert 'mlsched_api_requests_total{resource="pods",verb="get"} 1.0' in text


def test_a_flood_of_creates_leaves_slots_for_scaling_and_pinning():
    """Creates have slots of their own: the patches that admit jobs already waiting are sent
    while thousands of new jobs' children are still being created."""
    import asyncio
    import threading

    api_client = client.ApiClient(client.Configuration(host="https://apiserver.invalid"))
    release = threading.Event()
    in_flight = {"POST": 0, "PATCH": 0}
    lock = threading.Lock()

    def request(method, url, headers=None, body=None, post_params=None, _request_timeout=None):
        with lock:
            in_flight[method] += 1
        if method == "POST":
            release.wait(10)  # an API server slow to create
        return RESTResponse(Raw(200, {}))

    api_client.rest_client.request = request
    api = ClientKubeApi(api_client, concurrency=4, create_concurrency=3)

    async def scenario():
        creates = [asyncio.create_task(api.create(
            {"kind": "Service", "metadata": {"namespace": NS, "name": f"s{i}"}})) for i in range(20)]
        # Until the create slots are full (sent, held by the slow API server): a state, not a
        # time budget, which a loaded machine can overrun.
        for _ in range(10_000):
            with lock:
                if in_flight["POST"] >= 3:
                    break
            await asyncio.sleep(0.001)
        patched = await asyncio.wait_for(api.patch("StatefulSet", NS, "s", {"spec": {"replicas": 1}}), 5)
        posts_meanwhile = in_flight["POST"]
        release.set()
        await asyncio.gather(*creates)
        return patched, posts_meanwhile

    patched, posts_meanwhile = asyncio.run(scenario())
    assert patched and posts_meanwhile == 3  # the 3 create slots full, the patch sent anyway


def test_status_patches_are_sent_by_priority():
    """A job turning Running is sent before other jobs' phase changes (a burst's 300
    `New -> Pending`), and those before the records and pod counts queued for the status
    slots (in a burst, a job's Running waited behind other jobs' counts)."""
    import asyncio
    import json
    import threading

    api_client = client.ApiClient(client.Configuration(host="https://apiserver.invalid"))
    release = threading.Event()
    sent: list[str] = []
    lock = threading.Lock()

    def request(method, url, headers=None, body=None, post_params=None, _request_timeout=None):
        with lock:
            sent.append(url.rsplit("/", 2)[-2])
        release.wait(10)  # an API server slow to answer
        return RESTResponse(Raw(200, {}))

    api_client.rest_client.request = request
    api = ClientKubeApi(api_client, concurrency=3)  # one status slot

    async def scenario():
        def patch(name, priority=STATUS_ROUTINE):
            return asyncio.create_task(api.patch("MLJob", NS, name, {"status": {}}, status=True,
                                                 priority=priority))
        async def until(condition):  # a state, not a time budget
            for _ in range(10_000):
                with lock:
                    if condition():
                        return
                await asyncio.sleep(0.001)
            raise AssertionError("not reached")

        def queued():
            return len(api._status_slots._waiting)

        tasks = [patch("first")]
        await until(lambda: sent == ["first"])  # "first" holds the slot (sent, not answered)
        tasks += [patch(f"count-{i}") for i in range(3)]
        tasks += [patch(f"pending-{i}", STATUS_SOON) for i in range(2)]
        await until(lambda: queued() == 5)
        tasks.append(patch("running", STATUS_FIRST))
        await until(lambda: queued() == 6)
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert sent[:4] == ["first", "running", "pending-0", "pending-1"], json.dumps(sent)
