"""The search loop: ask Optuna for trials until `--trials` or the time budget says stop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from tuner.errors import TuneError
from tuner.report.live import StatusSink
from tuner.search.study import ROLE, Role, best_trial, finished_trials
from tuner.search.trial import Objective, TrialOutcome

# Time kept back at the end for writing the trials table, records and reports.
REPORT_RESERVE_S = 15.0
# Consecutive trials that raise before the run gives up (a broken --launch command, say).
MAX_FAILED_IN_A_ROW = 3


@dataclass
class Budget:
    """Wall-clock budget of a run; `clock` is injectable so tests need no sleeps."""

    total_s: float
    clock: Callable[[], float] = time.monotonic
    start_s: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.start_s = self.clock()

    @property
    def end_s(self) -> float:
        return self.start_s + self.total_s

    def left_s(self) -> float:
        return self.end_s - self.clock()


@dataclass
class SearchLog:
    """What this process measured during the search."""

    outcomes: list[TrialOutcome] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)
    stopped_by: str = ""

    def estimate_trial_s(self, fallback_s: float) -> float:
        """Median duration of this run's search trials so far (the references run longer)."""
        return statistics.median(self.durations_s) if self.durations_s else fallback_s


async def run_search(
    study: optuna.Study,
    objective: Objective,
    trials: int,
    budget: Budget,
    reserve_s: Callable[[], float],
    display: StatusSink,
    first_trial_guess_s: float,
) -> SearchLog:
    """Run trials until the study holds `trials` finished ones or the budget runs out.

    A new trial starts only if its expected duration fits before the time kept for the
    confirmation and the report; the reference configs always run, since the report needs
    them.
    """
    log = SearchLog()
    failed_in_a_row = 0
    while True:
        if len(finished_trials(study)) >= trials:
            log.stopped_by = f"--trials {trials} reached"
            break
        expected = log.estimate_trial_s(first_trial_guess_s)
        hard_stop_s = budget.end_s - reserve_s()
        if not _reference_next(study) and budget.clock() + expected > hard_stop_s:
            log.stopped_by = "time budget"
            break
        trial = study.ask()
        started = budget.clock()
        try:
            outcome = await objective.run(study, trial, deadline_s=hard_stop_s)
        except Exception as exc:
            if isinstance(exc, TuneError) and best_trial(study) is None:
                raise  # nothing has ever worked: a broken setup, not a bad config
            failed_in_a_row += 1
            display.line(f"trial {trial.number + 1} failed: {exc}")
            if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                raise
            continue
        failed_in_a_row = 0
        log.outcomes.append(outcome)
        if not outcome.role.is_reference:
            log.durations_s.append(budget.clock() - started)
        best = best_trial(study)
        if best is not None and best.value:
            display.set_best(best.value, best.number + 1, unit=_unit(objective))
    return log


def _reference_next(study: optuna.Study) -> bool:
    """Is the next trial Optuna will hand out a queued reference config?"""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if not waiting:
        return False
    role = min(waiting, key=lambda t: t.number).user_attrs.get(ROLE, Role.SEARCH.value)
    return Role(role).is_reference


def _unit(objective: Objective) -> str:
    return "req/s" if objective.mode.value == "capacity" else "good req/s"
