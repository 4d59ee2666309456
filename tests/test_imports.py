"""No import circles: no module is imported back, directly or through others, by a module it
imports. Every import counts (a function-level one too) and importing `a.b.c` also runs `a.b`'s
`__init__`, since either can make a circle that only shows up depending on import order."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine_lite", "loadgen", "slo", "tuner")
KNOWN_CIRCLES: set[frozenset[str]] = set()  # none: every package is held to the rule


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """Our modules this module imports, resolved to modules (not names inside them)."""
    out: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        edges = imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        # Importing a.b.c first runs a/__init__ and a/b/__init__.
        for target in list(edges):
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts))}
        graph[name] = edges - {name} - _parents(name)
    return graph


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while (member := stack.pop()) != node:
                component.add(member)
            component.add(node)
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package):
    ours = [c for c in circles(import_graph()) if any(m.split(".")[0] == package for m in c)]
    unexpected = [sorted(c) for c in ours if c not in KNOWN_CIRCLES]
    assert not unexpected, f"modules importing each other, directly or through others: {unexpected}"


def test_the_checker_sees_a_circle_through_a_function_level_import():
    a = ast.parse("def f():\n    from pkg.b import g\n")
    b = ast.parse("from pkg import a\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    graph = {
        name: imported(tree, name, False, known) for name, tree in (("pkg.a", a), ("pkg.b", b))
    }
    assert circles(graph) == [frozenset({"pkg.a", "pkg.b"})]
