"""The layout follows the data: workloads -> cluster -> features -> policies -> formats -> sim ->
controller; inside the controller, its subpackages in CONTROLLER_ORDER.

The controller imports the simulator for one thing: the regret guard replays a policy's
recorded intervals in it (controller/scheduling/guard.py, sim/regret_replay.py, issue 51).

Every import in mlsched (module level, inside functions, under TYPE_CHECKING: all of them) is
read from the source, so a cycle hidden by a lazy import is still a cycle here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import mlsched

ROOT = Path(mlsched.__file__).parent
# Each layer may import only from the layers before it (and itself). `api` stands apart.
LAYERS = ["workloads", "cluster", "features", "policies", "formats", "sim", "controller"]
ALLOWED = {
    "workloads": {"workloads"},
    "cluster": {"workloads", "cluster"},
    "features": {"workloads", "cluster", "features"},
    "policies": {"workloads", "cluster", "features", "policies"},
    # What the operator and retraining (policy_models/retrain, cli.py) both read and write.
    "formats": {"workloads", "cluster", "features", "policies", "formats", "api"},
    "sim": {"workloads", "cluster", "features", "policies", "sim"},
    "controller": {"workloads", "cluster", "features", "policies", "formats", "sim", "controller",
                   "api", "progress"},
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


@functools.cache  # the files do not change during a run: parsed once for all the checks
def imports_of(path: Path) -> frozenset[str]:
    """Every module name the file imports (any package: mlsched, policy_models, torch, ...),
    relative imports resolved; `from mlsched.x import y` adds mlsched.x.y when y is a module or
    a subpackage of mlsched."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).split(".") if path.is_relative_to(ROOT.parent) else []
    if package and path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            if module.startswith("mlsched"):
                for a in node.names:
                    sub = ROOT.parent / (module + "." + a.name).replace(".", "/")
                    if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
                        out.add(module + "." + a.name)
    return frozenset(out)


#: Calls that load a module named by a string (what an import statement is not needed for).
LOADERS = {"find_spec", "import_module", "__import__"}


@functools.cache
def loads_by_name(path: Path) -> frozenset[str]:
    """`importlib.util.find_spec("x")`, `importlib.import_module("x")`, `__import__("x")`:
    the module names given as string literals."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in LOADERS:
                out.add(node.args[0].value)
    return frozenset(out)


def names(modules: set[str], package: str) -> set[str]:
    return {m for m in modules if m == package or m.startswith(package + ".")}


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


#: The one place the runtime names policy_models: finding the shipped artifacts as files
#: (`find_spec` locates the package without importing it), never importing its code.
POLICY_MODELS_LOOKUPS = {("mlsched.policies.onnx_runner", "policy_models")}


def test_the_runtime_package_ships_no_test_doubles_and_never_imports_torch():
    lookups = set()
    for p in ROOT.rglob("*.py"):
        imported = imports_of(p)
        assert not names(imported, "torch"), p
        assert not names(imported, "policy_models"), p
        by_name = loads_by_name(p)
        assert not names(by_name, "torch"), p
        lookups |= {(module_name(p), n) for n in names(by_name, "policy_models")}
    assert lookups == POLICY_MODELS_LOOKUPS
    assert not (ROOT / "controller" / "testing.py").exists()


CONTROLLER = ROOT / "controller"
#: The controller's subpackages, lowest first: each imports only those before it (and itself).
#: A new subpackage must be placed here (docs/architecture.md, "The operator's packages").
CONTROLLER_ORDER = ["kube", "process", "serving", "constraints", "objects", "admission", "dataset",
                    "scheduling", "progress", "app"]


def controller_order_violations(order: list[str]) -> list[str]:
    bad = []
    for p in sorted(CONTROLLER.rglob("*.py")):
        rel = p.relative_to(CONTROLLER).parts
        if len(rel) == 1:
            continue  # __init__.py, __main__.py: the entry point, above every subpackage
        own = order.index(rel[0])
        for i in imports_of(p) | loads_by_name(p):
            parts = i.split(".")
            if parts[:2] != ["mlsched", "controller"] or i == "mlsched.controller":
                continue
            if parts[2] not in order:
                bad.append(f"{module_name(p)} imports {i}, outside the controller's subpackages")
            elif order.index(parts[2]) > own:
                bad.append(f"{module_name(p)} imports {i}, a subpackage above its own ({rel[0]})")
    return bad


def test_the_controller_is_subpackages_in_a_declared_order():
    subpackages = {d.name for d in CONTROLLER.iterdir() if (d / "__init__.py").exists()}
    assert subpackages == set(CONTROLLER_ORDER)
    loose = {p.name for p in CONTROLLER.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py"}, "controller modules belong in a subpackage"
    for sub in CONTROLLER_ORDER:  # each says what its modules hold
        doc = ast.get_docstring(ast.parse((CONTROLLER / sub / "__init__.py").read_text())) or ""
        for m in (CONTROLLER / sub).glob("*.py"):
            assert m.name == "__init__.py" or m.name in doc, f"{sub}/__init__.py does not map {m.name}"
    assert not controller_order_violations(CONTROLLER_ORDER), "\n".join(
        controller_order_violations(CONTROLLER_ORDER))


def test_the_order_check_sees_an_upward_import():
    # The real graph against the order reversed: every import between subpackages is upward.
    assert controller_order_violations(list(reversed(CONTROLLER_ORDER)))


def test_training_and_the_cli_never_import_the_operator():
    """Retraining Jobs and the `mlsched` CLI share formats with the operator through
    mlsched.formats, never through mlsched.controller."""
    training = ROOT.parent.parent / "policy_models"
    files = sorted(training.rglob("*.py")) + [ROOT / "cli.py"]
    assert len(files) > 10
    bad = [f"{p} imports {sorted(names(imports_of(p) | loads_by_name(p), 'mlsched.controller'))}"
           for p in files if names(imports_of(p) | loads_by_name(p), "mlsched.controller")]
    assert not bad, "\n".join(bad)


#: Every runtime module is at most this long (issue 50): one that grows past it is split along
#: its responsibilities. Exceptions, each with why it is allowed to stay longer for now. No
#: module under mlsched is generated, and data files (workloads/data/) are not Python.
MAX_MODULE_LINES = 500
LONGER_FOR_NOW: dict[str, str] = {}


def test_no_runtime_module_is_over_the_line_limit():
    lengths = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
               for p in ROOT.rglob("*.py")}
    over = {name: n for name, n in lengths.items()
            if n > MAX_MODULE_LINES and name not in LONGER_FOR_NOW}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
    stale = {name for name in LONGER_FOR_NOW if lengths.get(name, 0) <= MAX_MODULE_LINES}
    assert not stale, f"no longer over the limit, drop the exception: {stale}"



#: The trees whose modules may not import a test module as a library (issue 50): what two test
#: modules share lives in a module of its own (e2e/node_fixtures.py, e2e/dra_objects.py, ...).
TEST_TREES = [ROOT.parent.parent / "e2e", ROOT.parent.parent / "tests"]


def imported_test_modules(path: Path) -> list[str]:
    """The test modules the file imports: `import test_x`, `from test_x import y`,
    `from e2e import test_x`, `from . import test_x`, at module level or inside functions.
    A package's own test_* module (aiohttp.test_utils) is not one of ours."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            out.add(module)
            if node.level or module.split(".")[0] in {"e2e", "tests"}:
                out |= {f"{module}.{a.name}".replace("..", ".") for a in node.names}
    ours = {"", "e2e", "tests", "apiserver"}
    return sorted(m for m in out if m.lstrip(".").split(".")[0].startswith("test_") or (
        (m.startswith(".") or m.split(".")[0] in ours)
        and any(part.startswith("test_") for part in m.split("."))))


def test_no_test_module_imports_another_test_module():
    files = sorted(p for tree in TEST_TREES for p in tree.rglob("*.py") if ".venv" not in p.parts)
    assert len(files) > 50
    bad = [f"{p.relative_to(ROOT.parent.parent)} imports {imported_test_modules(p)}"
           for p in files if imported_test_modules(p)]
    assert not bad, "\n".join(bad)


def test_the_test_module_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef helper():\n    from test_other import thing\n")
    assert imported_test_modules(f) == ["test_other"]
    f.write_text("from e2e import test_x\nfrom . import test_y\nfrom aiohttp.test_utils import A\n")
    assert imported_test_modules(f) == [".test_y", "e2e.test_x"]


#: The operator-wide state object (issue 50: "`Runtime` gone or under 10 fields"): what it
#: holds is counted however it came to hold it, so that grouping stays a decision, not drift.
MAX_RUNTIME_ATTRIBUTES = 9


def runtime_attributes(runtime_source: str, users: list[str]) -> set[str]:
    """Runtime's dataclass fields, every `self.x = ...` in its methods (`__post_init__`), and
    every `rt.x = ...` in `users` (the modules that hold a Runtime as `rt`)."""
    out: set[str] = set()
    tree = ast.parse(runtime_source)
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runtime"]
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and "ClassVar" not in ast.unparse(node.annotation):
            out.add(node.target.id)

    def assigned(trees, owner: str) -> set[str]:
        found = set()
        for t in trees:
            for node in ast.walk(t):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                for target in targets:
                    for e in ast.walk(target):
                        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
                                and e.value.id == owner and isinstance(e.ctx, ast.Store):
                            found.add(e.attr)
        return found
    return out | assigned(cls.body, "self") | assigned([ast.parse(u) for u in users], "rt")


def test_the_runtime_holds_under_ten_attributes():
    from mlsched.controller.process.config import OperatorConfig
    from mlsched.controller.scheduling.runtime import Runtime

    source = (CONTROLLER / "scheduling" / "runtime.py").read_text()
    users = [p.read_text() for p in sorted(CONTROLLER.rglob("*.py"))]
    held = runtime_attributes(source, users) | set(vars(Runtime.create(OperatorConfig(), None)))
    assert len(held) <= MAX_RUNTIME_ATTRIBUTES, (
        f"Runtime holds {len(held)}: {sorted(held)}; group what belongs together into an owner "
        "(as Process, ApiWriters and the owners of scheduling/state.py do) or pass it only to "
        "what needs it")


def test_the_runtime_count_sees_post_init_and_outside_assignments():
    source = ("@dataclass\nclass Runtime:\n    a: int\n    b: int = 0\n    K: ClassVar[int] = 1\n"
              "    def __post_init__(self):\n        self.c = 1\n        self.d, self.e = 2, 3\n")
    assert runtime_attributes(source, ["rt.f = 1\nrt.a.x = 2\nother.g = 3\n"]) == set("abcdef")
