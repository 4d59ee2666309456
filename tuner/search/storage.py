"""The Optuna storage a run opens: SQLite in its folder, a journal file, or an RDB URL that
workers on several machines share (PostgreSQL). On a shared RDB storage Optuna's heartbeat is
on, so a dead worker's trial is failed and queued again; every RDB call is timed, so a run can
say what coordinating its workers cost."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage

from tuner.errors import TuneError
from tuner.search.study import retry_stale_trial, storage_url

GRACE_BEATS = 3  # a trial silent for three heartbeats is taken as dead
CONNECT_TIMEOUT_S = 10
# `postgresql://` names psycopg2 in SQLAlchemy; `.[postgres]` installs psycopg 3.
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class StorageClock:
    """Seconds and calls this process's main thread spent in storage calls (heartbeats, on
    their own thread, do not hold a trial up and are left out)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0

    def timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread() or self._depth:
                return call(*args, **kwargs)  # a nested call is inside the outer one's time
            self._depth += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
                self._depth -= 1

        return wrapper


# Every RDBStorage method Optuna's cache layer calls, bar the heartbeat's own.
_TIMED = ("_create_new_trial", "_get_best_trial_id", "_get_stale_trial_ids", "_get_trials",
          "_set_trial_param", "create_new_study", "delete_study", "get_all_studies",
          "get_study_directions", "get_study_id_from_name", "get_study_name_from_id",
          "get_study_system_attrs", "get_study_user_attrs", "get_trial",
          "get_trial_id_from_study_id_trial_number", "set_study_system_attr",
          "set_study_user_attr", "set_trial_intermediate_value", "set_trial_state_values",
          "set_trial_system_attr", "set_trial_user_attr")  # fmt: skip


class TimedRDBStorage(RDBStorage):
    """An RDBStorage whose calls add up on `clock`."""

    def __init__(self, url: str, clock: StorageClock, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.clock = clock
        for name in _TIMED:
            setattr(self, name, clock.timed(getattr(self, name)))


@dataclass(slots=True)
class RunStorage:
    """What `optuna.create_study` takes, and what the workers' machinery needs of it."""

    storage: BaseStorage
    clock: StorageClock
    heartbeat: RDBStorage | None = None  # the storage trials beat on (shared RDB only)
    heartbeat_s: int | None = None
    shared: bool = False  # --storage named it: other workers may use it too


def open_storage(storage: str | None, run_dir: Path, heartbeat_s: int | None) -> RunStorage:
    """The run's storage (`heartbeat_s` None: only to read it); a user's URL that cannot be
    used is a one-line error with the fix."""
    clock = StorageClock()
    target = storage_url(_with_driver(storage), run_dir)
    if not isinstance(target, str):  # a journal file: no heartbeat in Optuna's journal storage
        return RunStorage(target, clock, shared=True)
    beat = heartbeat_s if storage is not None else None  # the default folder is one worker's
    rdb = _rdb(target, clock, beat, shown=storage or target)
    return RunStorage(rdb, clock, rdb if beat else None, beat, shared=storage is not None)


def _with_driver(storage: str | None) -> str | None:
    if storage is not None and storage.startswith(_POSTGRES_SCHEMES):
        return "postgresql+psycopg://" + storage.split("://", 1)[1]
    return storage


def _rdb(url: str, clock: StorageClock, heartbeat_s: int | None, shown: str) -> RDBStorage:
    kwargs: dict[str, Any] = {}
    if url.startswith("postgresql"):
        # Fail in seconds on a host that drops packets; drop connections a restart killed.
        connect = {"connect_timeout": CONNECT_TIMEOUT_S}
        kwargs["engine_kwargs"] = {"pool_pre_ping": True, "connect_args": connect}
    if heartbeat_s is not None:
        kwargs.update(heartbeat_interval=heartbeat_s, grace_period=GRACE_BEATS * heartbeat_s,
                      heartbeat_stale_trial_callback=retry_stale_trial())  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return TimedRDBStorage(url, clock, **kwargs)
    except ImportError:
        raise TuneError(_no_driver(shown)) from None
    except Exception as exc:  # SQLAlchemy's errors, whichever the driver raised
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise TuneError(
            f"--storage {masked(shown)}: cannot open it ({reason}); check that the database "
            "server runs there and the URL's user, host, port and database name"
        ) from None


def _no_driver(url: str) -> str:
    if url.startswith(("postgresql", "postgres")):
        fix = 'pip install -e ".[postgres]" (psycopg 3)'
    else:
        fix = "install the database driver the URL names"
    return f"--storage {masked(url)}: its database driver is not installed; {fix}"


def masked(url: str) -> str:
    """The URL without its password, for messages."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
