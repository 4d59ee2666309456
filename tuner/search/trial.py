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
from tuner.search.study import best_capacity, earlier_attempt, find_twin
from tuner.store import attrs
from tuner.store.records import Mode, Role, TrialEnding, TrialRecord
from tuner.store.runfiles import RunFiles, write_trials_table
from tuner.targets.base import ServerLost
from tuner.targets.knobs import Knobs

# A constraint for a term that had no successful request at all: clearly infeasible, finite
# so that samplers can still rank it.
_INFEASIBLE = 1e6
# Later trials start at the best capacity so far and climb more gently than the first.
LATER_GROWTH = 1.5
# A screened config's search starts this many tolerance steps below its simulated capacity.
# The configs the simulator ranks first are those it overstates most (the best of 69 noisy
# figures): of ten verified in five built-in runs, nine failed at their simulated capacity
# (six held 13-24% below it, three failed 32% below it too and were pruned); one held there.
SCREENED_STEPS_BELOW = 1
# A default the simulator placed (fitted on the burst and the small-budget level alone) starts
# this many steps above the hint: the first fit reads the default slow. In 16 built-in runs it
# held at the hint every time, and in 7 a step above too (3-4 levels where 2 would do); a
# failing level stops early, so starting a step up costs no level where the hint was right.
PLACED_STEPS_ABOVE = 1


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
    budget_s: float | None = None  # the run's time budget, kept with a level it left out

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
            if isinstance(exc, ServerLost) and exc.records:  # a failed request is a record too
                path = self.files.lost_level_path(trial.number, len(record.levels))
                self.files.write_records(path, exc.records)
            if record.state is TrialState.RUNNING:  # not yet told how it ended
                study.tell(trial, state=TrialState.FAIL)
            if not isinstance(exc, Exception):
                # Interrupted, not broken: queue the same config so a resume measures it.
                study.enqueue_trial(trial.params, user_attrs=attrs.role_attrs(role))
            raise
        finally:
            self._write_table(study)
        self.progress.trial_done(record)
        return record

    def _write_table(self, study: optuna.Study) -> None:
        """trials.csv as of now: a run stopped at any point still has every level it measured."""
        slo, rules = self.meter.slo, self.meter.rules
        trials = [attrs.read_trial(t, slo, rules) for t in study.get_trials(deepcopy=False)]
        write_trials_table(trials, self.files)

    async def _capacity(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord,
                        deadline: float | None) -> None:  # fmt: skip
        search = RateSearch(self._settings(study, trial, record.role))
        self._go_on(study, trial, record, search)
        try:
            pruned = await self._levels(trial, record, search, deadline)
        except ServerLost:
            # What passed before the server went still bounds the capacity from below.
            self._end_capacity(study, trial, record, search, TrialEnding.SERVER_LOST)
            raise
        cut = not pruned and not search.done
        ending = (TrialEnding.PRUNED if pruned else TrialEnding.TIME_BUDGET if cut
                  else TrialEnding(search.outcome.value))  # fmt: skip
        self._end_capacity(study, trial, record, search, ending)

    async def _levels(self, trial: optuna.Trial, record: TrialRecord, search: RateSearch,
                      deadline: float | None) -> bool:  # fmt: skip
        """Measure the levels the search asks for; True when the pruner stopped the trial."""
        if (first := search.next_rate()) is not None:
            self.progress.level_started(first, 0)
        async for run in self.meter.search_levels(search, deadline):
            self._keep(trial, record, run)
            trial.report(search.upper_bound_rps, len(record.levels) - 1)
            self.progress.level_done(run.level, search)
            if trial.should_prune():
                return True
            if not search.done:
                self.progress.level_started(search.next_rate() or 0.0, len(record.levels))
        return False

    def _go_on(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord,
               search: RateSearch) -> None:  # fmt: skip
        """Start from the levels of an earlier attempt at this config whose search did not end
        (`earlier_attempt`): no rate it measured is measured again. Where a deadline cut that
        attempt, it ran its first level regardless; this one starts a level only if it fits
        (a level on a slow target takes minutes: vLLM on an AVX2-only CPU, 7-28 min)."""
        earlier = earlier_attempt(study, record.knobs, record.role, trial.number)
        if earlier is None:
            return
        old = attrs.read_trial(earlier, self.meter.slo, self.meter.rules)
        carried = old.carried + [(lv.rate_rps, lv.passed) for lv in old.levels]
        if not carried:
            return
        for rate, passed in carried:
            if not search.done:  # a run killed after its last level: nothing left to measure
                search.record(rate, passed)
        if not search.done:
            search.left_out = old.left_out  # Meter.search_levels: no level past the deadline
        record.continues, record.carried = earlier.number, carried
        attrs.save_continued(trial, earlier.number, carried)
        said = ", ".join(f"{rate:.2f} req/s {'held' if ok else 'failed'}" for rate, ok in carried)
        self.progress.line(f"trial {trial.number + 1} goes on from trial {earlier.number + 1}'s "
                           f"search of the same config ({said})")  # fmt: skip

    def _end_capacity(self, study: optuna.Study, trial: optuna.Trial, record: TrialRecord,
                      search: RateSearch, ending: TrialEnding) -> None:  # fmt: skip
        """Tell the study how the rate search ended. A search cut short before any level passed
        has measured no capacity: it fails rather than reading as a capacity of zero (a
        resume measures a reference again); cut after a pass, its capacity is a lower bound."""
        record.ending, record.upper_bound_rps = ending, search.upper_bound_rps
        pruned = ending is TrialEnding.PRUNED
        record.capacity_rps = 0.0 if pruned else search.capacity_rps
        if (left := search.left_out) is not None:  # set only where the deadline cut it
            record.left_out = dataclasses.replace(left, budget_s=self.budget_s)
        attrs.end_capacity(trial, ending, record.capacity_rps, record.upper_bound_rps,
                           record.left_out)  # fmt: skip
        if pruned:
            record.state = TrialState.PRUNED
            study.tell(trial, state=TrialState.PRUNED)
        elif ending.cut and record.capacity_rps <= 0:
            record.state = TrialState.FAIL
            study.tell(trial, state=TrialState.FAIL)
        else:
            record.state, record.value = TrialState.COMPLETE, record.capacity_rps
            study.tell(trial, record.capacity_rps)

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

    def _settings(self, study: optuna.Study, trial: optuna.Trial, role: Role
                  ) -> RateSearchSettings:  # fmt: skip
        predicted, hint = attrs.predicted_of(trial), attrs.start_hint_of(trial)
        if predicted or hint:
            # The simulator's capacity, then one tolerance step at a time: a prediction within
            # the tolerance is settled in two levels (two steps then bisection took three). A
            # reference the simulator placed (a hint, not a prediction it is judged on) too.
            # A screened config starts a step below (SCREENED_STEPS_BELOW): one level fewer
            # wherever it fails at its prediction, one more where it holds there; a placed
            # default a step above (PLACED_STEPS_ABOVE), as the first fit reads it slow.
            s = self.search
            step = 1 + s.rel_tol * (1 - 1e-9)  # exactly the tolerance apart counts as converged
            start = (predicted / step**SCREENED_STEPS_BELOW if predicted
                     else hint * step**PLACED_STEPS_ABOVE)  # fmt: skip
            return dataclasses.replace(s, start_rps=start, growth=step,
                                       min_rps=min(s.min_rps, start / 8))  # fmt: skip
        best = best_capacity(study)
        if best <= 0 or role.is_reference:
            # A reference is measured, not raced: from the run's own start rate wherever the
            # study stands, so a default re-measured after a resume finds the same capacity.
            return self.search
        # Start where the best config stands: failing there settles the trial in one level.
        growth = min(self.search.growth, LATER_GROWTH)
        return dataclasses.replace(self.search, start_rps=best, growth=growth)

    def _keep(self, trial: optuna.Trial, record: TrialRecord, run: LevelRun) -> None:
        index = len(record.levels)
        self.files.write_records(self.files.level_path(trial.number, index), run.records)
        attrs.save_level(trial, index, run.level)
        record.levels.append(run.level)
