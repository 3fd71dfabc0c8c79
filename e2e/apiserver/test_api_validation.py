"""Invalid MLJobs and SchedulingPolicies are refused by the API server itself, with the field
named (the apiserver-only tier: etcd + kube-apiserver with the CRDs, no operator).

The CRD's schema and CEL rules (generated from the pydantic models in mlsched/api) are the
first line: a user sees the error at `kubectl apply`, before any operator runs. What the schema
cannot know (a pod template the API server refuses only when the operator renders it) is
tested with a running operator in e2e/test_operator_validation.py.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from mlsched_objects import mljob, scheduling_policy


def _min_above_max(job: dict) -> None:
    job["spec"]["replicaSpecs"]["worker"].update(min=5, max=2)


def _malformed_model_label(job: dict) -> None:
    job["spec"]["modelType"] = "GPT 17!"  # any lowercase label is fine; this is not one


def _zero_epochs(job: dict) -> None:
    job["spec"]["epochs"] = 0


def _negative_epochs(job: dict) -> None:
    job["spec"]["epochs"] = -3


def _ps_for_allreduce(job: dict) -> None:
    job["spec"]["architecture"] = "AllReduce"


def _no_ps_for_parameter_server(job: dict) -> None:
    del job["spec"]["replicaSpecs"]["ps"]


def _template_without_containers(job: dict) -> None:
    job["spec"]["replicaSpecs"]["worker"]["template"] = {"spec": {}}


def _template_with_no_container(job: dict) -> None:
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"] = []


def _template_without_spec(job: dict) -> None:
    job["spec"]["replicaSpecs"]["worker"]["template"] = {"metadata": {"labels": {"a": "b"}}}


# (what is wrong, the field the message must name, a phrase of the reason)
CASES = [
    (_min_above_max, "spec.replicaSpecs.worker.max", "must be >= min"),
    (_malformed_model_label, "spec.modelType", "should match"),
    (_zero_epochs, "spec.epochs", "greater than 0"),
    (_negative_epochs, "spec.epochs", "greater than 0"),
    (_ps_for_allreduce, "spec.replicaSpecs.ps", "must not be set for AllReduce jobs"),
    (_no_ps_for_parameter_server, "spec.replicaSpecs.ps",
     "is required for ParameterServer jobs"),
    (_template_without_containers, "spec.replicaSpecs.worker.template.spec.containers",
     "Required value"),
    (_template_with_no_container, "spec.replicaSpecs.worker.template.spec.containers",
     "should have at least 1 items"),
    (_template_without_spec, "spec.replicaSpecs.worker.template.spec", "Required value"),
]


@pytest.mark.parametrize(("break_it", "field", "reason"), CASES,
                         ids=[c[0].__name__.strip("_") for c in CASES])
def test_invalid_mljob_is_rejected_naming_the_field(mlsched, break_it, field, reason):
    job = mljob("broken")
    break_it(job)
    with pytest.raises(ApiException) as refused:
        mlsched.create(job)
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert f"{field}: " in message, message
    assert reason in message, message
    assert mlsched.job("broken") is None


def test_valid_mljob_is_accepted(mlsched):
    # The same builder unbroken: the cases above fail for their one defect only.
    created = mlsched.create(mljob("fine"))
    assert created["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"  # schema default


# (field, a typo) for every algorithm name of a SchedulingPolicy: refused at admission with the
# names it may take (it used to be stored and scheduled with the fallback, FallbackActive).
ALGORITHM_TYPOS = [("allocation", "foobar"), ("placement", "load-balancing"),
                   ("grouping", "harmonie"), ("fallback", "dl2")]


@pytest.mark.parametrize(("field", "typo"), ALGORITHM_TYPOS, ids=[f for f, _ in ALGORITHM_TYPOS])
def test_an_unknown_algorithm_name_is_refused_with_the_known_ones(control_plane, mlsched,
                                                                   tmp_path, field, typo):
    from mlsched.api import algorithms

    known = {"allocation": algorithms.ALLOCATION, "placement": algorithms.PLACEMENT,
             "grouping": algorithms.GROUPING, "fallback": algorithms.ALLOCATION_HEURISTICS}[field]
    with pytest.raises(ApiException) as refused:
        mlsched.create(scheduling_policy("typo", **{field: typo}))
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert f'spec.{field}: Unsupported value: "{typo}"' in message, message
    assert all(f'"{name}"' in message for name in known), message
    assert mlsched.policy("typo") is None
    # What a user typing `kubectl apply` sees.
    path = tmp_path / "policy.yaml"
    path.write_text(json.dumps(scheduling_policy("typo", **{field: typo})))
    applied = control_plane.kubectl("apply", "-n", mlsched.namespace, "-f", str(path),
                                    check=False)
    assert applied.returncode != 0 and f'spec.{field}: Unsupported value: "{typo}"' in \
        applied.stderr, applied.stderr
    assert "supported values: " in applied.stderr and f'"{known[0]}"' in applied.stderr


def test_every_known_algorithm_name_is_accepted(mlsched):
    from mlsched.api import algorithms

    for phase_, names in algorithms.BY_PHASE.items():
        for number, name in enumerate(names):
            mlsched.create(scheduling_policy(f"{phase_}-{number}", **{phase_: name}))


def _gpu_restricted(name: str, types: list[str]) -> dict:
    """A job whose workers may use only GPUs of `types` (issue 54)."""
    job = mljob(name, ps=None, workers=(1, 1))
    job["spec"]["replicaSpecs"]["worker"]["gpuTypes"] = types
    return job


def test_an_unknown_gpu_type_is_refused_with_the_known_ones(mlsched):
    with pytest.raises(ApiException) as refused:
        mlsched.create(_gpu_restricted("typo", ["a100"]))
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert 'spec.replicaSpecs.worker.gpuTypes[0]: Unsupported value: "a100"' in message, message
    assert all(f'"{t}"' in message for t in ("v100", "p100", "k80")), message
    assert mlsched.job("typo") is None
