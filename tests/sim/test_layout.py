"""The simulator's package layout: imports go one way between packages, no module imports
itself back through another."""

from __future__ import annotations

import ast
from pathlib import Path

import staleness_sim

ROOT = Path(staleness_sim.__file__).parent

# What each package may import from the simulator (besides itself). The front modules at
# the top level (config, summary, cli) tie the packages together and may import anything.
ALLOWED = {
    "core": set(),
    "durations": set(),
    "learning": {"core"},
    "cohort": {"core", "durations", "learning"},
    "queue": {"core", "durations", "cohort"},
    "validation": {"core", "durations", "cohort", "config"},
    "sweeps": {"core", "durations", "cohort", "queue", "config", "summary"},
    "run_report": {"core", "sweeps"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every simulator module a file imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("staleness_sim"):
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("staleness_sim"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    # The root package is every module's parent, so importing it is not an edge.
    files.pop("staleness_sim")
    return {mod: {m for m in _imports(p) if m in files and m != mod} for mod, p in files.items()}


def test_no_relative_imports_so_the_graph_below_is_complete():
    relative = [
        p.name
        for p in ROOT.rglob("*.py")
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.ImportFrom) and n.level
    ]
    assert relative == []


def test_packages_import_one_way():
    wrong = []
    for mod, deps in _graph().items():
        parts = mod.split(".")
        if len(parts) < 3 or parts[1] not in ALLOWED:
            continue
        for dep in deps:
            target = dep.split(".")[1]
            if target not in ALLOWED[parts[1]] | {parts[1]}:
                wrong.append(f"{mod} -> {dep}")
    assert wrong == []


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for dep in graph[mod]:
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert cycles == []


def test_the_simulator_never_imports_the_runner():
    runner = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            runner += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "runner"]
    assert runner == []
