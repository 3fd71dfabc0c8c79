"""What a training pod can and cannot do, checked with real tokens on the real API.

Training pods run as the `mlsched-training` ServiceAccount (manifests/base/
training-rbac, as docs/operator.md tells users) and report progress with a token
bound to the pod. They must not be able to write MLJobs themselves, and one job's
pod must not be able to report for another job. Whoever reaches the endpoint cannot
make it flood the API server with TokenReviews.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mlsched import progress
from mlsched.controller.process.config import OperatorConfig
from mlsched_objects import (
    GROUP, VERSION, apply_training_rbac, for_kwok, mljob, sample, scheduling_policy,
)
from job_state import running_pod
from operator_fixtures import INTERVAL_SCALE
from pod_tokens import PROGRESS_AUDIENCE, client_with_token, request_token
from shipped_operator import shipped_operator_args
from signals import metric, utc_now, wait_for_rounds
from waiting import wait_for

TRAINING_SA = "mlsched-training"


def post_progress(url: str, namespace: str, job: str, token_file: Path,
                  epochs: float) -> tuple[int, dict]:
    """The report training code sends (mlsched.progress), and the HTTP answer to it."""
    reporter = progress.Reporter(url=url, namespace=namespace, job=job,
                                 token_file=str(token_file))
    try:
        with urllib.request.urlopen(reporter.request(epochs), timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@pytest.fixture
def training_jobs(api, mlsched, operator):
    """Two running jobs whose pods run as the training ServiceAccount."""
    apply_training_rbac(api, mlsched.namespace)
    mlsched.create(scheduling_policy("default"))
    mlsched.create(for_kwok(sample("mljob-allreduce.yaml"), service_account=TRAINING_SA))
    mlsched.create(for_kwok(mljob("other", ps=None, workers=(1, 1)),
                            service_account=TRAINING_SA))
    return {name: running_pod(mlsched, name) for name in ("resnext110-allreduce", "other")}


def test_training_pod_cannot_modify_mljobs(control_plane, api, mlsched, training_jobs):
    pod = training_jobs["resnext110-allreduce"]
    assert pod.spec.service_account_name == TRAINING_SA
    namespace = mlsched.namespace
    # The token a pod would use against the API server (default audience), bound to it.
    token = request_token(client.CoreV1Api(api), pod, audience=None)
    with client_with_token(control_plane, token) as as_pod:
        reviews = client.AuthorizationV1Api(as_pod)
        for verb, subresource in [("patch", ""), ("update", ""), ("delete", ""),
                                  ("create", ""), ("patch", "status"), ("update", "status")]:
            review = reviews.create_self_subject_access_review({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"group": GROUP, "resource": "mljobs",
                                                "subresource": subresource, "verb": verb,
                                                "namespace": namespace}}})
            assert review.status.allowed is False, (verb, subresource)

        # And really trying: marking its own job done, or changing its spec.
        custom = client.CustomObjectsApi(as_pod)
        for attempt in (
            lambda: custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "mljobs", "resnext110-allreduce",
                {"status": {"progress": {"epochsDone": 1e6}}}),
            lambda: custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "mljobs", "resnext110-allreduce",
                {"spec": {"epochs": 1}}),
        ):
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403
            assert f"system:serviceaccount:{namespace}:{TRAINING_SA}" in refused.value.body

    job = mlsched.job("resnext110-allreduce")
    assert job["spec"]["epochs"] == 50
    assert "progress" not in job.get("status", {})

    # The token the pod reports progress with is useless against the API server.
    progress_token = request_token(client.CoreV1Api(api), pod, audience=PROGRESS_AUDIENCE)
    with client_with_token(control_plane, progress_token) as with_progress_token:
        with pytest.raises(ApiException) as refused:
            client.CustomObjectsApi(with_progress_token).list_namespaced_custom_object(
                GROUP, VERSION, namespace, "mljobs")
        assert refused.value.status == 401


def test_progress_for_another_job_is_refused(api, mlsched, operator, training_jobs, tmp_path):
    core = client.CoreV1Api(api)
    pod = training_jobs["other"]
    token_file = tmp_path / "token"
    token_file.write_text(request_token(core, pod, audience=PROGRESS_AUDIENCE))
    namespace = mlsched.namespace

    # A pod of `other` claiming progress for resnext110-allreduce: 403, nothing recorded.
    status, answer = post_progress(operator.progress_url, namespace, "resnext110-allreduce",
                                   token_file, 49)
    assert status == 403, answer
    assert answer["accepted"] is False
    assert "is not a pod of MLJob" in answer["error"]
    assert "progress" not in mlsched.job("resnext110-allreduce").get("status", {})

    # The same pod and token for its own job: accepted and recorded.
    status, answer = post_progress(operator.progress_url, namespace, "other", token_file, 3)
    assert status == 200, answer
    wait_for(lambda: (mlsched.job("other")["status"].get("progress") or {})
             .get("epochsDone") == 3, 30, "the accepted report in the job's status")

    # A token minted for the API server, not for the progress endpoint: 401.
    token_file.write_text(request_token(core, pod, audience=None))
    status, answer = post_progress(operator.progress_url, namespace, "other", token_file, 4)
    assert status == 401, answer

    # No token at all: 401.
    request = urllib.request.Request(
        operator.progress_url, method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"namespace": namespace, "job": "other", "epochsDone": 5}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401

    assert mlsched.job("other")["status"]["progress"]["epochsDone"] == 3
    metrics = operator.metrics()
    assert re.search(r'mlsched_progress_reports_total\{result="forbidden"\} 1\.0', metrics)
    assert re.search(r'mlsched_progress_reports_total\{result="accepted"\} 1\.0', metrics)
    assert re.search(r'mlsched_progress_reports_total\{result="unauthenticated"\} 2\.0', metrics)


def test_report_right_after_an_operator_restart_is_accepted(api, mlsched, operator,
                                                             training_jobs, tmp_path):
    # The endpoint answers as soon as the operator starts, before its watches have listed
    # the pods: a pod of the job must not be refused then (its training would see a 403).
    pod = training_jobs["other"]
    token_file = tmp_path / "token"
    token_file.write_text(request_token(client.CoreV1Api(api), pod, audience=PROGRESS_AUDIENCE))
    operator.kill()
    answers: list[tuple[int, dict]] = []

    def first_answer() -> None:
        # Retries while nothing listens, so the first answer comes the moment the endpoint
        # is up, which is before the operator's pod index is filled.
        deadline = time.monotonic() + 120
        while not answers and time.monotonic() < deadline:
            try:
                answers.append(post_progress(operator.progress_url, mlsched.namespace, "other",
                                             token_file, 2))
            except OSError:
                time.sleep(0.01)

    reporter = threading.Thread(target=first_answer)
    reporter.start()
    operator.start()
    reporter.join()
    status, answer = answers[0]
    assert status == 200, answer
    wait_for(lambda: (mlsched.job("other")["status"].get("progress") or {})
             .get("epochsDone") == 2, 30, "the report in the job's status")


def post_with_token(url: str, token: str, namespace: str, job: str) -> int:
    request = urllib.request.Request(
        url, method="POST", data=json.dumps({"namespace": namespace, "job": job,
                                             "epochsDone": 1}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_junk_tokens_cost_a_bounded_number_of_token_reviews(api, mlsched, operator,
                                                            training_jobs, tmp_path):
    limits = OperatorConfig()  # the operator runs with the defaults, as the Deployment does
    namespace = mlsched.namespace
    started = time.monotonic()
    answers = [post_with_token(operator.progress_url, f"junk-{i}.{uuid.uuid4().hex}", namespace,
                               "other") for i in range(1000)]
    elapsed = time.monotonic() - started
    reviews = metric(operator.metrics(), "mlsched_token_reviews_total",
                     'result="unauthenticated"')
    # A burst, then the rate: not one review per junk token.
    bound = limits.token_review_burst + limits.token_review_rate * elapsed + 1
    assert 0 < reviews <= bound, (reviews, bound, elapsed)
    assert answers.count(401) == reviews and answers.count(429) == 1000 - reviews

    # One junk token sent again and again is reviewed once (its refusal is cached). Sent
    # until the limit lets its review through (answered 401, where 429 reviews nothing), not
    # after a fixed sleep.
    wait_for(lambda: post_with_token(operator.progress_url, "same-junk", namespace,
                                     "other") == 401,
             10 + 1.0 / limits.token_review_rate, "the junk token's review to be let through",
             interval=0.1)
    repeated = [post_with_token(operator.progress_url, "same-junk", namespace, "other")
                for _ in range(99)]
    assert set(repeated) == {401}
    after = metric(operator.metrics(), "mlsched_token_reviews_total", 'result="unauthenticated"')
    assert after - reviews == 1  # reviewed once, then answered from the cache

    # A valid report still gets through once the limit lets a review through: sent again
    # while answered 429 (as a reporter retries), which reviews nothing.
    token_file = tmp_path / "token"
    token_file.write_text(request_token(client.CoreV1Api(api), training_jobs["other"],
                                        audience=PROGRESS_AUDIENCE))
    status, answer = wait_for(
        lambda: (r := post_progress(operator.progress_url, namespace, "other", token_file, 3))[0]
        != 429 and r, 10 + 1.0 / limits.token_review_rate,
        "the limit to let the valid report's review through", interval=0.1)
    assert status == 200, answer
    wait_for(lambda: (mlsched.job("other")["status"].get("progress") or {})
             .get("epochsDone") == 3, 30, "the valid report in the job's status")


def test_the_endpoint_serves_https_as_shipped(api, mlsched, start_operator, tmp_path):
    shipped = shipped_operator_args()
    assert shipped.progress_url.startswith("https://") and shipped.tls_secret
    # The shipped TLS settings; the URL is this host's, where the endpoint listens in the tier.
    operator = start_operator(tls_secret=shipped.tls_secret)
    mlsched.create(scheduling_policy("default"))
    mlsched.create(for_kwok(mljob("other", ps=None, workers=(1, 1))))
    pod = running_pod(mlsched, "other")

    # What the pod is told: an https URL and the CA to check it with, the one in the Secret.
    env = {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
    url, ca = env["MLSCHED_PROGRESS_URL"], env["MLSCHED_PROGRESS_CA"]
    assert url == operator.progress_url and url.startswith("https://")
    secret_ns, secret_name = shipped.tls_secret.split("/")
    stored = client.CoreV1Api(api).read_namespaced_secret(secret_name, secret_ns)
    assert base64.b64decode(stored.data["ca.crt"]).decode() == ca

    # Plain HTTP gets no answer at all: the port speaks TLS only.
    token_file = tmp_path / "token"
    token_file.write_text(request_token(client.CoreV1Api(api), pod, audience=PROGRESS_AUDIENCE))
    with pytest.raises(OSError) as no_answer:
        post_progress(url.replace("https://", "http://"), mlsched.namespace, "other",
                      token_file, 9)
    assert not isinstance(no_answer.value, urllib.error.HTTPError)

    # The report as training code sends it, from the pod's environment: verified, accepted.
    reporter = progress.Reporter.from_env({**env, "MLSCHED_NAMESPACE": mlsched.namespace,
                                           "MLSCHED_TOKEN_FILE": str(token_file)})
    assert reporter.report(4, strict=True) is True
    wait_for(lambda: (mlsched.job("other")["status"].get("progress") or {})
             .get("epochsDone") == 4, 30, "the report over HTTPS in the job's status")
    # A client that does not trust that CA does not talk to the endpoint.
    stranger = progress.Reporter(url=url, namespace=mlsched.namespace, job="other",
                                 token_file=str(token_file))
    with pytest.raises(progress.ProgressError, match="CERTIFICATE_VERIFY_FAILED"):
        stranger.report(5, strict=True)

    # A restarted operator keeps the CA: the job's pods are not re-rendered (not restarted).
    template_hash = mlsched.statefulsets("other")["worker"].metadata.annotations
    operator.stop()
    restarted = utc_now()
    operator.start()
    # Two rounds of the new process (a positive signal that it has acted), not a fixed sleep.
    wait_for_rounds(mlsched, "default", 2, since=restarted, timeout=60 + 3 * 1200 * INTERVAL_SCALE)
    assert mlsched.statefulsets("other")["worker"].metadata.annotations == template_hash
    assert pod.metadata.uid in {p.metadata.uid for p in mlsched.pods("other")}

