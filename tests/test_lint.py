"""The test command also runs the linters, so style drift fails CI like a broken test."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e .[dev])"
)
def test_ruff_lint_is_clean():
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e .[dev])"
)
def test_ruff_format_is_clean():
    proc = _run("ruff", "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_on_pure_packages():
    pytest.importorskip("mypy")
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
