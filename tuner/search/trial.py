"""One Optuna trial: configure the target, run the rate search with reporting and pruning."""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from engine_lite import Policy
from loadgen import RequestSpec
from slo import SLO
from tuner.measure.level import (
    CapacityResult,
    LevelResult,
    LevelSettings,
    find_capacity,
    measure_level,
)
from tuner.measure.ratesearch import Outcome, RateSearch, RateSearchSettings
from tuner.search.space import SearchSpace
from tuner.search.study import CONSTRAINTS, HEARTBEAT, ROLE, WORKER, Role, best_capacity, worker_id
from tuner.targets.base import Target

KNOBS = "knobs"  # user attr: the trial's effective scheduler knobs (JSON-friendly)
LEVEL_PREFIX = "level_"  # user attrs level_000, level_001, ...: one load level's figures
OUTCOME = "outcome"  # user attr: why the rate search ended
CAPACITY = "capacity_rps"  # user attr: measured capacity (also kept for pruned trials: 0)
UPPER = "upper_bound_rps"
# A constraint for a term that had no successful request at all: clearly infeasible, finite
# so that samplers can still rank it.
_INFEASIBLE = 1e6


class Mode(enum.StrEnum):
    """What a trial's value is."""

    CAPACITY = "capacity"  # max req/s meeting the SLO (the default)
    GOODPUT = "goodput"  # vLLM's goodput at the fixed --rate, SLO terms as constraints


class ProgressSink(Protocol):
    """Where a trial says what it is doing (the live display, or nothing)."""

    def trial_started(self, number: int, role: Role, knobs: dict[str, Any]) -> None: ...
    def level_started(self, rate_rps: float, level_index: int) -> None: ...
    def level_done(self, level: LevelResult, search: RateSearch | None) -> None: ...
    def trial_done(self, outcome: TrialOutcome) -> None: ...


@dataclass
class TrialOutcome:
    """What one trial measured and how it ended."""

    number: int
    role: Role
    knobs: dict[str, Any]
    state: TrialState
    value: float | None
    capacity: CapacityResult | None = None  # capacity mode
    level: LevelResult | None = None  # goodput mode

    @property
    def levels(self) -> list[LevelResult]:
        if self.capacity is not None:
            return self.capacity.levels
        return [self.level] if self.level is not None else []


def knobs_to_json(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.value if isinstance(v, Policy) else v) for k, v in knobs.items()}


@dataclass
class Objective:
    """Runs trials asked from a study against one target and one request list."""

    target: Target
    requests: Sequence[RequestSpec]
    slo: SLO
    space: SearchSpace
    level_settings: LevelSettings
    search: RateSearchSettings  # start_rps is the first trial's start; later ones start at best
    mode: Mode = Mode.CAPACITY
    rate_rps: float | None = None
    progress: ProgressSink | None = None
    # Called with (trial number, level index, level) after each level, e.g. to keep its records.
    on_level: Callable[[int, int, LevelResult], None] | None = None

    async def run(
        self, study: optuna.Study, trial: optuna.Trial, deadline_s: float | None = None
    ) -> TrialOutcome:
        """Measure one asked trial and tell the study how it ended."""
        role = Role(trial.user_attrs.get(ROLE, Role.SEARCH.value))
        if ROLE not in trial.user_attrs:
            trial.set_user_attr(ROLE, role.value)
        trial.set_user_attr(WORKER, worker_id())
        knobs = self.space.suggest(trial)
        trial.set_user_attr(KNOBS, knobs_to_json(knobs))
        if self.progress:
            self.progress.trial_started(trial.number, role, knobs)
        try:
            await self.target.apply(knobs)
            if self.mode is Mode.GOODPUT:
                outcome = await self._goodput(study, trial, role, knobs)
            else:
                outcome = await self._capacity(study, trial, role, knobs, deadline_s)
        except BaseException as exc:
            study.tell(trial, state=TrialState.FAIL)
            if not isinstance(exc, Exception):
                # Interrupted, not broken: queue the same config so a resume measures it.
                study.enqueue_trial(trial.params, user_attrs={ROLE: role.value})
            raise
        if self.progress:
            self.progress.trial_done(outcome)
        return outcome

    async def _capacity(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        role: Role,
        knobs: dict[str, Any],
        deadline_s: float | None,
    ) -> TrialOutcome:
        best = best_capacity(study)
        settings = self.search
        if best > 0:
            # Start where the best config stands: failing there settles the trial in one level.
            settings = dataclasses.replace(
                settings, start_rps=best, growth=min(settings.growth, 1.5)
            )
        pruned = False

        def on_level(level: LevelResult, state: RateSearch) -> bool:
            nonlocal pruned
            step = len(state.levels) - 1
            self._keep(trial, step, level)
            trial.report(state.upper_bound_rps, step)
            if self.progress:
                self.progress.level_done(level, state)
            pruned = trial.should_prune()
            if not pruned and not state.done and self.progress:
                self.progress.level_started(state.next_rate() or 0.0, step + 1)
            return pruned

        if self.progress:
            self.progress.level_started(settings.start_rps, 0)
        result = await find_capacity(
            self.target,
            self.requests,
            self.slo,
            settings,
            self.level_settings,
            on_level=on_level,
            deadline_s=deadline_s,
        )
        cut = not pruned and not _ended(result)
        trial.set_user_attr(
            OUTCOME, "time_budget" if cut else ("pruned" if pruned else result.outcome.value)
        )
        trial.set_user_attr(UPPER, _finite(result.upper_bound_rps))
        if pruned:
            trial.set_user_attr(CAPACITY, 0.0)
            study.tell(trial, state=TrialState.PRUNED)
            state, value = TrialState.PRUNED, None
        else:
            trial.set_user_attr(CAPACITY, result.capacity_rps)
            study.tell(trial, result.capacity_rps)
            state, value = TrialState.COMPLETE, result.capacity_rps
        return TrialOutcome(trial.number, role, knobs, state, value, capacity=result)

    def _keep(self, trial: optuna.Trial, step: int, level: LevelResult) -> None:
        if self.on_level is not None:
            self.on_level(trial.number, step, level)
        _save_level(trial, step, level)

    async def _goodput(
        self, study: optuna.Study, trial: optuna.Trial, role: Role, knobs: dict[str, Any]
    ) -> TrialOutcome:
        assert self.rate_rps is not None
        if self.progress:
            self.progress.level_started(self.rate_rps, 0)
        level = await measure_level(
            self.target, self.requests, self.rate_rps, self.slo, self.level_settings
        )
        self._keep(trial, 0, level)
        if self.progress:
            self.progress.level_done(level, None)
        named = {t.metric: _constraint(t.value_s - t.limit_s) for t in level.terms}
        named["error_rate"] = level.error_rate - self.level_settings.max_error_rate
        trial.set_user_attr(CONSTRAINTS, list(named.values()))
        if hasattr(trial, "set_constraint"):  # Optuna >= 5: samplers read these themselves
            for key, value in named.items():
                trial.set_constraint(key, value)
        trial.set_user_attr(OUTCOME, "feasible" if level.passed else "infeasible")
        value = level.goodput_rps if math.isfinite(level.goodput_rps) else 0.0
        study.tell(trial, value)
        return TrialOutcome(trial.number, role, knobs, TrialState.COMPLETE, value, level=level)


def _ended(result: CapacityResult) -> bool:
    return result.outcome is not Outcome.RUNNING


def _save_level(trial: optuna.Trial, step: int, level: LevelResult) -> None:
    trial.set_user_attr(f"{LEVEL_PREFIX}{step:03d}", _jsonable(level.summary()))
    trial.set_user_attr(HEARTBEAT, time.time())


def _constraint(diff_s: float) -> float:
    return diff_s if math.isfinite(diff_s) else _INFEASIBLE


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """Optuna stores user attrs as JSON: NaN and inf become None."""
    out = {}
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out
