"""The builders (tests/builders.py) produce what the operator's parsers accept."""

from __future__ import annotations

from builders import NS, allreduce_job, node, ps_job
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.records import node_record


def test_builders_parse():
    assert node_record(node("n1")).allocatable == (8.0, 2.0, 48.0)
    assert job_record({**ps_job(), "metadata": {"name": "resnet", "namespace": NS}}).error is None
    assert job_record({**allreduce_job(), "metadata": {"name": "ring", "namespace": NS}}).arch == "allreduce"
