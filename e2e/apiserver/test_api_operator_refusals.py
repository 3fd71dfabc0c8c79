"""A running operator on an API server alone (the apiserver-only tier): a job whose pods the API
server would refuse is told so up front, before any node is looked at. A RuntimeClass or a
ResourceClaimTemplate that does not exist is a question for the API server only, so these need
no scheduler, no KCM and no node (the operator finds none and still says why the job cannot run,
naming the missing object rather than capacity).

On the full plane, "no pod" also proved that no StatefulSet asked for one (KCM would have made
it); this plane runs no KCM, so each test also asserts that no StatefulSet of the job is scaled
above 0: what makes the same claim here.
"""

from __future__ import annotations

from dra_objects import claiming
from mlsched_objects import DAY, MLSched, condition, mljob, scheduling_policy
from waiting import wait_for


def assert_no_pod_asked_for(mlsched: MLSched, job: str) -> None:
    assert mlsched.pods(job) == []
    scaled = {role: s.spec.replicas for role, s in mlsched.statefulsets(job).items()
              if s.spec.replicas}
    assert not scaled, scaled


# From test_operator_runtime_classes.py.
def test_a_job_naming_a_runtime_class_that_does_not_exist_is_told_so(mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("lost", ps=None, workers=(1, 1))
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["runtimeClassName"] = "kata-e2e"
    mlsched.create(job)

    def reason():
        c = condition(mlsched.job("lost"), "Running")
        return (c["reason"], c.get("message", "")) if c else None

    got = wait_for(lambda: (r := reason()) and r[0] == "CannotFit" and r, 30,
                   "the job to be told its RuntimeClass does not exist", describe=reason)
    assert got[1] == ("its worker pods name RuntimeClass 'kata-e2e', which does not exist: "
                      "the API server refuses them"), got
    assert_no_pod_asked_for(mlsched, "lost")


# From test_operator_dra.py.
def test_a_job_naming_a_claim_template_that_does_not_exist_is_told_so(api, mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=DAY))
    job = claiming(mljob("dra-typo", ps=None, workers=(1, 2)), template="one-gpuu")
    del job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"]  # any node
    mlsched.create(job)

    def running():
        c = condition(mlsched.job("dra-typo"), "Running")
        return (c["reason"], c.get("message", "")) if c else None

    reason, message = wait_for(lambda: (r := running()) and r[0] == "CannotFit" and r, 60,
                               "the job to be told its claim template does not exist",
                               describe=running)
    assert "its worker pods name ResourceClaimTemplate 'one-gpuu', which does not exist" in message
    assert_no_pod_asked_for(mlsched, "dra-typo")
