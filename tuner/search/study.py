"""Optuna study: storage (SQLite, any RDB URL, journal file), samplers, pruner, resume."""

from __future__ import annotations

import copy
import enum
import math
import os
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from tuner.errors import TuneError
from tuner.store import attrs
from tuner.store.records import Mode, Role
from tuner.targets.knobs import Knobs

# What opening a missing, unwritable or damaged storage raises (SQLAlchemy's errors for an RDB
# URL or a SQLite file that is not a database, OSError for a journal file).
STORAGE_ERRORS = (ImportError, ValueError, RuntimeError, OSError, SQLAlchemyError)
STALE_AFTER_S = 3600.0  # a trial with no level for this long on another host is taken as dead
# A config whose worker dies three times (it takes the engine down with it, say) stays failed.
MAX_RETRIES = 2


class SamplerName(enum.StrEnum):
    TPE = "tpe"
    GP = "gp"
    RANDOM = "random"


def storage_url(storage: str | None, run_dir: Path) -> str | optuna.storages.BaseStorage:
    """The Optuna storage: SQLite in the run folder by default, else the given URL or file.

    A path ending in .log or .journal (or a `journal:` prefix) is a journal file, which several
    processes can share over NFS; anything with `://` is an RDB URL (sqlite, postgresql, mysql).
    """
    if storage is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{run_dir.resolve() / 'study.db'}"
    if storage.startswith("journal:"):
        return _journal(storage.removeprefix("journal:").removeprefix("//"))
    if "://" in storage:
        return storage
    if storage.endswith((".log", ".journal")):
        return _journal(storage)
    raise TuneError(
        f"--storage {storage!r} is neither an RDB URL nor a journal file; use e.g. "
        "sqlite:///study.db, postgresql://user@host/db or study.journal"
    )


def first_line(exc: BaseException) -> str:
    """SQLAlchemy's messages run to several lines (the SQL, a link); the first says it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _journal(path: str) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    except OSError as exc:
        raise TuneError(
            f"--storage {path}: cannot write there ({exc.strerror or exc}); give a journal file "
            "in a folder you can write to"
        ) from None


def make_sampler(
    name: SamplerName, seed: int, n_startup_trials: int, constraints: bool = False
) -> BaseSampler:
    """TPE, GP (both honour the SLO constraints in `--rate` mode) or random search."""
    # Optuna 5 samplers read constraints set on the trial (Trial.set_constraint); older ones
    # need constraints_func.
    cf = constraints_func if constraints and not hasattr(optuna.Trial, "set_constraint") else None
    if name is SamplerName.RANDOM:
        return optuna.samplers.RandomSampler(seed=seed)
    if name is SamplerName.GP:
        try:
            import scipy  # noqa: F401  GPSampler optimises its acquisition with scipy
        except ImportError:
            raise TuneError("--sampler gp needs scipy; pip install scipy, or use tpe") from None
        # The threshold fraction is conditional, which GP samples independently; say so once
        # in docs/tuner.md rather than on every trial.
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=n_startup_trials, constraints_func=cf,
            warn_independent_sampling=False,
        )  # fmt: skip
    # multivariate + group model the conditional threshold dimension jointly with the budget;
    # constant_liar keeps parallel workers from proposing the same point.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                          multivariate=True, group=True, constant_liar=True,
                                          constraints_func=cf)  # fmt: skip


def constraints_func(trial: FrozenTrial) -> Sequence[float]:
    """Optuna's constraint values for `--rate` mode: each <= 0 when that SLO term holds."""
    return attrs.constraints_of(trial, missing=[1.0])


def best_capacity(study: optuna.Study) -> float:
    """The highest finished, feasible trial value (0 when there is none)."""
    best = best_trial(study)
    return float(best.value) if best is not None and best.value is not None else 0.0


def best_trial(
    study: optuna.Study, trials: Sequence[FrozenTrial] | None = None
) -> FrozenTrial | None:
    """The finished trial with the highest value among those meeting every constraint (among
    `trials` when the caller has just read them)."""
    done = _complete(study, trials)
    ok = [t for t in done if t.value is not None and math.isfinite(t.value)
          and all(c <= 0 for c in attrs.constraints_of(t))]  # fmt: skip
    return max(ok, key=lambda t: t.value or 0.0, default=None)


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a trial whose worker died, keeping only why the trial exists (its
    role): the levels the dead worker measured belong to the failed attempt, not the retry."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        kept = copy.copy(trial)
        kept.user_attrs = attrs.requeue_attrs(trial)
        super().__call__(study, kept)


def retry_stale_trial() -> RetryStaleTrial:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryStaleTrial(max_retry=MAX_RETRIES)


def heartbeat_on(study: optuna.Study) -> bool:
    """Does Optuna's heartbeat watch this study's trials (a shared RDB storage)?"""
    # Optuna's own fail_stale_trials reads the storage off the study the same way.
    interval = getattr(study._storage, "get_heartbeat_interval", None)
    return interval is not None and interval() is not None


def load_study(study_name: str, storage: str | optuna.storages.BaseStorage) -> optuna.Study:
    """An existing study, to report on; a storage that is missing or damaged is one line."""
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise TuneError(f"study {study_name!r} is not in {storage}") from None
    except STORAGE_ERRORS as exc:
        raise TuneError(f"cannot read study storage {storage!r}: {first_line(exc)}") from None


def recover_stale_trials(study: optuna.Study, now_s: float | None = None) -> list[int]:
    """Fail trials left RUNNING by a dead worker and queue their configs again.

    With a heartbeat, Optuna decides: a trial silent for its grace period. Without one (the
    default SQLite file, a journal file), a trial is stale when its worker ran on this host and
    is gone, or when it has not finished a level for `STALE_AFTER_S`; the numbers of those are
    returned. Finished trials are untouched, so a resumed run loses none.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # a no-op without a heartbeat
    if heartbeat_on(study):
        return []
    now_s = time.time() if now_s is None else now_s
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not (_worker_gone(trial) or now_s - attrs.last_beat_s(trial) > STALE_AFTER_S):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # another worker recovered it first
            continue
        retry_stale_trial()(study, study.get_trials(deepcopy=False)[trial.number])
        recovered.append(trial.number)
    return recovered


def _worker_gone(trial: FrozenTrial) -> bool:
    trial_host, _, pid = attrs.worker_of(trial).rpartition(":")
    return trial_host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, as another user
        pass
    return True


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that count toward `--trials`: complete or pruned."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def has_role(study: optuna.Study, role: Role) -> bool:
    """A trial with this role exists (finished, running or queued), so do not enqueue another.
    A reference whose measurement was cut short does not count: the report needs it whole."""
    live = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    trials = [t for t in study.get_trials(states=live) if attrs.role_of(t) is role]
    if role.is_reference:
        trials = [t for t in trials if not attrs.was_cut(t)]
    return bool(trials)


def ask(study: optuna.Study) -> optuna.Trial:
    """The next trial, a queued reference before anything else.

    Optuna hands out queued trials oldest first, so a reference queued again by a resume would
    wait behind the budget sweep, and a short budget would end the run without it.
    """
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    references = [t for t in waiting if attrs.role_of(t).is_reference]
    # The default before the rule of thumb: every comparison in the report is against it.
    references.sort(key=lambda t: (attrs.role_of(t) is not Role.DEFAULT, t.number))
    for frozen in references:
        if _claim(study, frozen):
            return optuna.Trial(study, frozen._trial_id)
    return study.ask()


def _claim(study: optuna.Study, waiting: FrozenTrial) -> bool:
    """Take a queued trial as `Study.ask` does (False when another worker took it first)."""
    storage = study._storage
    try:
        return storage.set_trial_state_values(waiting._trial_id, state=TrialState.RUNNING)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def find_twin(study: optuna.Study, knobs: Knobs, number: int) -> FrozenTrial | None:
    """An earlier trial with this config that finished or is being measured (a retry of a
    failed one is not a twin: that config was never measured to the end)."""
    live = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    for trial in study.get_trials(deepcopy=False, states=live):
        if trial.number < number and attrs.knobs_of(trial) == knobs:
            return trial
    return None


def earlier_attempt(study: optuna.Study, knobs: Knobs, role: Role,
                    number: int) -> FrozenTrial | None:  # fmt: skip
    """The latest earlier trial of this config in this role whose search did not end: cut by
    the time budget or a lost server, or failed when its run was killed or its worker died.
    What it measured still holds for the config."""
    for trial in reversed(study.get_trials(deepcopy=False)):
        if trial.number >= number or attrs.role_of(trial) is not role:
            continue
        if attrs.knobs_of(trial) == knobs and (trial.state is TrialState.FAIL
                                               or attrs.was_cut(trial)):  # fmt: skip
            return trial
    return None


def top_trials(study: optuna.Study, k: int, mode: Mode,
               trials: Sequence[FrozenTrial] | None = None) -> list[FrozenTrial]:  # fmt: skip
    """The k best finished trials worth confirming (positive value; feasible in --rate mode),
    the same config measured twice (a reference and a search hit) once, and an attempt that a
    later trial went on from only as that trial, which holds its levels too."""
    done = _complete(study, trials)
    gone_on = {attrs.continues_of(t) for t in done}
    done = [t for t in done if t.number not in gone_on]
    if mode is Mode.GOODPUT:
        done = [t for t in done if all(c <= 0 for c in attrs.constraints_of(t, missing=[1.0]))]
    ranked = sorted((t for t in done if t.value is not None and t.value > 0),
                    key=lambda t: t.value or 0.0, reverse=True)  # fmt: skip
    unique: dict[str, FrozenTrial] = {}
    for t in ranked:
        unique.setdefault(repr(sorted(attrs.knobs_of(t).items())), t)
    return list(unique.values())[:k]


def _complete(study: optuna.Study, trials: Sequence[FrozenTrial] | None) -> list[FrozenTrial]:
    """Complete trials, from a list just read (a read of a shared storage is a round trip)."""
    if trials is None:
        return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [t for t in trials if t.state is TrialState.COMPLETE]


def queued_phase(study: optuna.Study) -> str:
    """A phase name that says what is queued (the default, a screened config), so the time per
    phase in the report tells the default's search from the verification of screened ones."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    roles = sorted({str(attrs.role_of(t)).replace("_", " ") for t in waiting})
    return "measuring on the target" + (f": {', '.join(roles)}" if roles else "")


def queued_count(study: optuna.Study) -> int:
    """Finished plus waiting trials: the search stops once the queue is measured."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING)
    return len(study.get_trials(deepcopy=False, states=states))
