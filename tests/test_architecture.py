"""The dependency direction of DESIGN.md §2: ftpull -> runtime, ftw, registry; runtime -> ftw,
registry; ftw and registry import nothing of ours. Inside runtime/, the floor plan of
docs/ARCHITECTURE.md: each part imports only the parts below it, so what decides (the planner, the
policies) imports nothing that executes, and nothing low (experts, layers) imports the GPU
runtime or the server. Checked on the source, imports inside functions and under TYPE_CHECKING
included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"ftpull", "ftw", "registry", "runtime", "Modelfiles"}
ALLOWED = {
    "ftpull": {"ftpull", "runtime", "ftw", "registry", "Modelfiles"},
    "runtime": {"runtime", "ftw", "registry"},
    "ftw": {"ftw"},
    "registry": {"registry"},
}

# runtime's parts, each importing only itself and the parts it names (and what those may import).
RUNTIME_PARTS: dict[str, set[str]] = {
    # what decides: pure, imports nothing else of the runtime
    "runtime.policy": set(),
    "runtime.planner": set(),
    # foundations
    "runtime.config": set(),
    "runtime.loading.registered": set(),  # a registered model's files
    "runtime.experts": set(),  # host banks and the CPU expert kernels
    "runtime.text": {"runtime.loading.registered"},
    "runtime.loading.read_ftw": {"runtime.config", "runtime.experts"},  # FTW into memory
    # what executes
    "runtime.layers": {"runtime.loading.read_ftw"},
    "runtime.models": {"runtime.layers"},
    "runtime.loading.family_tensors": {"runtime.models"},  # a family's tensors, asked of a shape-only build
    "runtime.gpu": {"runtime.models", "runtime.planner", "runtime.policy", "runtime.text"},
    # assembly and front ends
    "runtime.loading.runnable": {"runtime.gpu", "runtime.loading.family_tensors"},  # a runnable model from a registered one
    "runtime.engine": {"runtime.models", "runtime.text"},
    "runtime.bench": {"runtime.gpu"},
    "runtime.server": {"runtime.engine", "runtime.loading.runnable"},
}


def closure(part: str) -> set[str]:
    seen, todo = {part}, [part]
    while todo:
        for below in RUNTIME_PARTS[todo.pop()]:
            if below not in seen:
                seen.add(below)
                todo.append(below)
    return seen


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved; `from X import Y` names
    X.Y too where Y is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names
                      if (ROOT / module.replace(".", "/") / f"{alias.name}.py").exists()
                      or (ROOT / module.replace(".", "/") / alias.name / "__init__.py").exists()}
    return found


def part_of(module: str) -> str | None:
    """The RUNTIME_PARTS entry `module` belongs to (the longest that prefixes it)."""
    matches = [p for p in RUNTIME_PARTS if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependency_direction(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (bad := {m.split(".")[0] for m in imported_modules(path)} & OURS - ALLOWED[package])
    }
    assert offenders == {}, f"{package} may import only {sorted(ALLOWED[package])}"


def test_every_runtime_module_has_a_part() -> None:
    """A new module or folder of runtime/ is placed in the floor plan, not left outside the check."""
    loose = [module_name(p) for p in sorted((ROOT / "runtime").rglob("*.py"))
             if module_name(p) != "runtime" and part_of(module_name(p)) is None
             and module_name(p) != "runtime.loading"]
    assert loose == []


@pytest.mark.parametrize("part", sorted(RUNTIME_PARTS))
def test_runtime_parts_import_only_below(part: str) -> None:
    allowed = closure(part)
    offenders = {}
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if part_of(module_name(path)) != part:
            continue
        bad = {p for m in imported_modules(path) if m.startswith("runtime.") and (p := part_of(m)) not in allowed}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(str(b) for b in bad)
    assert offenders == {}, f"{part} may import only {sorted(allowed)}"


def test_runtime_has_no_import_cycles() -> None:
    """No two runtime modules import each other, directly or around a circle (a lazy import or a
    TYPE_CHECKING one counts: the circle is in the design either way)."""
    modules = {module_name(p): p for p in (ROOT / "runtime").rglob("*.py")}
    graph = {m: {i for i in imported_modules(p) if i in modules and i != m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert cycles == []
