"""The operator's HTTP endpoint: POST /v1/progress, GET /metrics, GET /healthz.

Progress reports are authenticated with the reporting pod's own ServiceAccount token
(audience-bound, projected into every training pod; see desired.pod_template):

1. TokenReview (authentication.k8s.io/v1) with our audience: the token must be valid, unexpired
   and minted for this endpoint, so a token meant for the API server is refused and ours is
   useless against the API server.
2. The review names the pod the token is bound to (user.extra pod-name / pod-uid). That pod must
   exist in the job's namespace with the same uid and carry `mlsched.io/job-name: <job>`.

So a pod can report progress for its own job only, and training pods never need (nor get) any
permission on MLJob objects: the operator writes the status. TokenReviews are cached and limited
in rate (token_reviews.py): junk tokens cost the API server a bounded number of reviews.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from mlsched.api import Progress
from mlsched.controller.kube.constants import EXTRA_POD_NAME, EXTRA_POD_UID, JOB_LABEL
from mlsched.controller.kube.kube import KubeError
from mlsched.controller.objects.job_records import JobRecord, job_record
from mlsched.controller.dataset.rewards import utc
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import ClusterView
from mlsched.controller.serving.serving_tls import ensure_serving_tls
from mlsched.controller.kube.token_reviews import Throttled, TokenReviews, retry_after_header

log = logging.getLogger("mlsched.controller.progress")
SPEED_SMOOTHING = 0.5  # weight of the newest measurement in the running speed average
RUNTIME = web.AppKey("runtime", Runtime)
REVIEWS = web.AppKey("token_reviews", TokenReviews)


class Refused(Exception):
    def __init__(self, status: int, result: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.result, self.headers = status, result, headers


def _first(extra: dict[str, Any], key: str) -> str | None:
    value = (extra or {}).get(key)
    if isinstance(value, list):
        return value[0] if value else None
    return value


def token_reviews(rt: Runtime) -> TokenReviews:
    return TokenReviews(rt.api.review_token, rate=rt.process.config.token_review_rate,
                        burst=rt.process.config.token_review_burst,
                        on_review=lambda result: rt.process.metrics.token_reviews.labels(result).inc())


async def authorize(rt: Runtime, reviews: TokenReviews, token: str | None, namespace: str,
                    job: str) -> str:
    """The reporting pod's name, or Refused."""
    if not token:
        raise Refused(401, "unauthenticated", "missing bearer token")
    try:
        review = await reviews(token, [rt.process.config.token_audience])
    except Throttled as err:
        raise Refused(429, "throttled", str(err),
                      {"Retry-After": retry_after_header(err.retry_after)}) from None
    except KubeError as err:
        raise Refused(503, "unavailable", f"TokenReview failed: {err}") from None
    if not review.get("authenticated"):
        raise Refused(401, "unauthenticated", review.get("error") or "token not authenticated")
    user = review.get("user") or {}
    pod_name, pod_uid = _first(user.get("extra"), EXTRA_POD_NAME), _first(user.get("extra"), EXTRA_POD_UID)
    if not pod_name or not pod_uid:
        raise Refused(403, "forbidden", "the token is not bound to a pod")
    parts = (user.get("username") or "").split(":")
    if parts[:2] != ["system", "serviceaccount"] or len(parts) != 4 or parts[2] != namespace:
        raise Refused(403, "forbidden", f"the token's ServiceAccount is not in namespace {namespace}")
    indexes = rt.cluster.indexes
    pods = indexes.pods.get((namespace, job), ()) if indexes else ()
    if not any(p.name == pod_name and p.uid == pod_uid for p in pods) and \
            not await _pod_of_job(rt, namespace, pod_name, pod_uid, job):
        raise Refused(403, "forbidden", f"pod {pod_name} is not a pod of MLJob {namespace}/{job}")
    return pod_name


def _terminating(cluster: ClusterView, namespace: str, job: str, pod_name: str) -> bool:
    pods = cluster.indexes.pods.get((namespace, job), ()) if cluster.indexes else ()
    return any(p.name == pod_name and p.deleting for p in pods)


def _older_than_counts(rt: Runtime, job: JobRecord, pod_name: str) -> bool:
    """Whether the reporting pod was made before the job's counts last changed (a round's
    rescale, not yet carried out: the StatefulSet has not replaced it). A pod the index has
    not seen yet is a new one. creationTimestamp has whole seconds: a pod made in the second
    of the change counts as new."""
    since = rt.jobs.counts_since.get(job.key)
    indexes = rt.cluster.indexes
    if since is None or indexes is None:
        return False
    found = [p for p in indexes.pods.get(job.key, ()) if p.name == pod_name]
    return bool(found) and found[0].created_s is not None and found[0].created_s < math.floor(since)


async def _pod_of_job(rt: Runtime, namespace: str, pod_name: str, pod_uid: str, job: str) -> bool:
    """The index is a cache that lags the API: right after an operator (re)start, before the
    pod watch has listed everything, and for a pod created a moment ago. A miss is therefore
    checked against the API server before a report of a legitimate pod is refused."""
    try:
        body = await rt.api.get("Pod", namespace, pod_name)
    except KubeError as err:
        if err.status != 403:
            raise Refused(503, "unavailable", f"reading pod {namespace}/{pod_name}: {err}") from None
        # A namespaced install may read pods only where it serves: a report from elsewhere.
        raise Refused(403, "forbidden", f"namespace {namespace} is not served by this operator") \
            from None
    meta = (body or {}).get("metadata") or {}
    return meta.get("uid") == pod_uid and (meta.get("labels") or {}).get(JOB_LABEL) == job


async def _job(rt: Runtime, namespace: str, name: str) -> JobRecord | None:
    """The MLJob from the index, or (on a miss, see _pod_of_job) from the API server."""
    job = rt.cluster.indexes.job(namespace, name) if rt.cluster.indexes else None
    if job is None:
        body = await rt.api.get("MLJob", namespace, name)
        job = job_record(body) if body else None
    return job


def next_progress(job: JobRecord, last: tuple[float, ...] | None, reported: float,
                  now: float, speed: float | None = None) -> tuple[float, float]:
    """(epochs done, epochs per second) after a report. Progress never goes back (a restart
    from an older checkpoint does not un-train an interval), and the speed is a running average
    of the epochs between reports over the time between them."""
    before, at, avg = last[:3] if last else (job.epochs_done, job.last_report_s, job.speed)
    done = max(before, reported)
    if speed is None:
        speed = avg
        if at is not None and now > at and done > before:
            measured = (done - before) / (now - at)
            speed = measured if avg <= 0 else SPEED_SMOOTHING * measured + (1 - SPEED_SMOOTHING) * avg
    return done, max(0.0, speed)


async def record_progress(rt: Runtime, job: JobRecord, reported: float, speed: float | None,
                          now: float | None = None,
                          samples_per_second: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    done, speed = next_progress(job, rt.jobs.progress.get(job.key), reported, now, speed)
    rt.jobs.progress[job.key] = (done, now, speed, samples_per_second)
    progress = Progress.of(done, job.epochs, speed, at=utc(now),
                           samples_per_second=samples_per_second).to_k8s()
    await rt.api.patch("MLJob", job.namespace, job.name, {"status": {"progress": progress}},
                       status=True)
    return progress


async def handle_progress(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    try:
        if not rt.process.leadership.leading:
            # A standby writes nothing; the Service selects the leader's pod, so only a stale
            # endpoint sends this here. The client retries with its next (cumulative) report.
            raise Refused(503, "standby", "this replica is standing by; report to the leader",
                          headers={"Retry-After": "1"})
        try:
            payload = await request.json()
            namespace, job_name = str(payload["namespace"]), str(payload["job"])
            epochs = float(payload["epochsDone"])
            speed = float(payload["speed"]) if payload.get("speed") is not None else None
            samples = payload.get("samplesPerSecond")
            samples = float(samples) if samples is not None else None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise Refused(400, "invalid", "expected JSON {namespace, job, epochsDone[, speed]"
                                          f"[, samplesPerSecond]}}: {err}")
        if not all(math.isfinite(v) and v >= 0 for v in (epochs, speed, samples) if v is not None):
            raise Refused(400, "invalid", "epochsDone, speed and samplesPerSecond must be finite "
                                          "and >= 0")
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        pod = await authorize(rt, request.app[REVIEWS], token, namespace, job_name)
        job = await _job(rt, namespace, job_name)
        if job is None:
            raise Refused(404, "invalid", f"MLJob {namespace}/{job_name} not found")
        if samples is not None and (_terminating(rt.cluster, namespace, job_name, pod)
                                    or _older_than_counts(rt, job, pod)):
            # Its last words after SIGTERM (a rescale), or a report of a pod the rescale has
            # not reached yet: measured at the counts being replaced, which the interval
            # records must not take for the new ones'.
            samples = None
        progress = await record_progress(rt, job, epochs, speed, samples_per_second=samples)
    except Refused as err:
        rt.process.metrics.progress_reports.labels(err.result).inc()
        # A flood is counted in the metrics; one warning per throttled request would be a
        # second flood, in the log.
        log.log(logging.DEBUG if err.status == 429 else logging.WARNING,
                "progress report refused (%d): %s", err.status, err)
        return web.json_response({"accepted": False, "error": str(err)}, status=err.status,
                                 headers=err.headers)
    rt.process.metrics.progress_reports.labels("accepted").inc()
    log.debug("MLJob %s/%s: pod %s reported %s epochs", namespace, job_name, pod, epochs)
    return web.json_response({"accepted": True, "progress": progress})


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[RUNTIME].process.metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def handle_health(request: web.Request) -> web.Response:
    """Liveness: the process answers (a standby replica too)."""
    return web.json_response({"ok": True})


async def handle_ready(request: web.Request) -> web.Response:
    """Readiness: serving, leader or standby (a warm standby is what a PodDisruptionBudget
    should count). Reports reach the leader because the Service selects its label
    (leadership.label_own_pod), not by readiness."""
    leading = request.app[RUNTIME].process.leadership.leading
    return web.json_response({"leading": leading}, status=200)


def make_app(rt: Runtime) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[RUNTIME] = rt
    app[REVIEWS] = token_reviews(rt)
    app.router.add_post("/v1/progress", handle_progress)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_health)
    app.router.add_get("/readyz", handle_ready)
    return app


async def serving_context(rt: Runtime) -> ssl.SSLContext | None:
    """The TLS context to serve with (None: plain HTTP). The CA that signed the certificate,
    when known, becomes part of every pod template (PodSettings.progress_ca), so this runs
    before any handler renders one."""
    config = rt.process.config
    cert, key, ca_pem = config.tls_cert, config.tls_key, None
    if config.tls_secret:
        host = urlsplit(config.progress_url).hostname or ""
        # Every replica serves HTTPS, a standby too (its answers say 503): the Secret is the
        # one write a replica makes without holding the Lease (leadership.py's fence).
        unfenced = getattr(rt.api, "unfenced", None)
        tls = await ensure_serving_tls(unfenced() if unfenced else rt.api, config.tls_secret,
                                       host)
        cert, key, ca_pem = tls.cert_file, tls.key_file, tls.ca_pem
    elif config.tls_ca:
        with open(config.tls_ca, encoding="utf-8") as f:
            ca_pem = f.read()
    if not (cert and key):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if ca_pem:
        rt.pod_settings = replace(rt.pod_settings, progress_ca=ca_pem)
    return context


async def start(rt: Runtime) -> web.AppRunner:
    ssl_context = await serving_context(rt)
    runner = web.AppRunner(make_app(rt), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", rt.process.config.port, ssl_context=ssl_context).start()
    log.info("progress endpoint, /metrics and /healthz on port %d%s", rt.process.config.port,
             " (TLS)" if ssl_context else "")
    return runner
