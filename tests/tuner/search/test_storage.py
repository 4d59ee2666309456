"""Opening a run's storage: readable one-line errors for a URL that cannot be used, PostgreSQL
through psycopg 3, and the time spent in storage calls."""

from __future__ import annotations

import sys

import optuna
import pytest

from tuner.cli import main
from tuner.errors import TuneError
from tuner.search.storage import masked, open_storage
from tuner.search.workers import next_trial

# Nothing listens on port 1: connection refused at once, no server needed.
UNREACHABLE = "postgresql://tuner:s3cret@127.0.0.1:1/studies"


def test_an_unreachable_postgres_is_one_line_without_its_password(tmp_path):
    with pytest.raises(TuneError) as failed:
        open_storage(UNREACHABLE, tmp_path, 20)
    message = str(failed.value)
    assert message.startswith("--storage postgresql://tuner:***@127.0.0.1:1/studies: cannot open")
    assert "s3cret" not in message and "\n" not in message


def test_a_missing_driver_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if `.[postgres]` were not installed
    with pytest.raises(
        TuneError, match=r'driver is not installed; pip install -e "\.\[postgres\]"'
    ):
        open_storage(UNREACHABLE, tmp_path, 20)


def test_tune_says_so_in_one_line_and_exits_2(tmp_path, capsys):
    argv = ["--slo", "tpot_p99=30ms", "--synthetic", "0.01", "--storage", UNREACHABLE,
            "--study-name", "s", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --storage postgresql://tuner:***@") and "\n" not in err


def test_masked_hides_only_a_password():
    assert masked("postgresql+psycopg://u:pw@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert masked("postgresql://u@h/db") == "postgresql://u@h/db"
    assert masked("study.journal") == "study.journal"


def test_storage_calls_are_timed_and_counted(tmp_path):
    opened = open_storage(f"sqlite:///{tmp_path / 's.db'}", tmp_path, 5)
    assert opened.shared and opened.heartbeat_s == 5 and opened.heartbeat is not None
    study = optuna.create_study(storage=opened.storage, study_name="s")
    study.tell(next_trial(study), 1.0)
    assert opened.clock.calls >= 3 and opened.clock.seconds > 0
    # The run folder's own SQLite file is one worker's: no heartbeat.
    assert open_storage(None, tmp_path, 5).heartbeat is None
