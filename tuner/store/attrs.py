"""The one adapter between typed trial records and Optuna's trial and study attributes. Every
key lives here, unchanged from earlier versions, so an older study still resumes and reports."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from slo import SLO
from tuner.measure.meter import LevelRecord
from tuner.measure.verdict import VerdictRules
from tuner.store.codec import clean_json, level_from_row, level_row
from tuner.store.records import Role, TrialEnding, TrialRecord
from tuner.targets.knobs import Knobs, knobs_from_json, knobs_to_json

ROLE = "role"  # a Role value
WORKER = "worker"  # "host:pid" of the process measuring the trial
HEARTBEAT = "heartbeat"  # wall-clock time of the trial's last finished level (other hosts read it)
KNOBS = "knobs"  # the trial's config
LEVEL_PREFIX = "level_"  # level_000, level_001, ...: one load level's row each
ENDING = "outcome"  # a TrialEnding value
CAPACITY = "capacity_rps"  # measured capacity (0 for pruned trials)
UPPER = "upper_bound_rps"  # lowest failing rate (None before any failure)
CONSTRAINTS = "constraints"  # --rate mode: SLO terms and error rate as value - limit
STUDY_META = "tune_meta"  # study: what it measures; a resume must match it
START_RATE = "calibrated_start_rps"  # study: the first trial's start rate, measured once
PREDICTED = "predicted_rps"  # a trial the simulator screened: its simulated capacity
SIM = "sim"  # study: what the simulator screened and how close it came (a SimSummary)
_Trial = optuna.Trial | FrozenTrial


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def role_attrs(role: Role, predicted_rps: float | None = None) -> dict[str, Any]:
    """Attributes for `study.enqueue_trial(..., user_attrs=...)`."""
    out: dict[str, Any] = {ROLE: role.value}
    if predicted_rps is not None:
        out[PREDICTED] = predicted_rps
    return out


def predicted_of(trial: _Trial) -> float | None:
    value = trial.user_attrs.get(PREDICTED)
    return float(value) if value else None


def role_of(trial: _Trial) -> Role:
    return Role(trial.user_attrs.get(ROLE, Role.SEARCH.value))


def knobs_of(trial: _Trial) -> Knobs:
    return knobs_from_json(trial.user_attrs.get(KNOBS, {}))


def constraints_of(trial: _Trial, missing: list[float] | None = None) -> list[float]:
    return list(trial.user_attrs.get(CONSTRAINTS, [] if missing is None else missing))


def worker_of(trial: FrozenTrial) -> str:
    return str(trial.user_attrs.get(WORKER, ""))


def last_beat_s(trial: FrozenTrial) -> float:
    start = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    return float(trial.user_attrs.get(HEARTBEAT, start))


def start_trial(trial: optuna.Trial, role: Role, knobs: Knobs) -> None:
    trial.set_user_attr(ROLE, role.value)
    trial.set_user_attr(WORKER, worker_id())
    trial.set_user_attr(KNOBS, knobs_to_json(knobs))


def save_level(trial: optuna.Trial, index: int, level: LevelRecord) -> None:
    trial.set_user_attr(f"{LEVEL_PREFIX}{index:03d}", level_row(level))
    trial.set_user_attr(HEARTBEAT, time.time())


def end_capacity(trial: optuna.Trial, ending: TrialEnding, capacity_rps: float,
                 upper_bound_rps: float) -> None:  # fmt: skip
    trial.set_user_attr(ENDING, ending.value)
    trial.set_user_attr(UPPER, clean_json(upper_bound_rps))
    trial.set_user_attr(CAPACITY, capacity_rps)


def end_goodput(trial: optuna.Trial, ending: TrialEnding, constraints: Mapping[str, float]) -> None:
    trial.set_user_attr(CONSTRAINTS, list(constraints.values()))
    if hasattr(trial, "set_constraint"):  # Optuna >= 5: samplers read these themselves
        for name, value in constraints.items():
            trial.set_constraint(name, value)
    trial.set_user_attr(ENDING, ending.value)


def was_cut(trial: FrozenTrial) -> bool:
    """Its measurement ended before its rate search did (see TrialEnding.cut)."""
    ending = trial.user_attrs.get(ENDING)
    return ending is not None and TrialEnding(ending).cut


def read_trial(trial: FrozenTrial, slo: SLO, rules: VerdictRules) -> TrialRecord:
    attrs = trial.user_attrs
    keys = sorted(k for k in attrs if k.startswith(LEVEL_PREFIX))
    ending = attrs.get(ENDING)
    return TrialRecord(
        number=trial.number, state=trial.state, role=role_of(trial), knobs=knobs_of(trial),
        levels=[level_from_row(attrs[k], slo, rules) for k in keys], value=trial.value,
        capacity_rps=attrs.get(CAPACITY), upper_bound_rps=attrs.get(UPPER),
        ending=TrialEnding(ending) if ending else None, constraints=constraints_of(trial),
        worker=worker_of(trial),
    )  # fmt: skip


def study_meta(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(STUDY_META)


def set_study_meta(study: optuna.Study, meta: dict[str, Any]) -> None:
    study.set_user_attr(STUDY_META, meta)


def start_rate(study: optuna.Study) -> float | None:
    value = study.user_attrs.get(START_RATE)
    return float(value) if value else None


def set_start_rate(study: optuna.Study, rate_rps: float) -> None:
    study.set_user_attr(START_RATE, rate_rps)


def sim_summary(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(SIM)


def set_sim_summary(study: optuna.Study, summary: dict[str, Any]) -> None:
    study.set_user_attr(SIM, summary)
