"""The capacity pruner: a trial stops at the level that proves it cannot win (or, for a config
the simulator queued, that proves the simulator wrong about it)."""

from __future__ import annotations

import math

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from tuner.search.fidelity import gain_error, overshoot
from tuner.search.study import best_capacity
from tuner.store import attrs
from tuner.store.records import Role


class CapacityPruner(BasePruner):
    """Prunes a search trial once its capacity provably cannot beat the best finished trial.

    Each level reports the rate search's upper bound on the trial's capacity (the lowest rate
    that failed, inf before any failure). A trial starts at the best capacity so far, so one that
    fails there reports a bound equal to the best and is pruned after that single level.
    Reference trials (the default config, the rule of thumb) always run to the end: the report
    needs their capacity, not a bound.

    With `gain_bound`, a config the simulator queued (search/fidelity.py) is pruned too once
    its bound shows the simulator overstated its gain over the default by more than that: it
    can no longer show the simulator right, and a walk down from a prediction twice too high
    took seven levels (63 s) to find a capacity no better than the default's. Those levels
    are better spent on the next screened config, chosen by a model refitted on this one's.
    """

    def __init__(self, gain_bound: float | None = None) -> None:
        self.gain_bound = gain_bound

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if attrs.role_of(trial).is_reference:
            return False
        step = trial.last_step
        if step is None:
            return False
        bound, best = trial.intermediate_values[step], best_capacity(study)
        if best > 0 and bound <= best:
            return True
        return self.gain_bound is not None and gain_overstated(study, trial, bound,
                                                                self.gain_bound)  # fmt: skip


def gain_overstated(study: optuna.Study, trial: FrozenTrial, upper_bound_rps: float,
                    bound: float) -> bool:  # fmt: skip
    """The simulated gain of a screened trial over the default (as it was queued) exceeds by
    more than `bound` the most its measurement allows (its lowest failing rate over the
    default's measured capacity), and so does its simulated capacity (over that failing
    rate): either one within the bound can still show the simulator right about it (the rule
    fidelity.summary decides the fall-back by)."""
    predicted = attrs.predicted_of(trial)
    predicted_default = trial.user_attrs.get(attrs.PREDICTED_DEFAULT)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    default = next((t.value for t in done if attrs.role_of(t) is Role.DEFAULT), None)
    if not predicted or not predicted_default or not default or not math.isfinite(upper_bound_rps):
        return False
    gain = gain_error(predicted, float(predicted_default), upper_bound_rps, default)
    return min(gain, overshoot(predicted, upper_bound_rps)) > bound
