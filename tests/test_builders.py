"""The builders (tests/builders.py) produce what the operator's parsers accept."""

from __future__ import annotations

from builders import NS, allreduce_job, node, ps_job
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.records import node_record


def test_builders_parse():
    assert node_record(node("n1")).allocatable == (8.0, 2.0, 48.0)
    assert job_record({**ps_job(), "metadata": {"name": "resnet", "namespace": NS}}).error is None
    assert job_record({**allreduce_job(), "metadata": {"name": "ring", "namespace": NS}}).arch == "allreduce"


def test_no_test_module_imports_another():
    """What tests share lives in helper modules (builders, controller_steps, manifest_tools,
    memory_kube, conftest ...), never in a test module another one imports."""
    import ast
    from pathlib import Path

    here = Path(__file__).resolve().parent
    bad = []
    for path in sorted(here.glob("*.py")):
        for stmt in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else \
                [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) and not stmt.level else []
            bad += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not bad, "\n".join(bad)
