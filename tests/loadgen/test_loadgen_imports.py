"""loadgen's layering: no module imports back one that imports it, and no server internals."""

from __future__ import annotations

import ast
from pathlib import Path

LOADGEN = Path(__file__).resolve().parents[2] / "loadgen"


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (a lazy import is a
    dependency too; it only hides the circle until run time)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {f"loadgen.{p.stem}": p for p in LOADGEN.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & modules.keys() for name, path in modules.items()}


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_loadgen_module_imports_itself_back():
    graph = _graph()
    cycles = [c for name in sorted(graph) if (c := _cycle_from(name, graph))]
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


def test_loadgen_uses_no_server_internals():
    # The in-process driver may use the engine's public API; nothing in loadgen reaches into
    # engine_lite.server, whose flag and HTTP details are the server's own.
    users = [
        p.name
        for p in LOADGEN.glob("*.py")
        if any(m.startswith("engine_lite.server") for m in _imports(p))
    ]
    assert users == []
