"""Invalid pod templates in MLJobs: what the schema cannot know, a pod template the API server
refuses only when the operator renders it, fails that job only, naming the field.

The CRD's schema and CEL rules are the first line; their refusals (a user sees the error at
`kubectl apply`, before any operator runs) need only an API server and are tested in the
apiserver-only tier, e2e/apiserver/test_api_validation.py.
"""

from __future__ import annotations

import pytest

from mlsched_objects import condition, mljob, phase, scheduling_policy
from waiting import wait_for


def test_pod_template_the_apiserver_refuses_fails_the_job_only(mlsched, operator):
    # A GPU request without a limit passes the MLJob schema (templates are kept as
    # written) but the API server refuses such pods, so the StatefulSet.
    mlsched.create(scheduling_policy("default"))
    bad = mljob("gpu-no-limit")
    container = bad["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    mlsched.create(bad)
    mlsched.create(mljob("neighbour"))

    job = wait_for(lambda: phase(j := mlsched.job("gpu-no-limit")) == "Failed" and j, 60,
                   "the job to fail with InvalidSpec")
    failed = condition(job, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "resources.limits: Required value" in failed["message"], failed["message"]
    assert any(e.type == "Warning" and e.reason == "InvalidSpec"
               for e in mlsched.events("gpu-no-limit", "MLJob"))
    # The other job of the namespace is scheduled as if nothing happened.
    wait_for(lambda: phase(mlsched.job("neighbour")) == "Running", 90, "the neighbour to run")


def _typo_in_command(container: dict) -> None:
    container["comand"] = ["python", "train.py"]


def _unknown_resources_field(container: dict) -> None:
    container["resources"]["request"] = {"cpu": "1"}  # `requests`, misspelt


@pytest.mark.parametrize(("break_it", "named"), [
    (_typo_in_command, 'unknown field "spec.template.spec.containers[0].comand"'),
    (_unknown_resources_field, 'unknown field "spec.template.spec.containers[0].resources.request"'),
], ids=["comand", "resources.request"])
def test_a_typo_in_the_pod_template_fails_the_job_naming_the_field(mlsched, operator,
                                                                   break_it, named):
    # The MLJob schema keeps templates as written; the API server, asked to validate the
    # StatefulSet strictly, names the field instead of dropping it (a job whose command was
    # dropped would run the image's default entrypoint while holding its GPUs).
    mlsched.create(scheduling_policy("default"))
    bad = mljob("typo", ps=None)
    break_it(bad["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0])
    mlsched.create(bad)
    job = wait_for(lambda: phase(j := mlsched.job("typo")) == "Failed" and j, 60,
                   "the job to fail with InvalidSpec",
                   describe=lambda: (mlsched.job("typo") or {}).get("status"))
    failed = condition(job, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert named in failed["message"], failed["message"]
    assert not mlsched.statefulsets("typo") and not mlsched.pods("typo")

    # Fixing the spec clears the failure and the job runs.
    mlsched.patch_job("typo", mljob("typo", ps=None)["spec"])
    wait_for(lambda: phase(mlsched.job("typo")) == "Running", 90, "the fixed job to run",
             describe=lambda: (mlsched.job("typo") or {}).get("status"))
