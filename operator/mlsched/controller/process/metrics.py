"""Prometheus metrics (prefix `mlsched_`), on their own registry so tests can build several.

Labels stay low-cardinality: namespace and policy, never a job name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from mlsched.api import JobPhase

ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _JobsByPhase:
    """Counted at scrape time from the MLJob index, so the gauges can never drift: by phase
    (every phase, zeros included), and by namespace, phase and reason (the Running
    condition's, as `kubectl get mljobs` shows it; the triples present only), which says why
    jobs wait or are stuck (`WaitingForQuota`, `CannotFit`, `PodsCannotStart`, ...) and where:
    what an alert watches, and what it tells the namespace's owner."""

    def __init__(self, count: Callable[[], Mapping[tuple[str, str, str], int]]):
        self.count = count

    def collect(self):
        counts = self.count()
        by_phase: dict[str, int] = {}
        by_reason = GaugeMetricFamily("mlsched_jobs_by_reason", "MLJobs by namespace, phase and reason",
                                      labels=["namespace", "phase", "reason"])
        for (namespace, phase, reason), n in sorted(counts.items()):
            by_phase[phase] = by_phase.get(phase, 0) + n
            by_reason.add_metric([namespace, phase, reason], n)
        family = GaugeMetricFamily("mlsched_jobs", "MLJobs by phase", labels=["phase"])
        for phase in [p.value for p in JobPhase] + ["Unknown"]:
            family.add_metric([phase], by_phase.get(phase, 0))
        yield family
        yield by_reason


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.round_duration = Histogram(
            "mlsched_round_duration_seconds", "Wall time of one scheduling round (decide and apply)",
            ["namespace", "policy"], buckets=ROUND_BUCKETS, registry=r)
        self.decisions = Counter(
            "mlsched_decisions_total", "Scaling and placement changes applied",
            ["namespace", "policy", "kind"], registry=r)  # kind: scale | place | evict
        self.reward = Gauge("mlsched_reward", "Reward of the latest closed interval",
                            ["namespace", "policy"], registry=r)
        # Set every round: 1 while the policy's Ready condition says FallbackActive (a model
        # or algorithm it names is unusable, so its fallback schedules), else 0.
        self.fallback = Gauge("mlsched_policy_fallback",
                              "1 while the policy schedules with its fallback, else 0",
                              ["namespace", "policy"], registry=r)
        # Work conservation (controller/scheduling/conservation.py), set every round: what the waiting
        # jobs whose minimum would fit in the capacity the round left free would use of it
        # (resource gpus | cpus | tasks; 0 when the round was work conserving), and how many
        # rounds were not.
        self.idle_capacity = Gauge(
            "mlsched_work_conservation_idle",
            "Idle capacity the latest round left that waiting jobs' minimums would fit",
            ["namespace", "policy", "resource"], registry=r)
        self.nonconserving_rounds = Counter(
            "mlsched_rounds_not_work_conserving_total",
            "Rounds that left idle capacity a waiting job's minimum would fit",
            ["namespace", "policy"], registry=r)
        # ModelInDomain (controller/scheduling/domain.py), set every round a learned model serves: 1 when
        # the round is inside its card's trained domain, 0 outside; no series while only
        # heuristics serve or a card records no domain (the condition says Unknown).
        self.model_in_domain = Gauge(
            "mlsched_model_in_domain",
            "1 while the round is inside the served learned models' trained domain, 0 outside",
            ["namespace", "policy"], registry=r)
        # The regret guard (controller/scheduling/guard.py): 1 while the fallback serves because the
        # replayed window showed it ahead, 0 while the model serves; and the latest
        # estimates (normalised progress per hour; estimate learned | fallback | recorded).
        self.guard_tripped = Gauge(
            "mlsched_guard_tripped",
            "1 while the regret guard serves the fallback in place of the learned policy",
            ["namespace", "policy"], registry=r)
        self.guard_estimate = Gauge(
            "mlsched_guard_estimate",
            "The regret guard's latest window: normalised progress per hour, replayed or recorded",
            ["namespace", "policy", "estimate"], registry=r)
        self.model_load_failures = Counter(
            "mlsched_model_load_failures_total", "Failed attempts to load a learned model",
            ["namespace", "policy", "reason"], registry=r)
        self.progress_reports = Counter(
            "mlsched_progress_reports_total", "Progress reports received, by outcome",
            ["result"], registry=r)  # accepted | unauthenticated | forbidden | invalid | throttled
        # | unavailable. TokenReviews the endpoint actually sent (cache misses within the rate):
        self.token_reviews = Counter(
            "mlsched_token_reviews_total", "TokenReviews sent to the API server, by answer",
            ["result"], registry=r)  # authenticated | unauthenticated | error
        self.api_errors = Counter("mlsched_api_errors_total", "API calls that failed",
                                  ["action"], registry=r)
        self.displaced_tasks = Counter(
            "mlsched_displaced_tasks_total", "Tasks placed again between rounds because their "
            "node no longer took them", ["namespace", "policy", "cause"],
            registry=r)  # cause: node (drained, deleted, tainted, ...) | scheduler (refused)
        # Dry-run creates of a job's pods before it is given capacity (controller/objects/preflight.py):
        # verdict passed | refused (no capacity until the API server would take its pods).
        self.preflights = Counter(
            "mlsched_pod_preflights_total", "Jobs' pods checked with a dry-run create, by verdict",
            ["verdict"], registry=r)
        self.step_failures = Counter(
            "mlsched_step_failures_total", "Rounds and admission steps that raised (retried)",
            ["namespace", "policy", "step"], registry=r)  # step: round | admission
        # Every call the operator's KubeApi sends (kopf's own watches excepted): what a round,
        # a sweep or a report costs the API server. verb: create | get | patch | delete |
        # review | dry-run; resource: the kind (statefulsets, pods, mljobs/status, ...).
        self.api_requests = Counter("mlsched_api_requests_total", "Requests sent to the API server",
                                    ["verb", "resource"], registry=r)
        # Per pool of a grouping (controller/scheduling/pools.py): kind predicted (the grouping's forecast)
        # or observed (the forecast scaled by the members' reported over predicted speed);
        # resource compute | network. A pool's series go when the pool does.
        self.pool_utilisation = Gauge(
            "mlsched_pool_utilisation", "Predicted and observed utilisation per node pool",
            ["namespace", "policy", "pool", "resource", "kind"], registry=r)
        self._pool_series: dict[tuple[str, str], set[tuple[str, ...]]] = {}
        # Harmony's co-location model against the members' reported speed, pools of 2+ members
        # (controller/scheduling/grouping_guard.py): mean absolute relative error since start.
        self.colocation_error = Gauge(
            "mlsched_colocation_model_error",
            "Mean absolute relative error of the co-location model's predicted speed",
            ["namespace", "policy"], registry=r)

    def set_pools(self, namespace: str, policy: str,
                  rows: Mapping[str, Mapping[str, float]]) -> None:
        """The pools of one policy now (pool → {"predicted_compute": ..., ...}); series of
        pools (or observations) no longer there are removed."""
        now: set[tuple[str, ...]] = set()
        for pool, row in rows.items():
            for key, value in row.items():
                kind, resource = key.split("_", 1)
                labels = (namespace, policy, pool, resource, kind)
                self.pool_utilisation.labels(*labels).set(value)
                now.add(labels)
        for labels in self._pool_series.get((namespace, policy), set()) - now:
            self.pool_utilisation.remove(*labels)
        self._pool_series[(namespace, policy)] = now

    def forget_policy(self, namespace: str, policy: str) -> None:
        """A policy's loop has ended (deleted, or no longer served here): every series of it
        goes, so that a dashboard never shows a deleted policy's last values as if it still
        ran, and an operator that outlives many policies (a namespace per CI run) does not
        keep the series of all of them."""
        labels = {"namespace": namespace, "policy": policy}
        for metric in (self.round_duration, self.decisions, self.reward, self.fallback,
                       self.model_load_failures, self.displaced_tasks, self.step_failures,
                       self.pool_utilisation, self.idle_capacity, self.nonconserving_rounds,
                       self.model_in_domain, self.guard_tripped, self.guard_estimate,
                       self.colocation_error):
            metric.remove_by_labels(labels)
        self._pool_series.pop((namespace, policy), None)

    def watch_job_phases(self, count: Callable[[], Mapping[tuple[str, str, str], int]]) -> None:
        """`count`: MLJobs per (namespace, phase, reason); "Unknown" and "" where the status
        has none."""
        self.registry.register(_JobsByPhase(count))

    def watch_pending_records(self, pending: Callable[[], int]) -> None:
        """Status records queued or in flight (status_writer.py): 0 soon after each round;
        one that stays up means the API server refuses or throttles the writes."""
        gauge = Gauge("mlsched_status_records_pending",
                      "Objects with a status record not yet written", registry=self.registry)
        gauge.set_function(pending)

    def watch_leadership(self, leading: Callable[[], bool]) -> None:
        """1 on the replica that may write (holds the Lease, or runs without election), 0 on a
        standby: summed over the replicas it is 1 when all is well (manifests/monitoring
        alerts on 0 and on more than 1)."""
        gauge = Gauge("mlsched_leader", "1 when this replica leads (writes), 0 when it stands by",
                      registry=self.registry)
        gauge.set_function(lambda: 1.0 if leading() else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
