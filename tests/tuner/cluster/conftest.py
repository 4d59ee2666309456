"""A real PostgreSQL server for the cluster tests, and `tune` worker processes on it.

The server's URL comes from TUNE_TEST_POSTGRES_URL (`.ci/postgres start DIR` makes a throwaway
server and prints one; `.ci/run` does that and exports it). Without one these tests skip and say
why; with REQUIRE_POSTGRES=1 (set by `.ci/run`) they fail instead.

The workers are real `tune` processes on the real storage; only their measurement is faked, by
`--synthetic` (levels that wait a fixed time and return made-up records), so that a test of the
coordination takes seconds and no CPU.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest

POSTGRES_ENV = "TUNE_TEST_POSTGRES_URL"
ROOT = Path(__file__).resolve().parents[3]


def _unavailable(reason: str) -> None:
    if os.environ.get("REQUIRE_POSTGRES") == "1":
        pytest.fail(f"REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "")
    if not url:
        _unavailable(f"no PostgreSQL: set {POSTGRES_ENV} (`.ci/postgres start DIR` prints one)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable('the PostgreSQL driver is missing: pip install -e ".[postgres]"')
    import sqlalchemy

    try:
        with sqlalchemy.create_engine(url).connect():
            pass
    except Exception as exc:
        _unavailable(f"PostgreSQL at {url} is unreachable ({str(exc).splitlines()[0]})")
    return url


@pytest.fixture
def study_name(postgres_url: str) -> Iterator[str]:
    """A study of this test's own, deleted (with its confirmation jobs) afterwards."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    storage = optuna.storages.RDBStorage(postgres_url)
    for study in (name, f"{name}:confirmation"):
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=study, storage=storage)
    storage.engine.dispose()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[[list[str]], subprocess.Popen[str]]]:
    """Starts `tune` processes (stdout: the --json report; stderr: for a failure's message);
    any still running at the end of the test is killed."""
    started: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(args: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", *args], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
