"""docs/architecture.md's worked example runs as written: a new allocation policy registered
and simulated in a dozen lines."""

from __future__ import annotations

import re
from pathlib import Path

from mlsched.policies import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_the_worked_example_runs(capsys, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "the doc has one Python example"
    monkeypatch.setitem(registry.REGISTRY, "allocation", dict(registry.REGISTRY["allocation"]))
    exec(compile(blocks[0], str(DOC), "exec"), {})
    assert "shortest-first: avg JCT" in capsys.readouterr().out
    assert registry.known("allocation", "shortest-first")
