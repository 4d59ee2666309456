"""One Optuna trial: configure the target, measure it (a rate search whose every level bounds
the trial for the pruner, or one level at --rate with SLO constraints), keep every level."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.measure.meter import LevelRecord, LevelRun, Meter
from tuner.measure.ratesearch import RateSearch, RateSearchSettings
from tuner.measure.verdict import LevelVerdict
from tuner.search.space import SearchSpace
from tuner.search.study import best_capacity, find_twin
from tuner.store import attrs
from tuner.store.records import Mode, Role, TrialEnding, TrialRecord
from tuner.store.runfiles import RunFiles
from tuner.targets.knobs import Knobs

# A constraint for a term that had no successful request at all: clearly infeasible, finite
# so that samplers can still rank it.
_INFEASIBLE = 1e6
# Later trials start at the best capacity so far and climb more gently than the first.
LATER_GROWTH = 1.5


class ProgressSink(Protocol):
    """Where a trial says what it is doing (the live display, or nothing)."""

    def trial_started(self, number: int, role: Role, knobs: Knobs) -> None: ...
    def level_started(self, rate_rps: float, level_index: int) -> None: ...
    def level_done(self, level: LevelRecord, search: RateSearch | None) -> None: ...
    def trial_done(self, trial: TrialRecord) -> None: ...
    def set_best(self, value: float, number: int, unit: str) -> None: ...
    def line(self, text: str) -> None: ...


def goodput_constraints(verdict: LevelVerdict) -> dict[str, float]:
    """`--rate` mode's constraints: each SLO term and the error rate as value - limit."""
    out = {t.name: t.value_s - t.limit_s for t in verdict.terms}
    out = {k: v if math.isfinite(v) else _INFEASIBLE for k, v in out.items()}
    out["error_rate"] = verdict.error_rate - verdict.rules.max_error_rate
    return out


@dataclass(slots=True)
class TrialRunner:
    """Runs trials asked from a study against one meter (target, request list, SLO)."""

    meter: Meter
    space: SearchSpace
    search: RateSearchSettings  # the first trial's; later ones start at the best capacity
    files: RunFiles
    progress: ProgressSink
    mode: Mode = Mode.CAPACITY
    rate_rps: float | None = None  # --rate mode

    async def run(
        self, study: optuna.Study, trial: optuna.Trial, deadline_s: float | None = None
    ) -> TrialRecord:
        """Measure one asked trial and tell the study how it ended."""
        role = attrs.role_of(trial)
        knobs = self.space.suggest(trial)
        attrs.start_trial(trial, role, knobs)
        self.progress.trial_started(trial.number, role, knobs)
        record = TrialRecord(trial.number, TrialState.RUNNING, role, knobs)
        if not role.is_reference and (twin := find_twin(study, knobs, trial.number)):
            self._reuse(study, trial, record, twin)
            self.progress.trial_done(record)
            return record
        try:
            await self.meter.target.apply(knobs)
            if self.mode is Mode.GOODPUT:
                await self._goodput(study, trial, record)
            else:
                await self._capacity(study, trial, record, deadline_s)
        except BaseException as exc:
            study.tell(trial, state=TrialState.FAIL)
            if not isinstance(exc, Exception):
                # Interrupted, not broken: queue the same config so a resume measures it.
                study.enqueue_trial(trial.params, user_attrs=attrs.role_attrs(role))
            raise
        self.progress.trial_done(record)
        return record

    async def _capacity(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord,
                        deadline: float | None) -> None:  # fmt: skip
        search = RateSearch(self._settings(study))
        pruned = False
        self.progress.level_started(search.settings.start_rps, 0)
        async for run in self.meter.search_levels(search, deadline):
            self._keep(trial, record, run)
            trial.report(search.upper_bound_rps, len(record.levels) - 1)
            self.progress.level_done(run.level, search)
            if pruned := trial.should_prune():
                break
            if not search.done:
                self.progress.level_started(search.next_rate() or 0.0, len(record.levels))
        cut = not pruned and not search.done
        record.ending = (TrialEnding.PRUNED if pruned else TrialEnding.TIME_BUDGET if cut
                         else TrialEnding(search.outcome.value))  # fmt: skip
        record.capacity_rps = 0.0 if pruned else search.capacity_rps
        record.upper_bound_rps = search.upper_bound_rps
        attrs.end_capacity(trial, record.ending, record.capacity_rps, record.upper_bound_rps)
        if pruned:
            study.tell(trial, state=TrialState.PRUNED)
            record.state = TrialState.PRUNED
        else:
            study.tell(trial, record.capacity_rps)
            record.state, record.value = TrialState.COMPLETE, record.capacity_rps

    async def _goodput(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord) -> None:
        assert self.rate_rps is not None
        self.progress.level_started(self.rate_rps, 0)
        run = await self.meter.level(self.rate_rps)
        self._keep(trial, record, run)
        self.progress.level_done(run.level, None)
        verdict, constraints = run.level.verdict, goodput_constraints(run.level.verdict)
        record.constraints = list(constraints.values())
        record.ending = TrialEnding.FEASIBLE if verdict.passed else TrialEnding.INFEASIBLE
        attrs.end_goodput(trial, record.ending, constraints)
        goodput = run.level.goodput_rps
        record.value = goodput if math.isfinite(goodput) else 0.0
        study.tell(trial, record.value)
        record.state = TrialState.COMPLETE

    def _reuse(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord,
               twin: FrozenTrial) -> None:  # fmt: skip
        """A config measured already (or being measured by another worker) is not measured
        again: the trial takes its twin's outcome, or is pruned while the twin still runs."""
        attrs.end_duplicate(trial, twin)
        record.ending, record.same_as = TrialEnding.DUPLICATE, twin.number
        if twin.state is TrialState.COMPLETE and twin.value is not None:
            study.tell(trial, twin.value)
            record.state, record.value = TrialState.COMPLETE, twin.value
        else:
            study.tell(trial, state=TrialState.PRUNED)
            record.state = TrialState.PRUNED

    def _settings(self, study: optuna.Study) -> RateSearchSettings:
        best = best_capacity(study)
        if best <= 0:
            return self.search
        # Start where the best config stands: failing there settles the trial in one level.
        growth = min(self.search.growth, LATER_GROWTH)
        return dataclasses.replace(self.search, start_rps=best, growth=growth)

    def _keep(self, trial: optuna.Trial, record: TrialRecord, run: LevelRun) -> None:
        index = len(record.levels)
        self.files.write_records(self.files.level_path(trial.number, index), run.records)
        attrs.save_level(trial, index, run.level)
        record.levels.append(run.level)
