"""The progress endpoint (TokenReview stubbed), the metrics endpoint and the client library."""

from __future__ import annotations

import asyncio
import json
import math
import time
from datetime import UTC, datetime

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mlsched import progress as client
from mlsched.controller.progress import progress_server
from mlsched.controller.objects.job_records import job_record
from builders import AUD, NS, pod, progress_report as report, \
    progress_world as world, ps_job, review

async def post(rt, payload, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with TestClient(TestServer(progress_server.make_app(rt))) as http:
        resp = await http.post("/v1/progress", data=json.dumps(payload), headers=headers)
        return resp.status, await resp.json()


def test_a_pod_of_the_job_is_accepted_and_progress_lands_in_status():
    rt, kube = world()
    status, body = asyncio.run(post(rt, report(epochs=12.5), "bert-token"))
    assert status == 200 and body["accepted"]
    written = kube.obj("MLJob", NS, "bert")["status"]["progress"]
    assert written["epochsDone"] == 12.5 and written["summary"] == "12.5/100"
    assert written["lastReportTime"]
    assert ("patch-status", "MLJob", NS, "bert") in kube.calls
    assert rt.process.metrics.progress_reports.labels("accepted")._value.get() == 1


def test_a_pod_the_index_has_not_seen_yet_is_checked_against_the_api():
    """Right after a (re)start the pod index lags the API server: a legitimate pod must not
    be refused for that."""
    rt, kube = world()
    kube.put(pod("bert", "worker", 1, node_name="node-0"))  # in the API, not in the index
    kube.tokens["new-pod-token"] = review("bert-worker-1", "uid-bert-worker-1")
    assert not any(p.name == "bert-worker-1" for p in rt.cluster.indexes.pods.get((NS, "bert"), ()))
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
                                     report(epochs=float("inf")),
                                     report(samplesPerSecond=-3.0),
                                     report(samplesPerSecond="fast"),
                                     report(samplesPerSecond=float("nan"))])
def test_malformed_reports_are_400(payload):
    rt, _ = world()
    assert asyncio.run(post(rt, payload, "bert-token"))[0] == 400


def test_samples_per_second_lands_in_status_and_in_the_intervals_record():
    from datetime import UTC, datetime
    from mlsched.controller.dataset import rewards
    rt, kube = world()
    began = time.time() - 1
    status, _ = asyncio.run(post(rt, report(epochs=2.0, speed=0.01, samplesPerSecond=812.5),
                                 "bert-token"))
    assert status == 200
    written = kube.obj("MLJob", NS, "bert")["status"]["progress"]
    assert written["samplesPerSecond"] == 812.5 and written["speed"] == 0.01
    job = job_record(kube.obj("MLJob", NS, "bert"))
    interval = rewards.OpenInterval(3, datetime.fromtimestamp(began, UTC),
                                    {"bert": rewards.Grant(1, 2, {}, 0.0, 100.0),
                                     "gpt": rewards.Grant(1, 1, {}, 0.0, 100.0)})
    stale = (began - 60, 0.02, 400.0)  # reported before the interval: not its speed
    closed = rewards.close(interval, {"bert": 2.0, "gpt": 1.0},
                           {"bert": rt.jobs.measured(job), "gpt": stale})
    assert closed.history["bert"]["samplesPerSecond"] == 812.5
    assert closed.history["bert"]["speed"] == 0.01
    assert "samplesPerSecond" not in closed.history["gpt"] and "speed" not in closed.history["gpt"]
    # After an operator restart the status is what is known.
    rt.jobs.progress.clear()
    assert rt.jobs.measured(job_record(kube.obj("MLJob", NS, "bert")))[2] == 812.5


def test_a_speed_measured_before_the_counts_changed_is_not_recorded_as_theirs():
    """An admission step (a spec edit decided again at once) re-grants a job mid-interval: the
    interval's record carries the new counts, so only a speed reported since counts; and a pod
    being deleted (SIGTERM, saving) reports the epochs it reached, not its speed."""
    from datetime import UTC, datetime
    from mlsched.controller.dataset import rewards
    began = 1000.0
    interval = rewards.OpenInterval(4, datetime.fromtimestamp(began, UTC),
                                    {"bert": rewards.Grant(1, 3, {}, 0.0, 100.0, since=1010.0)})
    before = rewards.close(interval, {"bert": 1.0}, {"bert": (1005.0, 0.01, 250.0)})
    assert "samplesPerSecond" not in before.history["bert"]
    after = rewards.close(interval, {"bert": 1.0}, {"bert": (1012.0, 0.02, 700.0)})
    assert after.history["bert"]["samplesPerSecond"] == 700.0

    rt, kube = world()
    leaving = pod("bert", "worker", 0, node_name="node-0")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(leaving)
    rt.cluster.indexes = kube.indexes()
    status, _ = asyncio.run(post(rt, report(epochs=5.0, samplesPerSecond=250.0), "bert-token"))
    written = kube.obj("MLJob", NS, "bert")["status"]["progress"]
    assert status == 200 and written["epochsDone"] == 5.0 and "samplesPerSecond" not in written


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
    rt.process.metrics.watch_job_phases(lambda: {("team-a", "Running", "AllRolesReady"): 2,
                                                 ("team-a", "Pending", "WaitingForQuota"): 1,
                                                 ("team-b", "Pending", "CannotFit"): 1})

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
    assert 'mlsched_jobs{phase="Pending"} 2.0' in metrics and 'mlsched_jobs{phase="Failed"} 0.0' in metrics
    assert 'mlsched_jobs_by_reason{namespace="team-a",phase="Pending",reason="WaitingForQuota"} 1.0' in metrics
    assert 'mlsched_jobs_by_reason{namespace="team-a",phase="Running",reason="AllRolesReady"} 2.0' in metrics
    assert 'mlsched_jobs_by_reason{namespace="team-b",phase="Pending",reason="CannotFit"} 1.0' in metrics
    assert "mlsched_status_records_pending 0.0" in metrics


def test_pending_records_gauge_counts_what_is_queued():
    rt, _ = world()
    rt.writers.status.enqueue("MLJob", NS, "bert", fields={"phase": "Running"})
    rt.writers.status.enqueue("MLJob", NS, "gpt", fields={"phase": "Running"})
    assert b"mlsched_status_records_pending 2.0" in rt.process.metrics.render()


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


# ---- TokenReviews: cached, limited in rate ----------------------------------------------------


def test_junk_tokens_cost_a_bounded_number_of_token_reviews():
    rt, kube = world()

    async def flood():
        async with TestClient(TestServer(progress_server.make_app(rt))) as http:
            answers = []
            for i in range(1000):
                resp = await http.post("/v1/progress", data=json.dumps(report()),
                                       headers={"Authorization": f"Bearer junk-{i}"})
                answers.append((resp.status, resp.headers.get("Retry-After")))
            return answers

    started = time.monotonic()
    answers = asyncio.run(flood())
    elapsed = time.monotonic() - started
    reviews = sum(1 for c in kube.calls if c[1] == "TokenReview")
    # The burst, plus what the rate refills while the flood lasts (about a second; more on a
    # loaded machine, so the bound is computed from the time it really took).
    refill = rt.process.config.token_review_rate * elapsed
    assert rt.process.config.token_review_burst <= reviews <= rt.process.config.token_review_burst + refill + 1
    assert reviews < 1000 / 2  # most of the flood never reached the API server
    assert sum(status == 401 for status, _ in answers) == reviews
    throttled = [retry for status, retry in answers if status == 429]
    assert len(throttled) == 1000 - reviews and all(int(r) >= 1 for r in throttled)
    assert rt.process.metrics.token_reviews.labels("unauthenticated")._value.get() == reviews
    assert rt.process.metrics.progress_reports.labels("throttled")._value.get() == len(throttled)


def test_a_token_is_reviewed_once_while_cached_and_never_stored_raw():
    rt, kube = world()

    async def reports():
        async with TestClient(TestServer(progress_server.make_app(rt))) as http:
            out = []
            for token, epochs in [("bert-token", 1), ("bert-token", 2), ("junk", 1), ("junk", 1)]:
                resp = await http.post("/v1/progress", data=json.dumps(report(epochs=epochs)),
                                       headers={"Authorization": f"Bearer {token}"})
                out.append(resp.status)
            reviews = http.server.app[progress_server.REVIEWS]
            return out, list(reviews._cache)

    statuses, keys = asyncio.run(reports())
    assert statuses == [200, 200, 401, 401]
    assert sum(1 for c in kube.calls if c[1] == "TokenReview") == 2
    assert len(keys) == 2 and not any("bert-token" in k or "junk" in k for k in keys)


def test_cache_expiry_lru_bound_and_shared_in_flight_reviews():
    from mlsched.controller.kube.token_reviews import Throttled, TokenReviews

    now = [0.0]
    sent: list[str] = []

    async def review(token, audiences):
        sent.append(token)
        await asyncio.sleep(0.01)
        return {"authenticated": token.startswith("good")}

    reviews = TokenReviews(review, rate=1.0, burst=3, ok_ttl=60, refused_ttl=10, max_entries=2,
                           clock=lambda: now[0])

    async def scenario():
        # Ten concurrent reports with one token: one review.
        await asyncio.gather(*(reviews("good-1", [AUD]) for _ in range(10)))
        assert sent == ["good-1"]
        await reviews("bad", [AUD])
        now[0] = 11.0   # the refusal expired, the valid answer did not
        await reviews("bad", [AUD])
        await reviews("good-1", [AUD])
        assert sent == ["good-1", "bad", "bad"]
        await reviews("good-2", [AUD])  # LRU of two entries: good-1 ("bad" was older) stays
        assert len(reviews) == 2
        await reviews("good-3", [AUD])  # the third review since the bucket refilled at 11 s
        with pytest.raises(Throttled) as throttled:  # burst spent, 1/s refill: 1 s to wait
            await reviews("good-4", [AUD])
        assert throttled.value.retry_after == pytest.approx(1.0)
        assert sent[-1] == "good-3"
        now[0] = 12.0
        await reviews("good-4", [AUD])
        assert sent[-1] == "good-4"

    asyncio.run(scenario())


def test_a_standby_replica_takes_no_report_but_is_ready():
    from mlsched.controller.process.leadership import Leadership

    rt, kube = world()
    rt.process.leadership = Leadership(leading=False)
    status, body = asyncio.run(post(rt, report(epochs=5.0), "bert-token"))
    assert status == 503 and not body["accepted"]
    assert "progress" not in (kube.obj("MLJob", NS, "bert").get("status") or {})

    async def probe(path):
        async with TestClient(TestServer(progress_server.make_app(rt))) as http:
            return (await http.get(path)).status

    # Ready all the same: a PodDisruptionBudget counts Ready pods, and the Service finds the
    # leader by its pod label (leadership.label_own_pod), not by readiness.
    assert asyncio.run(probe("/healthz")) == 200 and asyncio.run(probe("/readyz")) == 200
    rt.process.leadership.hold_until(math.inf)  # as the election does when it wins the Lease
    rt.process.leadership.become_leader()
    assert asyncio.run(probe("/readyz")) == 200
    assert asyncio.run(post(rt, report(epochs=5.0), "bert-token"))[0] == 200


def test_a_pod_the_rescale_has_not_reached_yet_reports_no_speed_for_the_new_counts():
    """Between a round changing a job's counts and the StatefulSet replacing its pods, an old
    pod still trains and reports at the old counts; before, its samples/s went into the
    interval's record of the new counts (e2e/test_operator_training.py saw 3 workers recorded
    at 1 worker's 247 samples/s). A pod made since the change reports them as before."""
    rt, kube = world()
    old = pod("bert", "worker", 0, node_name="node-0")
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(old)
    rt.cluster.indexes = kube.indexes()
    rt.jobs.counts_since[(NS, "bert")] = datetime(2026, 1, 1, 0, 5, tzinfo=UTC).timestamp()
    status, _ = asyncio.run(post(rt, report(epochs=5.0, samplesPerSecond=250.0), "bert-token"))
    written = kube.obj("MLJob", NS, "bert")["status"]["progress"]
    assert status == 200 and written["epochsDone"] == 5.0 and "samplesPerSecond" not in written

    new = pod("bert", "worker", 0, node_name="node-0")
    new["metadata"]["creationTimestamp"] = "2026-01-01T00:05:00Z"  # the same second: new
    kube.put(new)
    rt.cluster.indexes = kube.indexes()
    status, _ = asyncio.run(post(rt, report(epochs=6.0, samplesPerSecond=700.0), "bert-token"))
    assert status == 200
    assert kube.obj("MLJob", NS, "bert")["status"]["progress"]["samplesPerSecond"] == 700.0
    rt.forget_job((NS, "bert"))
    assert (NS, "bert") not in rt.jobs.counts_since
