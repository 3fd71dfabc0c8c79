"""manifests/monitoring against the operator it watches: every metric and label the alerts and
the dashboard query is one the operator exports, the PodMonitor scrapes what the Deployment
serves, and every alert has a runbook. (The rules' behaviour, fired or not on given series, is
tested with promtool in e2e/test_monitoring.py.)"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from mlsched.controller.objects.lifecycle import NEEDS_ACTION
from mlsched.controller.process.loop_health import LoopHealth
from mlsched.controller.process.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "manifests" / "monitoring"
#: Labels Prometheus adds to every scraped series (a PodMonitor's target labels), and `le`.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "le"}
SELECTOR = re.compile(r"\b(mlsched_[a-z_]+)\s*(\{[^}]*\})?")
#: What the retraining alerts read of the retraining Jobs: kube-state-metrics' series (it ships
#: with kube-prometheus-stack), with the labels they are queried by.
KUBE_STATE_METRICS = {"kube_job_failed": {"namespace", "job_name", "condition"},
                      "kube_cronjob_status_last_successful_time": {"namespace", "cronjob"}}
KUBE_SELECTOR = re.compile(r"\b(kube_[a-z_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Every series name the operator exposes (as Prometheus sees them: counters with _total,
    histograms as _bucket/_count/_sum) → its label names."""
    metrics = Metrics()
    metrics.watch_job_phases(lambda: {("team-a", "Pending", "CannotFit"): 1})
    metrics.watch_pending_records(lambda: 0)
    metrics.watch_leadership(lambda: True)
    LoopHealth(metrics.registry)
    names: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        labels = set(getattr(family, "_labelnames", ()) or ())
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                    "gauge": ("",)}[family.type]
        for suffix in suffixes:
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    # A labelled metric shows no sample until used: its label names from the metric object
    # (prometheus_client keeps them, and the registry its collectors, in private fields).
    for collector, series in metrics.registry._collector_to_names.items():
        for name in series:
            if name in names:
                names[name] |= set(getattr(collector, "_labelnames", ()))
    return names


def rules() -> list[dict]:
    (rule,) = yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard() -> dict:
    return json.loads((MONITORING / "dashboards" / "mlsched.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", ())]


def all_exprs() -> list[tuple[str, str]]:
    return ([(r["alert"], r["expr"]) for r in rules()]
            + [(f"dashboard: {e[:40]}", e) for e in dashboard_exprs()])


@pytest.mark.parametrize("where, expr", all_exprs())
def test_every_queried_metric_and_label_is_one_the_operator_exports(where, expr):
    names = exported() | KUBE_STATE_METRICS
    used = SELECTOR.findall(expr) + KUBE_SELECTOR.findall(expr)
    assert used, f"{where}: no mlsched (or known kube-state-metrics) metric in {expr!r}"
    available = set(TARGET_LABELS)
    for name, matchers in used:
        assert name in names, f"{where}: {name} is not exported (has: {sorted(names)})"
        available |= names[name]
        for label in MATCHER.findall(matchers or ""):
            assert label in names[name] | TARGET_LABELS, f"{where}: {name} has no label {label!r}"
    for group in GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            assert label in available, f"{where}: grouping by {label!r}, which no queried metric has"


def test_the_stuck_jobs_alert_and_panel_watch_exactly_the_reasons_that_need_action():
    wanted = "|".join(NEEDS_ACTION)
    (alert,) = [r for r in rules() if r["alert"] == "MLSchedJobsNeedAction"]
    assert f'reason=~"{wanted}"' in alert["expr"]
    assert any(f'reason=~"{wanted}"' in e for e in dashboard_exprs())


def test_every_alert_has_a_severity_a_text_and_a_runbook_that_exists():
    docs = (REPO / "docs" / "monitoring.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", docs, re.M)}
    seen = set()
    for rule in rules():
        name = rule["alert"]
        assert name.startswith("MLSched") and name not in seen
        seen.add(name)
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        path, anchor = notes["runbook_url"].split("#")
        assert path == "docs/monitoring.md" and anchor == name.lower() and anchor in anchors, \
            f"{name}: runbook {notes['runbook_url']} has no heading in docs/monitoring.md"


def test_the_pod_monitor_scrapes_what_the_deployment_serves():
    (deployment,) = yaml.safe_load_all((REPO / "manifests" / "base" / "deployment.yaml").read_text())
    (monitor,) = yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text())
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    # Verified against the operator's CA, under the name its certificate is made for.
    secret_namespace, secret = args["tls-secret"].split("/")
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": secret, "key": "ca.crt"}
    assert secret_namespace == "mlsched-system"  # the kustomization's namespace: the monitor's
    host = args["progress-url"].split("//", 1)[1].split(":")[0].split("/")[0]
    assert endpoint["tlsConfig"]["serverName"] == host
    # The operator's own `namespace` label (the policy's) must not be overwritten by the pod's.
    assert endpoint["honorLabels"] is True and "namespace" in exported()["mlsched_reward"]


def test_the_dashboard_is_one_grafana_can_import():
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "policy"]
    names = exported()
    for name in ("namespace", "policy"):  # label_values(<metric>{...}, <label>)
        metric, label = re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?, (\w+)\)",
                                     variables[name]["query"]["query"]).groups()
        assert label == name and name in names[metric]
    used = {v for e in dashboard_exprs() for v in re.findall(r"\$(\w+)", e)} - {"__rate_interval"}
    assert used <= set(variables), f"panels use undefined variables {used - set(variables)}"
    cells = set()
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        for target in panel.get("targets", ()):
            assert target["datasource"]["uid"] == "${datasource}"
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    for path in kustomization["resources"] + kustomization["configMapGenerator"][0]["files"]:
        assert (MONITORING / path).is_file(), path


def test_the_leader_gauge_says_which_replica_writes():
    from mlsched.controller.process.leadership import Leadership
    from builders import make_runtime

    def leader_gauge(rt) -> str:
        return re.search(r"^mlsched_leader (\S+)$", rt.process.metrics.render().decode(), re.M).group(1)

    rt, _ = make_runtime()
    assert leader_gauge(rt) == "1.0"  # no election: it leads from the start
    rt.process.leadership = Leadership(leading=False)  # as handlers.py sets up a standby
    assert leader_gauge(rt) == "0.0"
    rt.process.leadership.hold_until(math.inf)  # as the election does when it wins the Lease
    rt.process.leadership.become_leader()
    assert leader_gauge(rt) == "1.0"


def test_a_forgotten_policy_leaves_no_series_and_its_neighbour_keeps_its_own():
    metrics = Metrics()
    for policy in ("gone", "kept"):
        metrics.round_duration.labels("team-a", policy).observe(0.2)
        metrics.decisions.labels("team-a", policy, "scale").inc()
        metrics.reward.labels("team-a", policy).set(0.5)
        metrics.fallback.labels("team-a", policy).set(1)
        metrics.step_failures.labels("team-a", policy, "round").inc()
        metrics.set_pools("team-a", policy, {"g0": {"predicted_compute": 0.8}})
        metrics.idle_capacity.labels("team-a", policy, "gpus").set(3)
        metrics.nonconserving_rounds.labels("team-a", policy).inc()
    metrics.forget_policy("team-a", "gone")
    text = metrics.render().decode()
    assert 'policy="gone"' not in text
    assert text.count('policy="kept"') >= 8
