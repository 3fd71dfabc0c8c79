"""ResourceQuotas on the counted resources, on the real control plane: an extended resource
(`requests.example.com/nic`) and devices of a DRA DeviceClass
(`<class>.deviceclass.resource.k8s.io/devices`, which the quota counts on each ResourceClaim
kube-controller-manager makes for a pod). The operator plans within them as within a CPU or
GPU quota (controller/admission/quotas.py): a job is never scaled past what they leave, one whose
minimum they can never hold is told so, and one waiting for others' usage says so.

Found on the plane before: DRF scaled a job of NIC-requesting workers past a 2-NIC quota; the
API server refused the pods beyond it (`FailedCreate`) while the plan held their nodes. With a
2-device quota, four claiming workers were created; kube-controller-manager could not make
the claims of two (`exceeded quota`), so those two stayed Pending for good."""

from __future__ import annotations

import contextlib

from kubernetes import client

from dra_objects import DRA, claim_template, claiming, published_devices
from job_state import (
    placed_as_decided, placement_problems, refused_for_good, running_reason, wait_all_running,
)
from mlsched_objects import DAY, mljob, scheduling_policy
from node_fixtures import NODES, POOL, labelled, node_allocatable, small_workers
from waiting import wait_for


def _told(mlsched, name: str, reason: str) -> str:
    found, message = wait_for(lambda: (r := running_reason(mlsched, name)) and r[0] == reason and r, 60,
                              f"{name} to say {reason}", describe=lambda: running_reason(mlsched, name))
    assert mlsched.pods(name) == []
    return message


def _pending_for_good(mlsched, name: str) -> list[str]:
    return [p.metadata.name for p in mlsched.pods(name) if p.status.phase != "Running"]


def test_a_quota_on_an_extended_resource_is_planned_within(api, mlsched, operator):
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(mlsched.namespace, {
        "metadata": {"name": "nics"}, "spec": {"hard": {"requests.example.com/nic": "2"}}})
    with labelled(core, NODES, POOL, "yes"), node_allocatable(core, NODES, nic="4"):
        mlsched.create(scheduling_policy("default", allocation="drf", interval=DAY))
        # DRF would give it all 4 workers (12 NICs free); the quota leaves 2.
        mlsched.create(small_workers(mljob("nic-job", ps=None, workers=(1, 4), epochs=1e9),
                                     cpu="1", nics=1))
        status = wait_for(lambda: placed_as_decided(mlsched, "nic-job"), 60, "the job to run",
                          describe=lambda: placement_problems(mlsched, "nic-job"))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        wait_all_running(mlsched, "nic-job", 2)
        mlsched.create(small_workers(mljob("nic-wait", ps=None, workers=(1, 1), epochs=1e9),
                                     cpu="1", nics=1))
        message = _told(mlsched, "nic-wait", "WaitingForQuota")
        assert message == ("its minimum requests 1 example.com/nic; the namespace's ResourceQuota "
                           "'nics' has 0 of 2 left"), message
        mlsched.create(small_workers(mljob("nic-big", ps=None, workers=(3, 3), epochs=1e9),
                                     cpu="1", nics=1))
        message = _told(mlsched, "nic-big", "CannotFit")
        assert message == ("its minimum requests 3 example.com/nic; the namespace's ResourceQuota "
                           "'nics' allows 2 in all"), message
        refused = refused_for_good(mlsched)
        assert not refused, refused


def test_a_quota_on_dra_devices_is_planned_within(api, mlsched, operator):
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        core.create_namespaced_resource_quota(mlsched.namespace, {
            "metadata": {"name": "devices"},
            "spec": {"hard": {f"{gpus}.deviceclass.resource.k8s.io/devices": "2"}}})
        claim_template(api, mlsched.namespace, gpus)
        mlsched.create(scheduling_policy("default", allocation="drf", interval=DAY))
        mlsched.create(claiming(mljob("dra-quota", ps=None, workers=(1, 4), epochs=1e9)))
        status = wait_for(lambda: placed_as_decided(mlsched, "dra-quota"), 60, "the job to run",
                          describe=lambda: placement_problems(mlsched, "dra-quota"))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        wait_all_running(mlsched, "dra-quota", 2)
        assert _pending_for_good(mlsched, "dra-quota") == []
        mlsched.create(claiming(mljob("dra-wait", ps=None, workers=(1, 1), epochs=1e9)))
        message = _told(mlsched, "dra-wait", "WaitingForQuota")
        assert message == (f"its minimum claims 1 {gpus} device; the namespace's ResourceQuota "
                           "'devices' has 0 of 2 left"), message
        mlsched.create(claiming(mljob("dra-big", ps=None, workers=(3, 3), epochs=1e9)))
        message = _told(mlsched, "dra-big", "CannotFit")
        assert message == (f"its minimum claims 3 {gpus} devices; the namespace's ResourceQuota "
                           "'devices' allows 2 in all"), message


def test_a_quota_on_the_count_of_resource_claims_is_planned_within(api, mlsched, operator):
    """An object-count quota on ResourceClaims (`count/resourceclaims.resource.k8s.io`): each
    pod makes one claim per claim template it names. It was not planned with: DRF created four
    claiming workers under a quota of 2, kube-controller-manager could not make two of their
    claims (`exceeded quota: claims`), and those two pods waited for good."""
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        core.create_namespaced_resource_quota(mlsched.namespace, {
            "metadata": {"name": "claims"},
            "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "2"}}})
        claim_template(api, mlsched.namespace, gpus)
        mlsched.create(scheduling_policy("default", allocation="drf", interval=DAY))
        mlsched.create(claiming(mljob("dra-claims", ps=None, workers=(1, 4), epochs=1e9)))
        status = wait_for(lambda: placed_as_decided(mlsched, "dra-claims"), 60, "the job to run",
                          describe=lambda: placement_problems(mlsched, "dra-claims"))
        assert status["replicaStatuses"]["worker"]["desired"] == 2, status["replicaStatuses"]
        wait_all_running(mlsched, "dra-claims", 2)
        assert _pending_for_good(mlsched, "dra-claims") == []
        mlsched.create(claiming(mljob("dra-more", ps=None, workers=(1, 1), epochs=1e9)))
        message = _told(mlsched, "dra-more", "WaitingForQuota")
        assert message == ("its minimum makes 1 ResourceClaim; the namespace's ResourceQuota "
                           "'claims' has 0 of 2 left"), message


@contextlib.contextmanager
def claims_refused(api, namespace: str, message: str):
    """A ValidatingAdmissionPolicy refusing every new ResourceClaim of `namespace` (what a
    platform team's policy on claims looks like to the pods: kube-controller-manager cannot
    make theirs), in force when this yields."""
    admission = client.AdmissionregistrationV1Api(api)
    name = f"e2e-no-claims-{namespace}"
    admission.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                     "operations": ["CREATE"], "resources": ["resourceclaims"]}]},
                 "validations": [{"expression": "false", "message": message}]}})
    admission.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}})
    custom = client.CustomObjectsApi(api)

    def refused() -> bool:  # the API server compiles a new policy within a few seconds
        try:
            custom.create_namespaced_custom_object(*DRA, namespace, "resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "probe"}, "spec": {"devices": {"requests": []}}},
                dry_run="All")
        except client.ApiException as e:
            return message in (e.body or "")
        return False
    try:
        wait_for(refused, 30, "the ValidatingAdmissionPolicy to refuse claims")
        yield
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_pods_whose_claims_cannot_be_made_say_why(api, mlsched, operator):
    """Claims that kube-controller-manager cannot make (here a ValidatingAdmissionPolicy
    refuses them; before the claims quota was planned with, that quota did): kube-scheduler
    waits for them without a word. The job said `AllRolesReady` on its minimum, or nothing
    useful, for good; now it says which pod cannot start and quotes the pod's
    FailedResourceClaimCreation Event."""
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus, \
            claims_refused(api, mlsched.namespace, "claims are closed in this namespace"):
        claim_template(api, mlsched.namespace, gpus)
        mlsched.create(scheduling_policy("default", allocation="drf", interval=DAY))
        mlsched.create(claiming(mljob("dra-claims", ps=None, workers=(1, 2), epochs=1e9)))

        def running():
            found = running_reason(mlsched, "dra-claims")
            return found if found and found[0] == "PodsCannotStart" else None

        _, message = wait_for(running, 60, "the job to say which pods cannot start",
                              describe=lambda: running_reason(mlsched, "dra-claims"))
        assert message.startswith("pod dra-claims-worker-"), message
        assert "cannot start: FailedResourceClaimCreation: " in message, message
        assert "claims are closed in this namespace" in message, message
        assert "PodsCannotStart" in [e.reason for e in mlsched.events("dra-claims", "MLJob")]
