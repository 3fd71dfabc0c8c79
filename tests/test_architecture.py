"""The layout follows the data: workloads -> cluster -> features -> policies -> sim -> controller.

The controller imports the simulator for one thing: the regret guard replays a policy's
recorded intervals in it (controller/guard.py, sim/regret_replay.py, issue 51).

Every import in mlsched (module level, inside functions, under TYPE_CHECKING: all of them) is
read from the source, so a cycle hidden by a lazy import is still a cycle here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mlsched

ROOT = Path(mlsched.__file__).parent
# Each layer may import only from the layers before it (and itself). `api` stands apart.
LAYERS = ["workloads", "cluster", "features", "policies", "sim", "controller"]
ALLOWED = {
    "workloads": {"workloads"},
    "cluster": {"workloads", "cluster"},
    "features": {"workloads", "cluster", "features"},
    "policies": {"workloads", "cluster", "features", "policies"},
    "sim": {"workloads", "cluster", "features", "policies", "sim"},
    "controller": {"workloads", "cluster", "features", "policies", "sim", "controller", "api",
                   "progress"},
    "api": {"api"},
    "progress": {"progress"},
    # Imported by training programs in their own images: the progress client only, no scheduler.
    "training": {"training", "progress"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mlsched")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlsched"):
            out.add(node.module)
            # `from mlsched.x import y` may import the submodule mlsched.x.y
            for a in node.names:
                if (ROOT.parent / (node.module + "." + a.name).replace(".", "/")).with_suffix(".py").exists():
                    out.add(node.module + "." + a.name)
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in modules and i != m} for m, p in modules.items()}


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_layers_import_only_what_stands_before_them():
    bad = []
    for m, deps in graph().items():
        parts = m.split(".")
        if len(parts) < 2 or parts[1] not in ALLOWED:
            continue  # mlsched itself, cli.py: the top
        for d in deps:
            dp = d.split(".")
            if len(dp) >= 2 and dp[1] not in ALLOWED[parts[1]]:
                bad.append(f"{m} imports {d}")
    assert not bad, "\n".join(sorted(bad))


def test_the_runtime_package_ships_no_test_doubles_and_never_imports_torch():
    for p in ROOT.rglob("*.py"):
        text = p.read_text()
        assert "import torch" not in text, p
        assert "policy_models" not in imports_of(p), p
    assert not (ROOT / "controller" / "testing.py").exists()
