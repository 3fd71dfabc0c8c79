"""The shipped manifests on a fresh cluster, as a user installs them, and the operator under
the permissions they give it.

This module starts a control plane of its own (the session's is shared with tests that
assume the namespaced install, and the dev overlay binds the operator cluster-wide), with an
audit policy that logs every request of the operator's ServiceAccount.

1. `kubectl apply --server-side` of the rendered `dev` overlay (CRDs, RBAC, the model
   ConfigMaps, the Deployment, the namespace mlsched-dev with its `default` policy), a second
   time if the first came too early for the SchedulingPolicy's CRD, as the README says.
2. (What the install made, and every kustomization sent as a strict server-side dry run, need
   only an API server: e2e/apiserver/test_api_deploy_manifests.py, the apiserver-only tier.)
3. The operator runs with the Deployment's flags and a token of the ServiceAccount the
   overlay made (not the admin), and its model directory holds exactly what the model
   ConfigMaps hold, laid out as the Deployment mounts them: jobs run under the overlay's
   `default` policy, learned policies load the ConfigMaps' models, a job finishes and is
   deleted after its TTL.
4. The audit log then says what the operator asked for: every request is allowed by the
   overlay's RBAC (nothing missing), and every rule was used (nothing unused), except a
   short list of rules this run cannot reach, each with its reason.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from controlplane import ControlPlane
from dev_overlay import DEV_NAMESPACE, find
from plane_fixture import running_plane
from mlsched.controller.kube.constants import LEGACY_FINALIZER
from mlsched.formats import dataset_store
from mlsched.policies.decision_log import IntervalRecord
from mlsched_objects import (
    GROUP, REPO, VERSION, MLSched, condition, for_kwok, phase, sample, scheduling_policy,
)
from operator_identity import NAMESPACE, SERVICE_ACCOUNT, USER
from operator_process import OperatorProcess
from waiting import wait_for
from workload_emulator import WorkloadEmulator

INTERVAL_SCALE = 0.005  # 1200 s rounds every 6 s, as in operator_fixtures.py

#: Log every request of the operator's ServiceAccount (metadata only: who, what, the answer),
#: nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [USER]}, {"level": "None"}],
}

#: Rules of the dev overlay's RBAC that this run does not exercise, and why. Everything else
#: the overlay grants must show up in the audit log.
NOT_EXERCISED = {
    # Checked by the OwnerReferencesPermissionEnforcement admission plugin when children get
    # blockOwnerDeletion owner references; it is not a request, and this apiserver does not
    # enable that plugin.
    ("mlsched.io", "mljobs/finalizers", "update"),
    # Renewing the progress endpoint's certificate (within 30 days of expiry).
    ("", "secrets", "patch"),
    # Deleting a pod whose decided node changed (a node lost, a new placement): this run's
    # nodes stay Ready, and rounds keep jobs where they are.
    ("", "pods", "delete"),
}

#: Reads that follow a 409 on create (whose is the object of the job's name?): whether a run
#: makes one depends on timing (two handlers creating a job's children at once), so these
#: may or may not show up.
AFTER_A_CONFLICT = {("", "services", "get"), ("apps", "statefulsets", "get")}
#: Read only when a StatefulSet stays short of its pods for 5 s (the API server refusing them,
#: or a slow control plane): it may or may not show up.
WHEN_PODS_LAG = {("", "events", "list")}
#: The progress endpoint reads the reporting pod and its MLJob only when its indexes have not
#: seen them (a report right after a pod starts, or the emulator's last report for a job just
#: deleted: a CI run on a loaded machine made the MLJob read, 404): it may or may not show up.
WHEN_THE_INDEX_LAGS = {("", "pods", "get"), ("mlsched.io", "mljobs", "get")}


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster():
    yield from running_plane(ControlPlane(audit_policy=AUDIT_POLICY), lambda p: p.create_nodes(6))


@pytest.fixture(scope="module")
def api(cluster):
    api_client = cluster.api_client()
    yield api_client
    api_client.close()


# ------------------------------------------------------------------------------ tests


def mounted_models(api: client.ApiClient, deployment: dict, root: Path) -> Path:
    """What the kubelet would mount at /etc/mlsched/models: each projected volume's
    ConfigMaps (as stored in the API server) as files under the volume's mount path."""
    core = client.CoreV1Api(api)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    models_dir = env["MLSCHED_MODELS_DIR"]
    assert env["MLSCHED_ALLOWED_MODEL_DIRS"] == models_dir
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in pod["volumes"]:
        if "projected" not in volume:
            continue
        target = root / Path(mounts[volume["name"]]).relative_to(models_dir)
        target.mkdir(parents=True)
        for source in volume["projected"]["sources"]:
            config_map = core.read_namespaced_config_map(source["configMap"]["name"], NAMESPACE)
            for key, value in (config_map.binary_data or {}).items():
                (target / key).write_bytes(base64.b64decode(value))
            for key, value in (config_map.data or {}).items():
                (target / key).write_text(value)
    return root


def operator_as_its_service_account(cluster, api, deployment: dict, tmp_path: Path,
                                    models: Path) -> OperatorProcess:
    """The Deployment's container, run here: its flags and environment, but a token of the
    ServiceAccount the overlay made (TokenRequest, as the kubelet mints it) and the models
    directory above; the progress endpoint on 127.0.0.1, where the emulated pods report."""
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        SERVICE_ACCOUNT, NAMESPACE, {"spec": {"expirationSeconds": 3600}}).status.token
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": cluster.apiserver_url,
                                                 "certificate-authority": str(cluster.ca_cert_path)}}],
        "users": [{"name": USER, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": USER}}]}))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # The pod's own settings, minus the ones about where it runs.
    args = [a.replace("$(POD_NAME)", "mlsched-operator-e2e") for a in container["args"]
            if not a.startswith(("--port=", "--progress-url=", "--tls-secret="))]
    tls_secret = next(a.split("=", 1)[1] for a in container["args"]
                      if a.startswith("--tls-secret="))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(MLSCHED_MODELS_DIR=str(models), MLSCHED_ALLOWED_MODEL_DIRS=str(models))
    assert env.pop("MLSCHED_NAMESPACES") == ""  # every namespace, as OperatorProcess([]) does
    return OperatorProcess(kubeconfig, tmp_path / "operator.log", namespaces=[],
                           interval_scale=INTERVAL_SCALE, tls_secret=tls_secret,
                           extra_args=args, extra_env=env)


def audited_requests(cluster: ControlPlane) -> list[dict]:
    events = [json.loads(line) for line in cluster.audit_log_path.read_text().splitlines()]
    return [e for e in events if e["user"]["username"] == USER
            and e.get("stage") == "ResponseComplete" and "objectRef" in e]


def bound_rules(objects: list[dict]) -> list[tuple[dict, str | None]]:
    """(rule, namespace it applies in, None for everywhere) of every role the overlay binds to
    the operator's ServiceAccount."""
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("ClusterRole", "Role")}
    found = []
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or \
                subject not in binding.get("subjects", []):
            continue
        where = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        found += [(rule, where) for rule in role["rules"]]
    return found


def allows(rule: dict, where: str | None, request: dict) -> bool:
    ref = request["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return (ref.get("apiGroup", "") in rule["apiGroups"] and resource in rule["resources"]
            and request["verb"] in rule["verbs"]
            and (where is None or ref.get("namespace") == where)
            and (not rule.get("resourceNames") or ref.get("name") in rule["resourceNames"]))


def test_operator_runs_with_the_overlays_rbac_and_uses_all_of_it(cluster, api, dev, tmp_path):
    deployment = find(dev, "Deployment", "mlsched-operator")
    models = mounted_models(api, deployment, tmp_path / "models")
    operator = operator_as_its_service_account(cluster, api, deployment, tmp_path, models)
    jobs = MLSched(api, DEV_NAMESPACE)
    emulator = WorkloadEmulator(api, [DEV_NAMESPACE], tmp_path / "tokens",
                                time_scale=1 / INTERVAL_SCALE)
    # Objects an earlier version left with kopf's finalizer (an upgrade): the operator patches
    # it away, which is what its patch rights on both kinds are for.
    legacy = {"finalizers": [LEGACY_FINALIZER]}
    upgraded_policy = scheduling_policy("upgraded")
    upgraded_policy["metadata"].update(legacy)
    jobs.create(upgraded_policy)
    upgraded_job = for_kwok(sample("mljob-allreduce.yaml"))
    upgraded_job["metadata"] = {"name": "upgraded", **legacy}
    upgraded_job["spec"]["schedulingPolicy"] = "upgraded"
    jobs.create(upgraded_job)
    # A record of the retraining dataset left by an earlier `default` policy (deleted and
    # created again): with datasetLimit 1 the operator deletes it once the first interval with
    # a job closes, which is what its delete on ConfigMaps is for.
    earlier = IntervalRecord(namespace=DEV_NAMESPACE, policy="default", policy_uid="earlier",
                             interval=0, start="2026-01-01T00:00:00Z", end="2026-01-01T00:20:00Z",
                             length_s=1200, algorithms={}, nodes=1, reward=0.0)
    (stale,) = dataset_store.manifests(earlier, dataset_store.CLOSED)
    client.CoreV1Api(api).create_namespaced_config_map(DEV_NAMESPACE, stale)
    jobs.patch_policy("default", {"retraining": {"datasetLimit": 1}})
    operator.start()
    emulator.start()
    try:
        wait_for(lambda: not jobs.job("upgraded")["metadata"].get("finalizers")
                 and not jobs.policy("upgraded")["metadata"].get("finalizers"), 60,
                 "the operator to remove the earlier version's finalizer")
        # A job under the overlay's `default` policy runs; a short one finishes and its TTL
        # deletes it.
        jobs.create(for_kwok(sample("mljob-allreduce.yaml")))
        jobs.create(for_kwok(sample("mljob-resnet50-ps.yaml"), epochs=300, ttl=2))
        # The learned policies: the dl2 sample (no model named: the default from the model
        # directory, i.e. the ConfigMap), one naming a file of another ConfigMap by path, and
        # one naming a ConfigMap that is not there (refused, the fallback schedules).
        jobs.create(sample("schedulingpolicy-dl2.yaml"))
        path = str(models / "dl2" / "dl2-sl.onnx")
        jobs.create(scheduling_policy("dl2-sl", allocation="dl2", models={
            "allocation": {"dl2": {"path": path}}}))
        jobs.create(scheduling_policy("missing", allocation="dl2", models={
            "allocation": {"dl2": {"configMapKeyRef": {"name": "absent", "key": "m.onnx"}}}}))

        # Running, or already past it: a short job's phase follows its pods within a second,
        # and it may have trained its epochs before a poll sees Running.
        wait_for(lambda: phase(jobs.job("resnext110-allreduce")) in ("Running", "Succeeded"), 90,
                 "the all-reduce sample to run under the overlay's default policy",
                 describe=lambda: (jobs.job("resnext110-allreduce") or {}).get("status"))
        for name in ("dl2", "dl2-sl"):
            loaded = wait_for(lambda: (c := condition(jobs.policy(name), "ModelLoaded"))
                              and c["status"] == "True" and c, 60,
                              f"policy {name} to load its model from the ConfigMaps",
                              describe=lambda: condition(jobs.policy(name), "ModelLoaded"))
            assert loaded["reason"] == "ModelVerified", loaded
        refused = wait_for(lambda: condition(jobs.policy("missing"), "ModelLoaded"), 60,
                           "the policy with a missing ConfigMap to be judged")
        assert (refused["status"], refused["reason"]) == ("False", "ModelNotFound")
        wait_for(lambda: jobs.job("resnet50-ps") is None, 180,
                 "the short job to finish and be deleted after its TTL",
                 describe=lambda: (emulator.reports, emulator.last_error,
                                   phase(jobs.job("resnet50-ps"))))
        # Two intervals of `default` with a job recorded (the samples above finish within one):
        # the first made its dataset segment (create), the second was appended to it and the
        # first pruned (datasetLimit 1), conditional patches, which is what its patch on
        # ConfigMaps is for since the dataset keeps closed intervals in segments. The long job
        # is deleted while the operator runs, which takes its finalizer away.
        long_job = for_kwok(sample("mljob-allreduce.yaml"), epochs=1e9)
        long_job["metadata"]["name"] = "recorded"
        jobs.create(long_job)
        core, recorded = client.CoreV1Api(api), set()
        wait_for(lambda: recorded.update(r.interval for r in dataset_store.list_records(
                     core, DEV_NAMESPACE, "default") if r.policy_uid != "earlier")
                 or len(recorded) >= 2, 90, "two intervals of default recorded",
                 describe=lambda: sorted(recorded))
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, DEV_NAMESPACE, "mljobs", "recorded")
        wait_for(lambda: jobs.job("recorded") is None, 60, "the long job deleted")
        assert operator.running(), operator.log_tail()
    finally:
        emulator.stop()
        operator.stop()

    requests = audited_requests(cluster)
    rules = bound_rules(dev)
    # Nothing missing: the API server refused nothing, and every request is one the rules allow.
    refused = Counter((r["verb"], r["objectRef"]["resource"]) for r in requests
                      if r["responseStatus"]["code"] == 403)
    assert not refused, refused
    unexplained = {(r["verb"], r["objectRef"].get("apiGroup", ""), r["objectRef"]["resource"],
                    r["objectRef"].get("subresource", ""), r["objectRef"].get("namespace"))
                   for r in requests if not any(allows(rule, where, r) for rule, where in rules)}
    assert not unexplained, unexplained
    # Nothing unused: every (group, resource, verb) the rules grant was requested.
    used = {(group, resource, verb)
            for rule, where in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]
            if any(allows({**rule, "apiGroups": [group], "resources": [resource],
                           "verbs": [verb]}, where, r) for r in requests)}
    granted = {(group, resource, verb) for rule, _ in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    maybe = AFTER_A_CONFLICT | WHEN_PODS_LAG | WHEN_THE_INDEX_LAGS
    assert granted - used - maybe == NOT_EXERCISED, (
        f"granted but never requested: {sorted(granted - used - NOT_EXERCISED)}; "
        f"listed as not exercised but requested: {sorted(NOT_EXERCISED & used)}")
    print(f"\n{len(requests)} requests by the operator; rules used: {len(used)} of {len(granted)}"
          f" (after a conflict: {sorted(AFTER_A_CONFLICT & used)})")


# ---------------------------------------------------------- the README, typed as written


def readme_block(heading: str) -> list[list[str]]:
    """The commands of the first ```sh block under a README heading, comments dropped, each
    split as a shell would."""
    import re
    import shlex

    text = (REPO / "README.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def typed(cluster: ControlPlane, words: list[str]):
    """A README line as a user types it in the repository root (kubectl resolves `-k`
    paths against its working directory; this one runs from wherever pytest does)."""
    assert words[0] == "kubectl", words
    args = [str(REPO / w) if w.startswith("manifests/") else w for w in words[1:]]
    return cluster.kubectl(*args, check=False)


def test_the_readmes_install_and_uninstall_of_a_training_namespace_work_as_typed(cluster, dev):
    """The README's install creates the namespace it then uses (it used to apply into
    `team-a` without creating it: `namespaces "team-a" not found`), and its uninstall
    removes what the install made, each line exiting 0. Run after the other tests: it ends
    with the samples and the namespace gone.

    Two lines are not run: the operator's install (this module installs `overlays/dev`, one of
    the overlays the README's line names, in the `dev` fixture) and `rollout status` (the
    operator's own pod cannot run on kwok nodes; the test above runs it as a process)."""
    install = readme_block("Install with kustomize")
    assert install[0][:4] == ["kubectl", "apply", "--server-side", "-k"], install[0]
    namespaces = set()
    for words in install[1:]:
        if words[1:3] == ["-n", "mlsched-system"] and "rollout" in words:
            continue
        result = typed(cluster, words)
        assert result.returncode == 0, f"{' '.join(words)}:\n{result.stdout}{result.stderr}"
        if "-n" in words:
            namespaces.add(words[words.index("-n") + 1])
    assert namespaces == {"team-a"}
    team_a = MLSched(cluster.api_client(), "team-a")
    assert team_a.policy("default")["spec"]["allocation"] == "drf"  # the namespace's own
    assert team_a.policy("dl2") and {j["metadata"]["name"] for j in team_a.jobs()} == \
        {"resnet50-ps", "resnext110-allreduce"}

    # The uninstall's first line deletes every MLJob and policy of the cluster: one that an
    # earlier test of this module left with kopf's old finalizer (its operator failed before
    # releasing it) would hold it until kubectl gives up. Say that, not a timeout.
    held = [f"{o['metadata']['namespace']}/{o['metadata']['name']}"
            for plural in ("mljobs", "schedulingpolicies")
            for o in client.CustomObjectsApi(cluster.api_client()).list_cluster_custom_object(
                "mlsched.io", "v1alpha1", plural)["items"] if o["metadata"].get("finalizers")]
    assert not held, f"left with a finalizer by an earlier test (its operator failed?): {held}"
    uninstall = readme_block("Uninstall")
    for words in uninstall:
        if words[1:3] == ["delete", "-k"] and words[3].startswith("manifests/overlays/"):
            continue  # the operator's overlay: this module installed overlays/dev, not prod
        result = typed(cluster, words)
        assert result.returncode == 0, f"{' '.join(words)}:\n{result.stdout}{result.stderr}"
    left = cluster.kubectl("get", "namespace", "team-a", "--ignore-not-found").stdout
    assert left == "", left  # `kubectl delete namespace` waits until it is gone
