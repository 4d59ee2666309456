"""The tuner stays readable: short functions, small files, a handful of top-level entries."""

import ast
from pathlib import Path

TUNER = Path(__file__).resolve().parents[2] / "tuner"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 310
TOP_LEVEL = {"__init__.py", "cli.py", "errors.py", "run.py", "settings.py"}


def builds_a_parser(fn: ast.AST) -> bool:
    """argparse builders list every flag and may run long."""
    return any(
        isinstance(node, ast.Attribute) and node.attr == "ArgumentParser" for node in ast.walk(fn)
    )


def test_no_function_is_longer_than_60_lines_except_argparse_builders():
    long = []
    for path in sorted(TUNER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not builds_a_parser(node):
                    long.append(
                        f"{path.relative_to(TUNER.parent)}:{node.lineno} {node.name} {lines}"
                    )
    assert not long, long


def test_files_stay_small_and_the_top_level_holds_only_entries():
    big = [p.name for p in TUNER.rglob("*.py") if len(p.read_text().splitlines()) > MAX_FILE_LINES]
    assert not big, big
    assert {p.name for p in TUNER.glob("*.py")} == TOP_LEVEL
    assert all(
        (d / "__init__.py").exists()
        for d in TUNER.iterdir()
        if d.is_dir() and d.name != "__pycache__"
    )
