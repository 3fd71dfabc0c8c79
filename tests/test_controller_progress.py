"""The progress endpoint (TokenReview stubbed), the metrics endpoint and the client library."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mlsched import progress as client
from mlsched.controller import progress_server
from mlsched.controller.records import job_record
from test_controller_fixtures import NS, cluster, make_runtime, pod, ps_job

AUD = "mlsched.io/progress"


def review(pod_name, uid, namespace=NS, audiences=(AUD,)):
    return {"authenticated": True, "audiences": list(audiences),
            "user": {"username": f"system:serviceaccount:{namespace}:trainer",
                     "extra": {"authentication.kubernetes.io/pod-name": [pod_name],
                               "authentication.kubernetes.io/pod-uid": [uid]}}}


def world():
    rt, kube = make_runtime(cluster(1))
    for name in ("bert", "gpt"):
        kube.put(ps_job(name))
        kube.put(pod(name, "worker", 0, node_name="node-0"))
    kube.tokens["bert-token"] = review("bert-worker-0", "uid-bert-worker-0")
    kube.tokens["gpt-token"] = review("gpt-worker-0", "uid-gpt-worker-0")
    kube.tokens["stale-token"] = review("bert-worker-0", "uid-of-a-deleted-pod")
    kube.tokens["other-ns-token"] = review("bert-worker-0", "uid-bert-worker-0", namespace="team-b")
    kube.tokens["apiserver-token"] = review("bert-worker-0", "uid-bert-worker-0", audiences=("https://kubernetes.default.svc",))
    kube.tokens["unbound-token"] = {"authenticated": True, "audiences": [AUD],
                                    "user": {"username": f"system:serviceaccount:{NS}:trainer"}}
    rt.indexes = kube.indexes()
    return rt, kube


async def post(rt, payload, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with TestClient(TestServer(progress_server.make_app(rt))) as http:
        resp = await http.post("/v1/progress", data=json.dumps(payload), headers=headers)
        return resp.status, await resp.json()


def report(job="bert", epochs=3.0, **extra):
    return {"namespace": NS, "job": job, "epochsDone": epochs, **extra}


def test_a_pod_of_the_job_is_accepted_and_progress_lands_in_status():
    rt, kube = world()
    status, body = asyncio.run(post(rt, report(epochs=12.5), "bert-token"))
    assert status == 200 and body["accepted"]
    written = kube.obj("MLJob", NS, "bert")["status"]["progress"]
    assert written["epochsDone"] == 12.5 and written["summary"] == "12.5/100"
    assert written["lastReportTime"]
    assert ("patch-status", "MLJob", NS, "bert") in kube.calls
    assert rt.metrics.progress_reports.labels("accepted")._value.get() == 1


def test_a_pod_the_index_has_not_seen_yet_is_checked_against_the_api():
    """Right after a (re)start the pod index lags the API server: a legitimate pod must not
    be refused for that."""
    rt, kube = world()
    kube.put(pod("bert", "worker", 1, node_name="node-0"))  # in the API, not in the index
    kube.tokens["new-pod-token"] = review("bert-worker-1", "uid-bert-worker-1")
    assert not any(p.name == "bert-worker-1" for p in rt.indexes.pods.get((NS, "bert"), ()))
    status, body = asyncio.run(post(rt, report(epochs=4.0), "new-pod-token"))
    assert status == 200 and body["accepted"]
    assert kube.obj("MLJob", NS, "bert")["status"]["progress"]["epochsDone"] == 4.0


@pytest.mark.parametrize("token, job, code", [
    (None, "bert", 401),                 # no token
    ("forged", "bert", 401),             # TokenReview says no
    ("apiserver-token", "bert", 401),    # a token minted for another audience
    ("gpt-token", "bert", 403),          # a pod of another job
    ("stale-token", "bert", 403),        # the bound pod no longer exists (uid differs)
    ("other-ns-token", "bert", 403),     # ServiceAccount of another namespace
    ("unbound-token", "bert", 403),      # not bound to a pod at all
])
def test_refused_reports_change_nothing(token, job, code):
    rt, kube = world()
    status, body = asyncio.run(post(rt, report(job=job), token))
    assert status == code and not body["accepted"]
    assert "progress" not in (kube.obj("MLJob", NS, "bert").get("status") or {})


@pytest.mark.parametrize("payload", [{"job": "bert"}, report(epochs=-1), report(epochs="many"),
                                     report(epochs=float("inf"))])
def test_malformed_reports_are_400(payload):
    rt, _ = world()
    assert asyncio.run(post(rt, payload, "bert-token"))[0] == 400


def test_progress_is_monotonic_and_speed_is_measured():
    job = job_record({**ps_job("bert"), "metadata": {"name": "bert", "namespace": NS}})
    done, speed = progress_server.next_progress(job, (10.0, 1000.0, 0.0), 12.0, 1010.0)
    assert done == 12.0 and speed == pytest.approx(0.2)
    done, speed2 = progress_server.next_progress(job, (12.0, 1010.0, 0.2), 11.0, 1020.0)  # older checkpoint
    assert done == 12.0 and speed2 == pytest.approx(0.2)
    _, reported = progress_server.next_progress(job, None, 5.0, 1.0, speed=0.7)
    assert reported == 0.7


def test_metrics_and_health_endpoints():
    rt, _ = world()
    rt.metrics.watch_job_phases(lambda: {"Running": 2})

    async def scrape():
        async with TestClient(TestServer(progress_server.make_app(rt))) as http:
            metrics = await (await http.get("/metrics")).text()
            health = (await http.get("/healthz")).status
            return metrics, health

    metrics, health = asyncio.run(scrape())
    assert health == 200
    for name in ("mlsched_round_duration_seconds", "mlsched_decisions_total", "mlsched_reward",
                 "mlsched_model_load_failures_total", "mlsched_progress_reports_total"):
        assert f"# TYPE {name.removesuffix('_total')}" in metrics
    assert 'mlsched_jobs{phase="Running"} 2.0' in metrics


# ---- the client -------------------------------------------------------------------------------


def test_client_reads_its_settings_from_the_pod_environment(tmp_path):
    token = tmp_path / "token"
    token.write_text("bert-token\n")
    env = {"MLSCHED_PROGRESS_URL": "http://op/v1/progress", "MLSCHED_NAMESPACE": NS,
           "MLSCHED_JOB_NAME": "bert", "MLSCHED_TOKEN_FILE": str(token)}
    req = client.Reporter.from_env(env).request(4, speed=0.5)
    assert req.full_url == "http://op/v1/progress" and req.get_method() == "POST"
    assert req.get_header("Authorization") == "Bearer bert-token"
    assert json.loads(req.data) == {"namespace": NS, "job": "bert", "epochsDone": 4.0, "speed": 0.5}
    with pytest.raises(client.ProgressError):
        client.Reporter.from_env({})
    assert client.report(1.0) is False  # outside a training pod: a warning, not an exception


def test_client_round_trip_against_the_endpoint(tmp_path):
    rt, kube = world()
    token = tmp_path / "token"
    token.write_text("bert-token")
    results = {}

    async def serve():
        server = TestServer(progress_server.make_app(rt))
        await server.start_server()
        reporter = client.Reporter(url=str(server.make_url("/v1/progress")), namespace=NS,
                                   job="bert", token_file=str(token))
        # The client is synchronous (training loops are); run it off the event loop.
        results["ok"] = await asyncio.to_thread(reporter.report, 7)
        results["refused"] = await asyncio.to_thread(
            client.Reporter(url=reporter.url, namespace=NS, job="gpt", token_file=str(token)).report, 1)
        await server.close()

    asyncio.run(serve())
    assert results == {"ok": True, "refused": False}
    assert kube.obj("MLJob", NS, "bert")["status"]["progress"]["epochsDone"] == 7.0
