"""manifests/monitoring with Prometheus' own tools, on the real control plane.

1. `promtool check rules` and `promtool test rules` on the PrometheusRule's groups: every
   alert fires on the series it is for, with the labels and texts a receiver gets, and stays
   silent on healthy ones (manifests/monitoring/tests/rules-test.yaml).
2. (The kustomization applied to the API server with the Prometheus Operator's CRDs, strict
   field validation on, needs only an API server: e2e/apiserver/test_api_monitoring.py.)
3. A running operator scraped as the PodMonitor says: HTTPS to its port, the certificate
   verified against the CA in the Secret the PodMonitor names, under the PodMonitor's
   serverName; the exposition passes `promtool check metrics`, and holds every metric the
   rules and the dashboard query.
4. What the alerts read: a policy scheduling with its fallback says so in
   `mlsched_policy_fallback`, and a deleted policy's series leave /metrics (a dashboard never
   shows its last values as if it still ran).

promtool and the CRDs come from the Go module proxy (build_prometheus_tools.sh, about 4 minutes
cold, cached after). A failed build fails these tests with what to run; nothing is skipped.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import subprocess
from pathlib import Path

import yaml
from kubernetes import client

from dl2_model import configmap_ref
from mlsched_objects import for_kwok, mljob, scheduling_policy
from monitoring_manifests import MONITORING
from shipped_operator import shipped_operator_args
from signals import metric
from waiting import wait_for


def promtool(tools: Path, *args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tools / "promtool"), *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_the_alerts_fire_on_what_they_are_for_and_only_then(tools, tmp_path):
    (rule,) = yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    (tmp_path / "rules-test.yaml").write_text((MONITORING / "tests" / "rules-test.yaml").read_text())
    checked = promtool(tools, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = len([r for g in rule["spec"]["groups"] for r in g["rules"]])
    assert f"SUCCESS: {alerts} rules found" in checked.stdout
    tested = promtool(tools, "test", "rules", "rules-test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is exercised, firing at least once.
    cases = yaml.safe_load((tmp_path / "rules-test.yaml").read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}


def scrape(port: int, server_name: str, ca_pem: str) -> str:
    """GET /metrics as Prometheus does for the PodMonitor: to the pod's address (here the
    operator process's), the certificate checked against `ca_pem` under `server_name`."""
    context = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(f"GET /metrics HTTP/1.0\r\nHost: {server_name}\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.split()[1] == "200", head
    return body


def test_the_pod_monitor_scrapes_a_running_operator(api, mlsched, start_operator, tools, tmp_path):
    (monitor,) = yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    shipped = shipped_operator_args()
    # The Deployment's TLS Secret and URL: the certificate is made for the URL's host.
    operator = start_operator(tls_secret=shipped.tls_secret,
                              extra_args=["--progress-url", shipped.progress_url])
    ca_ref = endpoint["tlsConfig"]["ca"]["secret"]
    secret = client.CoreV1Api(api).read_namespaced_secret(ca_ref["name"], "mlsched-system")
    ca_pem = base64.b64decode(secret.data[ca_ref["key"]]).decode()

    body = scrape(operator.port, endpoint["tlsConfig"]["serverName"], ca_pem)
    linted = promtool(tools, "check", "metrics", cwd=tmp_path, stdin=body)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert re.search(r"^mlsched_leader 1\.0$", body, re.M), "this replica leads and says so"
    # Every metric the rules and the dashboard query is exposed by the running operator (a
    # labelled one before its first use as its HELP line).
    (rule,) = yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())
    queries = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    queries += [t["expr"] for p in json.loads((MONITORING / "dashboards" / "mlsched.json").read_text())["panels"]
                for t in p.get("targets", ())]
    families = set(re.findall(r"^# HELP (mlsched_[a-z_]+)", body, re.M))
    for name in {n for q in queries for n in re.findall(r"\bmlsched_[a-z_]+", q)}:
        assert name in families or re.sub(r"_(bucket|count|sum)$", "", name) in families, \
            f"{name} is queried but the running operator does not expose it"


def gauge(text: str, name: str, namespace: str, policy: str) -> float | None:
    """A policy's series, None when /metrics has none."""
    return metric(text, name, f'namespace="{namespace}",policy="{policy}"', default=None)


def test_a_policy_on_its_fallback_shows_and_a_deleted_policys_series_go(mlsched, operator):
    ns = mlsched.namespace
    mlsched.create(scheduling_policy("learned", allocation="dl2", fallback="drf",
                                     models={"allocation": {"dl2": configmap_ref("no-such-model")}}))
    mlsched.create(scheduling_policy("plain"))
    mlsched.create(for_kwok(mljob("a", ps=None, workers=(1, 1), epochs=1e9, policy="plain")))

    def shown() -> dict[str, float | None]:
        text = operator.metrics()
        return {"learned fallback": gauge(text, "mlsched_policy_fallback", ns, "learned"),
                "plain fallback": gauge(text, "mlsched_policy_fallback", ns, "plain"),
                "plain reward": gauge(text, "mlsched_reward", ns, "plain"),
                "plain rounds": gauge(text, "mlsched_round_duration_seconds_count", ns, "plain")}

    wait_for(lambda: (g := shown())["learned fallback"] == 1.0 and g["plain fallback"] == 0.0
             and g["plain reward"] is not None and g["plain rounds"], 90,
             "the fallback gauges, a closed interval's reward and counted rounds", describe=shown)
    mlsched.delete_all()
    wait_for(lambda: set(shown().values()) == {None}, 60,
             "the deleted policies' series to leave /metrics", describe=shown)
