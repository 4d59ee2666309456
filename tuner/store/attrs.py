"""The one adapter between typed trial records and Optuna's trial and study attributes. Every
key lives here, unchanged from earlier versions, so an older study still resumes and reports."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from slo import SLO
from tuner.measure.meter import LevelRecord
from tuner.measure.ratesearch import LeftOut
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
LEFT_OUT = "left_out_level"  # a search the deadline cut: the level it had no time for
CONTINUES = "continues_trial"  # an earlier attempt at this config whose search this one goes on
CARRIED = "carried_levels"  # [[rate, passed], ...]: the levels that search started from
CONSTRAINTS = "constraints"  # --rate mode: SLO terms and error rate as value - limit
STUDY_META = "tune_meta"  # study: what it measures; a resume must match it
START_RATE = "calibrated_start_rps"  # study: the first trial's start rate, measured once
PREDICTED = "predicted_rps"  # a trial the simulator screened: its simulated capacity
PREDICTED_DEFAULT = "predicted_default_rps"  # ... and the default's, by the same model
START_HINT = "start_hint_rps"  # a reference the simulator placed: where its rate search starts
ROBUST = "robustness"  # study: the top configs' simulated capacity across the traffic band
STARTS_PREFIX = "starts "  # study: "starts host:pid" -> the servers that worker started
SIM = "sim"  # study: what the simulator screened and how close it came (a SimSummary)
RUN_INFO = "run_info"  # study: run.json of the worker that created it (a report before any
# confirmation reads it)
SAME_AS = "same_as"  # a sampled config already measured (or in flight): that trial's number
WORKER_PREFIX = "worker "  # study: "worker host:pid" -> what that worker is and did
# Confirmation jobs (a study of their own, see search/claim.py):
FINISHED = "finished_trials"  # the finished trials of the study this job confirms
REPORT_RUN = "report_run"  # run.json of the worker that confirmed: what the report shows
REPORT_CONFIRMATION = "report_confirmation"  # its confirmation (codec.confirmation_json)
# Optuna's own system attribute on a trial its heartbeat retry queued (RetryHeartbeatStaleTrial-
# Callback.retried_trial_number), read here without the experimental-API warning.
_RETRY_OF = "failed_trial"
_OPTUNA_CONSTRAINT = "constraints:"  # Trial.set_constraint's system attributes (Optuna >= 5)
_Trial = optuna.Trial | FrozenTrial


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def role_attrs(role: Role, predicted_rps: float | None = None,
               predicted_default_rps: float | None = None,
               start_hint_rps: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Attributes for `study.enqueue_trial(..., user_attrs=...)`."""
    out: dict[str, Any] = {ROLE: role.value}
    if start_hint_rps:
        out[START_HINT] = start_hint_rps
    if predicted_rps is not None:
        out[PREDICTED] = predicted_rps
    if predicted_default_rps is not None:
        out[PREDICTED_DEFAULT] = predicted_default_rps
    return out


def predicted_of(trial: _Trial) -> float | None:
    value = trial.user_attrs.get(PREDICTED)
    return float(value) if value else None


def start_hint_of(trial: _Trial) -> float | None:
    value = trial.user_attrs.get(START_HINT)
    return float(value) if value else None


def requeue_attrs(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial queued again keeps: why it exists and where its search starts (a screened
    config's prediction, which the simulator's summary judges it by), not what the cut-off
    attempt measured."""
    kept = (ROLE, FINISHED, PREDICTED, PREDICTED_DEFAULT, START_HINT)
    return {k: trial.user_attrs[k] for k in kept if k in trial.user_attrs}


def retry_of(trial: FrozenTrial) -> int | None:
    """The trial this one measures again after its worker died (None for a first attempt)."""
    number = trial.system_attrs.get(_RETRY_OF)
    return int(number) if number is not None else None


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
                 upper_bound_rps: float, left_out: LeftOut | None = None) -> None:  # fmt: skip
    trial.set_user_attr(ENDING, ending.value)
    trial.set_user_attr(UPPER, clean_json(upper_bound_rps))
    trial.set_user_attr(CAPACITY, capacity_rps)
    if left_out is not None:
        trial.set_user_attr(LEFT_OUT, list(dataclasses.astuple(left_out)))


def end_duplicate(trial: optuna.Trial, twin: FrozenTrial) -> None:
    """A config already measured: the twin's outcome (capacity, constraints) without levels."""
    for key in (CAPACITY, UPPER, CONSTRAINTS):
        if key in twin.user_attrs:
            trial.set_user_attr(key, twin.user_attrs[key])
    if hasattr(trial, "set_constraint"):  # Optuna >= 5 keeps named constraints of its own
        for key, value in twin.system_attrs.items():
            if key.startswith(_OPTUNA_CONSTRAINT):
                trial.set_constraint(key.removeprefix(_OPTUNA_CONSTRAINT), value)
    trial.set_user_attr(ENDING, TrialEnding.DUPLICATE.value)
    trial.set_user_attr(SAME_AS, twin.number)


def end_goodput(trial: optuna.Trial, ending: TrialEnding, constraints: Mapping[str, float]) -> None:
    trial.set_user_attr(CONSTRAINTS, list(constraints.values()))
    if hasattr(trial, "set_constraint"):  # Optuna >= 5: samplers read these themselves
        for name, value in constraints.items():
            trial.set_constraint(name, value)
    trial.set_user_attr(ENDING, ending.value)


def save_continued(trial: optuna.Trial, earlier: int, levels: list[tuple[float, bool]]) -> None:
    trial.set_user_attr(CONTINUES, earlier)
    trial.set_user_attr(CARRIED, [list(level) for level in levels])


def continues_of(trial: FrozenTrial) -> int | None:
    return trial.user_attrs.get(CONTINUES)


def carried_of(trial: FrozenTrial) -> list[tuple[float, bool]]:
    """The levels an earlier attempt measured that this trial's search started from."""
    return [(float(rate), bool(passed)) for rate, passed in trial.user_attrs.get(CARRIED, [])]


def was_cut(trial: FrozenTrial) -> bool:
    """Its measurement ended before its rate search did (see TrialEnding.cut)."""
    ending = trial.user_attrs.get(ENDING)
    return ending is not None and TrialEnding(ending).cut


def level_rows(trial: FrozenTrial) -> list[dict[str, Any]]:
    """The trial's level rows (`save_level`), in the order they were measured."""
    attrs = trial.user_attrs
    return [attrs[k] for k in sorted(k for k in attrs if k.startswith(LEVEL_PREFIX))]


def read_trial(trial: FrozenTrial, slo: SLO, rules: VerdictRules) -> TrialRecord:
    attrs = trial.user_attrs
    ending = attrs.get(ENDING)
    return TrialRecord(
        number=trial.number, state=trial.state, role=role_of(trial), knobs=knobs_of(trial),
        levels=[level_from_row(row, slo, rules) for row in level_rows(trial)], value=trial.value,
        capacity_rps=attrs.get(CAPACITY), upper_bound_rps=attrs.get(UPPER),
        ending=TrialEnding(ending) if ending else None, constraints=constraints_of(trial),
        worker=worker_of(trial), retry_of=retry_of(trial), same_as=attrs.get(SAME_AS),
        predicted_rps=predicted_of(trial),
        predicted_default_rps=float(attrs[PREDICTED_DEFAULT]) if attrs.get(PREDICTED_DEFAULT)
        else None,
        left_out=LeftOut(*attrs[LEFT_OUT]) if attrs.get(LEFT_OUT) else None,
        continues=continues_of(trial), carried=carried_of(trial),
    )  # fmt: skip


def study_meta(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(STUDY_META)


def set_study_meta(study: optuna.Study, meta: dict[str, Any]) -> None:
    study.set_user_attr(STUDY_META, meta)


def run_info(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(RUN_INFO)


def set_run_info(study: optuna.Study, info: Mapping[str, Any]) -> None:
    study.set_user_attr(RUN_INFO, clean_json(dict(info)))


def start_rate(study: optuna.Study) -> float | None:
    value = study.user_attrs.get(START_RATE)
    return float(value) if value else None


def set_start_rate(study: optuna.Study, rate_rps: float) -> None:
    study.set_user_attr(START_RATE, rate_rps)


def record_server_starts(study: optuna.Study, worker: str, starts: list[dict[str, Any]]) -> None:
    """The servers this worker started (config and seconds to /health), under its own key, so
    a resumed run's earlier starts are kept beside its own."""
    if starts:
        study.set_user_attr(f"{STARTS_PREFIX}{worker}", starts)


def server_starts(study: optuna.Study) -> list[dict[str, Any]]:
    """Every server start any worker of the study recorded."""
    return [start for key, value in sorted(study.user_attrs.items())
            if key.startswith(STARTS_PREFIX) for start in value]  # fmt: skip


def robustness(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(ROBUST)


def set_robustness(study: optuna.Study, band: dict[str, Any]) -> None:
    study.set_user_attr(ROBUST, band)


def sim_summary(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(SIM)


def set_sim_summary(study: optuna.Study, summary: dict[str, Any]) -> None:
    study.set_user_attr(SIM, summary)


def register_worker(study: optuna.Study, worker: str, facts: Mapping[str, Any]) -> None:
    """What one worker is and did (its own key, so workers never overwrite each other)."""
    study.set_user_attr(f"{WORKER_PREFIX}{worker}", dict(facts))


def workers(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """Every worker that joined the study, by "host:pid"."""
    return {k.removeprefix(WORKER_PREFIX): v for k, v in study.user_attrs.items()
            if k.startswith(WORKER_PREFIX)}  # fmt: skip


def start_job(trial: optuna.Trial) -> None:
    trial.set_user_attr(WORKER, worker_id())


def job_finished_trials(trial: FrozenTrial) -> int:
    return int(trial.user_attrs.get(FINISHED, -1))


def job_attrs(finished_trials: int) -> dict[str, Any]:
    """Attributes of a queued confirmation job."""
    return {ROLE: Role.CONFIRM.value, FINISHED: finished_trials}


def save_report(trial: optuna.Trial, run_info: Mapping[str, Any],
                confirmation: Mapping[str, Any]) -> None:  # fmt: skip
    trial.set_user_attr(REPORT_RUN, clean_json(dict(run_info)))
    trial.set_user_attr(REPORT_CONFIRMATION, dict(confirmation))


def report_of(trial: FrozenTrial) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(run.json, confirmation JSON) a finished confirmation job stored."""
    run, conf = trial.user_attrs.get(REPORT_RUN), trial.user_attrs.get(REPORT_CONFIRMATION)
    return (run, conf) if run is not None and conf is not None else None
