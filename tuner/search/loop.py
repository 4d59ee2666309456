"""The search loop: ask Optuna for trials until `--trials` or the time budget says stop."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import TuneError
from tuner.measure.meter import Clock, Meter
from tuner.search.study import best_trial, top_trials
from tuner.search.trial import TrialRunner
from tuner.search.workers import Workers, next_trial, settle
from tuner.store import attrs
from tuner.store.records import Mode, Role
from tuner.targets.base import ServerLost

# Time kept back at the end for writing the trials table, records and reports.
REPORT_RESERVE_S = 15.0
# The most the run's own levels may scale the confirmation's reserve by (`ConfirmPlan`).
MAX_COST_FACTOR = 3.0
# Consecutive trials that raise before the run gives up (a broken --launch command, say).
MAX_FAILED_IN_A_ROW = 3


@dataclass
class Budget:
    """Wall-clock budget of a run, on an injectable clock so tests need no sleeps."""

    total_s: float
    clock: Clock = time.monotonic
    start_s: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.start_s = self.clock()

    @property
    def end_s(self) -> float:
        return self.start_s + self.total_s

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.start_s

    def level_deadline_s(self, level_s: float) -> float:
        """The latest moment a level this long may start and end before the report's time."""
        return self.end_s - REPORT_RESERVE_S - level_s

    def fits(self, seconds: float) -> bool:
        return self.clock() <= self.level_deadline_s(seconds)


@dataclass(slots=True)
class ConfirmPlan:
    """The time the confirmation phase will need, given the study's current top configs."""

    meter: Meter
    mode: Mode
    top_k: int
    repeats: int
    rate_rps: float | None = None  # --rate mode
    robust: bool = False  # --robust: the default is re-measured even where a config beat it

    def restart_s(self) -> float:
        """What starting a config's server has cost so far, on average (vLLM: 30-75 s on a
        CPU); 0 for a target that starts none."""
        starts = getattr(self.meter.target, "starts", None) or []
        return sum(s for _, s in starts) / len(starts) if starts else 0.0

    def reserve_s(self, study: optuna.Study, trials: Sequence[FrozenTrial] | None = None) -> float:
        """The repeats of each top config (and one step down each in capacity mode), and the
        default at the best config's rate on as many draws; a server start for each config.
        The levels are scaled by what this run's levels have cost against that estimate.

        A default among the top configs counts once: its own confirmation and the same-traffic
        check exclude each other (a config chosen over it cleared above its search capacity, so
        it is not re-measured there, `cannot_win`), and share one server start. Counted twice,
        a run on vLLM whose default's levels took 70 s kept 550 s back, verified no screened
        config, and ended with 7 of its 20 minutes unspent. --robust measures both."""
        if self.repeats == 0:
            return REPORT_RESERVE_S
        capacity = self.mode is Mode.CAPACITY
        trials = study.get_trials(deepcopy=False) if trials is None else trials
        factor = self.cost_factor(trials)
        top = top_trials(study, self.top_k, self.mode, trials)
        level_s = self.meter.expected_level_s
        levels = (self.repeats + (1 if capacity else 0)) * factor
        own = [levels * level_s(self.rate_rps or t.value or 1.0) for t in top]
        if not capacity:
            return REPORT_RESERVE_S + sum(own) + self.restart_s() * len(top)
        best = max((t.value or 1.0 for t in top), default=0.0)
        same_rate_s = (1 + self.repeats) * level_s(best) * factor if top else 0.0
        default = [i for i, t in enumerate(top) if attrs.role_of(t) is Role.DEFAULT]
        if default and not self.robust:
            default_s, starts = max(same_rate_s, own.pop(default[0])), len(top)
        else:
            default_s, starts = same_rate_s, len(top) + 1
        return REPORT_RESERVE_S + sum(own) + default_s + self.restart_s() * starts

    def cost_factor(self, trials: Sequence[FrozenTrial]) -> float:
        """The wall time this run's levels took, every try counted, over the estimate of
        their arrivals and drain (1 to `MAX_COST_FACTOR`). A level on a shared machine is
        measured again (contention.py): on a 2-core VM one `tune` run's confirmation took 7
        tries for 5 levels, used its whole reserve, and had no time left to measure the
        default at the recommended rate."""
        spent = expected = 0.0
        for trial in trials:
            for row in attrs.level_rows(trial):
                rate, wall = row.get("rate_rps"), row.get("wall_s")
                if rate is None or wall is None or not math.isfinite(float(rate)):
                    continue
                if row.get("stopped_s") is not None:  # a fraction of a level that runs out
                    continue
                spent += float(wall) * int(row.get("tries") or 1)
                expected += self.meter.expected_level_s(float(rate))
        return min(MAX_COST_FACTOR, max(1.0, spent / expected)) if expected else 1.0


@dataclass
class SearchLog:
    """What this process measured during the search."""

    durations_s: list[float] = field(default_factory=list)
    stopped_by: str = ""

    def estimate_trial_s(self, fallback_s: float) -> float:
        """Median duration of this run's search trials so far (the references run longer)."""
        return statistics.median(self.durations_s) if self.durations_s else fallback_s


async def search_to_the_end(study: optuna.Study, runner: TrialRunner, trials: int,
                            budget: Budget, plan: ConfirmPlan, first_trial_guess_s: float,
                            workers: Workers) -> SearchLog:  # fmt: skip
    """This worker's search, then the wait until no trial runs on any worker, measuring each
    trial a dead worker left (queued again by the heartbeat) in the meantime."""
    log = await run_search(study, runner, trials, budget, plan, first_trial_guess_s, workers)
    workers.record_search(study)
    while await settle(study, workers, runner.progress.line):
        more = await run_search(study, runner, trials, budget, plan, first_trial_guess_s, workers)
        log.durations_s += more.durations_s
    return log


async def run_search(study: optuna.Study, runner: TrialRunner, trials: int, budget: Budget,
                     plan: ConfirmPlan, first_trial_guess_s: float,
                     workers: Workers) -> SearchLog:  # fmt: skip
    """Run trials until the study holds `trials` finished ones or the budget runs out.

    A new trial starts only if its expected duration fits before the time kept for the
    confirmation and the report; the reference configs and a dead worker's trials always run,
    since the report needs them. A space with nothing to search stops after the references.
    """
    log, failed_in_a_row = SearchLog(), 0
    while True:
        now = Snapshot.of(study)
        reserve_s = plan.reserve_s(study, now.trials)
        if (best := best_trial(study, now.trials)) is not None and best.value:
            unit = "req/s" if runner.mode is Mode.CAPACITY else "good req/s"
            runner.progress.set_best(best.value, best.number + 1, unit)
        if stop := _stop_reason(now, runner, trials, budget, reserve_s, log, first_trial_guess_s):
            break
        trial = next_trial(study, retry_first=now.retry_waiting)
        started = budget.clock()
        try:
            with workers.beating(trial):
                record = await runner.run(study, trial, deadline_s=budget.end_s - reserve_s)
        except Exception as exc:
            if isinstance(exc, TuneError) and best_trial(study) is None:
                raise  # nothing has ever worked: a broken setup, not a bad config
            if isinstance(exc, ServerLost) and not exc.restartable:
                raise  # nothing more can be measured
            failed_in_a_row += 1
            how = "was cut short" if isinstance(exc, ServerLost) else "failed"
            runner.progress.line(f"trial {trial.number + 1} {how}: {exc}")
            if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                raise
            continue
        failed_in_a_row = 0
        if not record.role.is_reference:
            log.durations_s.append(budget.clock() - started)
    log.stopped_by = stop
    return log


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The study as one read of its trials shows it: what choosing the next step needs (each
    read is a round trip to a shared storage)."""

    trials: list[FrozenTrial]
    finished: int
    running: int  # on any worker
    retry_waiting: bool  # a dead worker's trial queued again
    reference_next: bool  # a reference config is queued (`ask` hands those out first)

    @classmethod
    def of(cls, study: optuna.Study) -> Snapshot:
        trials = study.get_trials(deepcopy=False)
        waiting = [t for t in trials if t.state is TrialState.WAITING]
        return cls(
            trials=trials,
            finished=sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials),
            running=sum(t.state is TrialState.RUNNING for t in trials),
            retry_waiting=any(attrs.retry_of(t) is not None for t in waiting),
            reference_next=any(attrs.role_of(t).is_reference for t in waiting),
        )  # fmt: skip


def _stop_reason(
    now: Snapshot, runner: TrialRunner, trials: int, budget: Budget, reserve_s: float,
    log: SearchLog, first_trial_guess_s: float,
) -> str:  # fmt: skip
    """Why the search stops before the next trial ("" to go on)."""
    if now.retry_waiting:
        return ""
    # Trials other workers are measuring count too, so N workers do not overshoot by N - 1.
    if now.finished + now.running >= trials:
        return f"--trials {trials} reached"
    if not now.reference_next and not runner.space.domains:
        return "nothing to search: the target can change none of the knobs"
    expected = log.estimate_trial_s(first_trial_guess_s)
    if not now.reference_next and budget.clock() + expected > budget.end_s - reserve_s:
        return "time budget"
    return ""
